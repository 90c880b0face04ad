"""The lone-worker repair (LeaderWorkerSet issue #998) on real parts: the real API server, the real StatefulSet
controller and garbage collector of kube-controller-manager, the real LWS v0.9.0 controller and its webhooks, the
operator in process, the kubelet and engine stand-ins (harness.sim) across 4 nodes.

How the lone worker is made. LWS v0.9.0 recreates a group only from `PodReconciler.handleRestartPolicy`
(pkg/controllers/pod_controller.go), and only for a pod it reads with a `deletionTimestamp` or a container
`restartCount > 0`; the leader is then deleted with foreground propagation. So LWS acts on a deleted worker only
if it reconciles that pod while the pod is terminating: here a force delete (grace 0) with LWS running is still
seen (the leader was deleted within 0.2 s, `RecreateGroup` event), and #998's race (the worker StatefulSet's
replacement read in its place) did not show. The test stops the LWS manager (`DevCluster.stop_lws`) across the
deletion instead, which makes LWS miss it for certain:

- while LWS is away its pod webhook (failurePolicy Fail) is unreachable, so the worker StatefulSet cannot create
  the replacement (`FailedCreate`, "failed calling webhook"); it creates it within about a second of LWS coming
  back (the StatefulSet controller's retry);
- back, LWS lists everything afresh: the replacement worker is not terminating and never restarted, the leader
  neither, so `handleRestartPolicy` does nothing and LWS leaves the group as it is: a Ready leader whose group
  formed before this worker existed. That is the lone worker, made by the real controllers.

The force delete (not a graceful one) is what keeps the leader Ready meanwhile: the pod object goes at once and the
old worker process lives out its grace period (a non-zero rank ignores SIGTERM; the kubelet stand-in kills a
force-deleted pod's containers as a kubelet does, within the grace period, 30 s here), so the leader's peer is
still connected. With a graceful delete the worker is killed at the end of its grace period, the leader (node 0)
exits as its TP group broke, and LWS recreates the group from the leader's restart count (its other path), lone
worker or not.

Then the operator: it evicts exactly that group's leader (eviction API, uid precondition, foreground
propagation), says so in a `LoneWorker` event; LWS recreates the group (never a `RecreateGroup` of its own), which
comes back Ready and warm from its own claims; the other group keeps its pods. The second test pins the graceful
deletion's outcome: no lone worker, LWS recreates the group itself, the operator evicts nothing.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubehelpers import eventually
from kubernetes import client
from qwen_hicache import engine, rollout, workload
from test_lws_groups import NAME, Sampler, _pods, _ready, _traffic, _uids, _up, _views
from test_lws_groups import groups as groups  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration
LEADER, WORKER = f"{NAME}-0", f"{NAME}-0-1"
OTHERS = (f"{NAME}-1", f"{NAME}-1-1")
REPAIR_TIMEOUT = 180  # seen: 12 s from the eviction to the group Ready again, at load 7 on 2 cores


class Timeline(Sampler):
    """Every distinct state of the server's pods (uid, terminating, Ready, restarts, DisruptionTarget reason),
    sampled every 0.2 s: what the assertions read and what a failure prints."""

    def __init__(self, core: client.CoreV1Api, ns: str) -> None:
        super().__init__()
        self.core, self.ns, self.t0 = core, ns, time.monotonic()
        self.states: list[tuple[float, dict[str, dict]]] = []

    def tick(self) -> None:
        now: dict[str, dict] = {}
        for p in _pods(self.core, self.ns):
            m, st = p["metadata"], p.get("status") or {}
            conds = {c["type"]: c for c in st.get("conditions") or []}
            now[m["name"]] = {
                "uid": m["uid"], "created": m["creationTimestamp"], "deleting": bool(m.get("deletionTimestamp")),
                "ready": (conds.get("Ready") or {}).get("status") == "True",
                "ready_since": (conds.get("Ready") or {}).get("lastTransitionTime"),
                "restarts": sum(c.get("restartCount", 0) for c in st.get("containerStatuses") or []),
                "disruption": (conds.get("DisruptionTarget") or {}).get("reason"),
            }  # fmt: skip
        if not self.states or self.states[-1][1] != now:
            self.states.append((round(time.monotonic() - self.t0, 1), now))

    def __enter__(self) -> Timeline:
        self.tick()  # the first sample, before the block's first step (the thread's first comes 0.2 s later)
        return super().__enter__()

    def note(self, what: str) -> None:
        self.states.append((round(time.monotonic() - self.t0, 1), {what: {}}))

    def report(self) -> str:
        def row(name: str, s: dict) -> str:
            if not s:
                return name
            flags = ("D" if s["deleting"] else "") + ("R" if s["ready"] else "n") + str(s["restarts"])
            return f"{name}:{s['uid'][:5]}:{flags}" + (f":{s['disruption']}" if s["disruption"] else "")

        return "\n".join(f"{t} " + " ".join(row(n, s) for n, s in sorted(state.items())) for t, state in self.states)


def _events(core: client.CoreV1Api, ns: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in core.list_namespaced_event(ns).items if e.reason == reason]


def test_a_worker_recreated_without_its_group_gets_its_leader_evicted_and_the_group_comes_back_warm(
        operator: None, groups: Any, custom: client.CustomObjectsApi, namespace: str,
        devcluster: Any) -> None:  # fmt: skip
    sim, core = groups
    _up(custom, namespace)
    _traffic(core, namespace)  # pages of every rank on every node's own claim
    before = _uids(core, namespace)

    def recreated() -> rollout.PodView | None:
        views, pods = {v.ordinal: v for v in _views(core, namespace)}, _uids(core, namespace)
        new = all(pods.get(n) not in (None, before[n]) for n in (LEADER, WORKER))
        return views[0] if new and 0 in views and views[0].available else None

    with Timeline(core, namespace) as timeline:
        devcluster.stop_lws()
        timeline.note("LWS-stopped")
        try:
            core.delete_namespaced_pod(WORKER, namespace, grace_period_seconds=0)
            refused = eventually(lambda: [e for e in _events(core, namespace, "FailedCreate")
                                          if e.involved_object.name == LEADER and "webhook" in (e.message or "")],
                                 timeout=60)  # fmt: skip
        finally:
            devcluster.start_lws()
            timeline.note("LWS-started")
        try:
            group0 = sim.wait_for(recreated, REPAIR_TIMEOUT, "group 0 recreated whole and ready")
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{timeline.report()}") from None
    why = timeline.report()
    print(why)  # shown with -s or on a failure
    assert refused, why  # while LWS was away its webhook refused the worker StatefulSet's create

    # The lone worker, for real: the StatefulSet's new worker beside the original leader, created after that leader
    # turned Ready (its group had formed without it). The operator evicts within a second of it (a pod event), so
    # the 0.2 s samples may see the leader already terminating beside it.
    states = [s for _, s in timeline.states]
    lone = [s for s in states if s.get(WORKER, {}).get("uid") not in (None, before[WORKER])
            and s.get(LEADER, {}).get("uid") == before[LEADER]]  # fmt: skip
    assert lone, why
    lone_uid = lone[0][WORKER]["uid"]
    # Ordered by the samples, not the timestamps (whole seconds: both fell in the same second in CI): the original
    # leader was sampled Ready, with no worker or the old one beside it, before the new worker first appeared
    # (the first sample is taken on entering the timeline, before the deletion).
    first_lone = states.index(lone[0])
    assert any(s.get(LEADER, {}).get("uid") == before[LEADER] and s[LEADER]["ready"]
               and s.get(WORKER, {}).get("uid") in (None, before[WORKER])
               for s in states[:first_lone]), why  # fmt: skip
    since = next(s[LEADER]["ready_since"] for s in states if s.get(LEADER, {}).get("uid") == before[LEADER]
                 and s[LEADER]["ready"])  # fmt: skip
    assert lone[0][WORKER]["created"] >= since, (lone[0], since, why)  # RFC 3339 in UTC, whole seconds: as text
    assert lone[0][WORKER]["restarts"] == 0 and lone[0][LEADER]["restarts"] == 0, (lone[0], why)
    # The operator evicted exactly that leader, through the eviction API (the API server's DisruptionTarget).
    assert any(s.get(LEADER, {}).get("uid") == before[LEADER] and s[LEADER]["disruption"] == "EvictionByEvictionAPI"
               for s in states), why  # fmt: skip
    said = eventually(lambda: _events(core, namespace, workload.LONE_WORKER), timeout=30)
    assert len(said) == 1 and said[0].type == "Warning", [(e.type, e.message) for e in said]
    assert f"evicted its leader {LEADER} (uid {before[LEADER]})" in said[0].message and WORKER in said[0].message
    # LWS itself never recreated the group (it saw no terminating or restarted pod): the repair was the operator's.
    assert not _events(core, namespace, "RecreateGroup"), why

    # Foreground: no new leader ever stood beside the lone worker (it could have joined the new leader's rendezvous
    # while it lived out its grace period, and broken that group when killed).
    assert not [s for s in states if s.get(LEADER, {}).get("uid") not in (None, before[LEADER])
                and s.get(WORKER, {}).get("uid") == lone_uid], why  # fmt: skip
    # One recreation, whole: new leader and worker (not the lone one), the leader started once and never crashed.
    after = _uids(core, namespace)
    assert after[LEADER] != before[LEADER] and after[WORKER] not in (before[WORKER], lone_uid), why
    assert sim.record(namespace, LEADER).incarnations == 2, sim.record(namespace, LEADER).events
    assert all(s[LEADER]["restarts"] == 0 for s in states if s.get(LEADER, {}).get("uid") == after[LEADER]), why
    # The other group was not touched.
    assert all(after[n] == before[n] for n in OTHERS), why
    for name in OTHERS:
        assert sim.record(namespace, name).incarnations == 1, (name, sim.record(namespace, name).events)
    # Warm: the canary at the new leader is a disk hit, MIN over both nodes, each from its own claim.
    res = engine.generate(group0.ip, 30000, rollout.canary_prompt(NAME))
    assert res.storage_tokens and res.storage_tokens > 0, res
    eventually(lambda: _ready(custom, namespace), timeout=REPAIR_TIMEOUT)


def test_a_worker_deleted_gracefully_while_lws_is_away_breaks_its_group_and_lws_recreates_it_from_the_leader(
        operator: None, groups: Any, custom: client.CustomObjectsApi, namespace: str,
        devcluster: Any) -> None:  # fmt: skip
    """The same deletion made gracefully leaves no lone worker: the worker ignores SIGTERM and is killed at the end
    of its grace period, node 0 exits (its TP group broke) and its container restarts; back, LWS recreates the
    group from the leader's restart count (`handleRestartPolicy`'s other path; its event then names the leader as
    the failed pod). The operator evicts nothing: the leader was never Ready beside a worker newer than its group."""
    sim, core = groups
    _up(custom, namespace)
    _traffic(core, namespace)
    before = _uids(core, namespace)
    with Timeline(core, namespace) as timeline:
        devcluster.stop_lws()
        timeline.note("LWS-stopped")
        try:
            core.delete_namespaced_pod(WORKER, namespace)
            eventually(lambda: [s for _, s in timeline.states if s.get(LEADER, {}).get("restarts")], timeout=120)
        finally:
            devcluster.start_lws()
            timeline.note("LWS-started")
        try:
            group0 = sim.wait_for(lambda: (v := {v.ordinal: v for v in _views(core, namespace)}.get(0)) and v.available
                                  and _uids(core, namespace)[LEADER] != before[LEADER] and v, REPAIR_TIMEOUT,
                                  "group 0 recreated whole and ready")  # fmt: skip
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{timeline.report()}") from None
    why = timeline.report()
    print(why)
    recreate = eventually(lambda: _events(core, namespace, "RecreateGroup"), timeout=30)
    assert [e.message for e in recreate] == [f"Worker pod {LEADER} failed, deleted leader pod {LEADER} to recreate "
                                             "group 0"], why  # fmt: skip
    assert not _events(core, namespace, workload.LONE_WORKER), why
    assert not any(s.get(LEADER, {}).get("disruption") for _, s in timeline.states), why  # nobody evicted it
    after = _uids(core, namespace)
    assert all(after[n] == before[n] for n in OTHERS), why
    res = engine.generate(group0.ip, 30000, rollout.canary_prompt(NAME))
    assert res.storage_tokens and res.storage_tokens > 0, res
    eventually(lambda: _ready(custom, namespace), timeout=REPAIR_TIMEOUT)
