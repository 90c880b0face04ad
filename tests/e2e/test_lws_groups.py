"""Multi-node groups on the real LeaderWorkerSet controller (v0.9.0) with the engine stand-in across nodes.

The LWS is the operator's own rendering (render_lws) and the rolling restart is its own state machine
(group_rollout over rollout.plan_rollout), driven here by a small shell in place of the reconciler (wired in
once the operator core's planner/executor lands): groups form (leader DNS, node ranks, rendezvous), every node
keeps its own shards on its own claim, a restart rolls group by group from the highest index, each comes back
warm from its own claims, and a group whose worker lost its volume comes back cold and pauses the rollout.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from qwen_hicache import engine, group_rollout, render, render_lws, rollout
from qwen_hicache.cli import offline_meta
from qwen_hicache.plan import parse_spec
from qwen_hicache.status_model import Restart
from resources import derived, variant

from harness.sim.cluster import SimCluster

pytestmark = pytest.mark.integration
NAME, SIZE, REPLICAS = "flash-next", 2, 2


def _doc(restart: str | None = None) -> dict:
    return variant(**{"spec.nodesPerReplica": SIZE, "spec.replicas": REPLICAS, "spec.restart": restart,
                      "spec.runtime.maxRequestSeconds": 5, "spec.router": {"enabled": False},
                      "spec.hicache.disk": {"enabled": True, "size": "8Gi"}})  # fmt: skip


class Shell:
    """What the reconciler will do for a multi-node server: apply the LWS with the held partition, plan the
    rollout on group views, perform its actions (canary and warm check at the leader, release = partition)."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.custom, self.core, self.ns = client.CustomObjectsApi(api), client.CoreV1Api(api), ns
        self.rs: Restart | None = None
        self.prompt = rollout.canary_prompt(NAME)
        fingerprint = derived(_doc()).layout.fingerprint
        self.policy = rollout.Policy(max_unavailable=1, timeout_seconds=240, require_warm=True, fingerprint=fingerprint)

    def render(self, doc: dict, partition: int) -> dict:
        meta = {**offline_meta(doc), "namespace": self.ns}
        obj = render_lws.get_leaderworkerset(meta, derived(doc), partition)
        obj["metadata"].pop("ownerReferences")  # no QwenHiCacheServer object here: nothing must collect it
        return obj

    def apply(self, doc: dict, partition: int) -> None:
        body = self.render(doc, partition)
        self.custom.patch_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", self.ns, "leaderworkersets", NAME, body,
            field_manager="qwen-hicache-operator", force=True,
            _content_type="application/apply-patch+yaml")  # fmt: skip

    def pods(self) -> list[dict]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"{render_lws.LWS_NAME_LABEL}={NAME}").items
        return [self.core.api_client.sanitize_for_serialization(p) for p in items]

    def views(self) -> list[rollout.PodView]:
        return group_rollout.group_views(NAME, self.pods(), SIZE)

    def step(self, doc: dict, target: str, now: str) -> list[str]:
        planned, _ = rollout.plan_rollout(self.rs, self.views(), target, REPLICAS, self.policy, now)
        self.apply(doc, group_rollout.partition_of(planned, REPLICAS))
        rs, actions = rollout.plan_rollout(self.rs, self.views(), target, REPLICAS, self.policy, now)
        port, done = 30000, []
        for act in actions:
            done.append(f"{act.kind}:{act.pod}")
            if act.kind == "canary":
                res = engine.generate(act.ip, port, self.prompt)
                rs = rollout.canary_sent(rs, act.pod, res.prompt_tokens, res.error)
            elif act.kind == "delete":
                if not rollout.may_take_down(self.views(), act.pod, act.uid, REPLICAS, self.policy):
                    continue
                rs = group_rollout.released(rs, act.pod, REPLICAS)
                self.apply(doc, group_rollout.partition_of(rs, REPLICAS))
                rs = rollout.deleted(rs, act.pod, now)
            elif act.kind == "baseline":
                rs = rollout.baseline_read(rs, act.pod, act.uid, engine.cache_metrics(act.ip, port))
            elif act.kind == "verify":
                res = engine.generate(act.ip, port, self.prompt)
                metrics = engine.cache_metrics(act.ip, port) if res.storage_tokens is not None else {}
                rs = rollout.verified(rs, act.pod, res.storage_tokens, res.error, self.policy, now, metrics)
        self.rs = rs
        return done

    def roll(self, restart: str, until: tuple[str, ...], timeout: float = 600) -> list[str]:
        doc = _doc(restart)
        target = rollout.target_of(parse_spec(doc["spec"]))
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen += self.step(doc, target, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if self.rs and self.rs.phase in until:
                return seen
            time.sleep(0.5)
        raise TimeoutError(f"rollout {restart} still {self.rs and self.rs.phase}: {self.rs}; did {seen}")


@pytest.fixture
def groups(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Any:
    with SimCluster(kube_api, tmp_path / "volumes", namespace, nodes=4, max_grace_seconds=30) as sim:
        sim.weights_claim(namespace)
        core = client.CoreV1Api(kube_api)
        meta = {"name": NAME, "namespace": namespace, "uid": "x"}
        secret = render.get_admin_secret(meta, "k3y")
        secret["metadata"].pop("ownerReferences")
        core.create_namespaced_secret(namespace, secret)
        yield sim, Shell(kube_api, namespace)


class GroupsDown:
    """Samples the groups every 0.2 s in a thread: the most groups ever down at once (a group is down unless its
    leader and every worker serve at one target), the rollout's promise with maxUnavailable 1 and 2 groups."""

    def __init__(self, shell: Shell) -> None:
        self.shell, self.most, self.samples = shell, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(Exception):  # an API blip is a gap, not a sample
                views = self.shell.views()
                down = REPLICAS - sum(1 for v in views if v.available)
                self.most, self.samples = max(self.most, down), self.samples + 1

    def __enter__(self) -> GroupsDown:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _all_ready(shell: Shell) -> bool:
    views = shell.views()
    return len(views) == REPLICAS and all(v.available for v in views)


def _shards(sim: SimCluster, ns: str, claim: str) -> set[str]:
    root = sim.pvc_dir(ns, claim)
    return {f.rsplit("_", 2)[-2] for d in root.iterdir() if d.is_dir() for f in os.listdir(d) if f.endswith(".bin")}


def test_groups_roll_one_at_a_time_warm_from_their_own_claims_and_a_lost_volume_pauses(groups: Any,
                                                                                        namespace: str) -> None:
    sim, shell = groups
    shell.apply(_doc(), 0)
    sim.wait_for(lambda: _all_ready(shell), 240, "2 groups of 2 ready")
    for view in shell.views():  # traffic, so every node has pages of its ranks on its own claim
        assert engine.generate(view.ip, 30000, shell.prompt).prompt_tokens
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in shell.pods()}
    assert sorted(before) == ["flash-next-0", "flash-next-0-1", "flash-next-1", "flash-next-1-1"]

    with GroupsDown(shell) as down:
        seen = shell.roll("r1", until=("Complete", "Paused"))
    assert down.samples > 50 and down.most == 1, (down.samples, down.most)  # one group at a time, never both
    rs = shell.rs
    assert rs.phase == "Complete", rs
    assert [r.pod for r in rs.results] == ["flash-next-1", "flash-next-0"]  # highest group first
    assert all(r.warm and r.storage_tokens > 0 for r in rs.results), rs.results
    assert [a for a in seen if a.startswith("delete")] == ["delete:flash-next-1", "delete:flash-next-0"]
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in shell.pods()}
    assert all(after[n] != before[n] for n in before)  # every pod of every group restarted
    for name in before:
        assert sim.record(namespace, name).incarnations == 2, (name, sim.record(namespace, name).events)
    assert _shards(sim, namespace, "hicache-flash-next-1") == {"0"}  # node 0: TP rank 0 of 2
    assert _shards(sim, namespace, "hicache-flash-next-1-1") == {"1"}  # node 1: its own rank, its own claim

    # Group 1's worker loses its volume: by the MIN over ranks the whole group comes back cold, and says so.
    for d in sim.pvc_dir(namespace, "hicache-flash-next-1-1").iterdir():
        for f in d.iterdir():
            if f.name.endswith(".bin"):
                f.unlink()
    shell.roll("r2", until=("Complete", "Paused"))
    rs = shell.rs
    assert rs.phase == "Paused" and rs.reason == "ColdStart", rs
    assert rs.results[-1].pod == "flash-next-1" and not rs.results[-1].warm
    assert group_rollout.partition_of(rs, REPLICAS) == 1  # group 0 is left alone
    assert sim.record(namespace, "flash-next-0").incarnations == 2


def test_a_deleted_worker_recreates_its_group_which_comes_back_warm_from_its_own_claims(groups: Any,
                                                                                       namespace: str) -> None:
    sim, shell = groups
    shell.apply(_doc(), 0)
    sim.wait_for(lambda: _all_ready(shell), 240, "2 groups of 2 ready")
    group0 = next(v for v in shell.views() if v.ordinal == 0)
    assert engine.generate(group0.ip, 30000, shell.prompt).prompt_tokens
    flushed = sim.record(namespace, "flash-next-0")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in shell.pods()}
    shell.core.delete_namespaced_pod("flash-next-0-1", namespace)

    def recreated() -> rollout.PodView | None:
        views = {v.ordinal: v for v in shell.views()}
        pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in shell.pods()}
        new = all(pods.get(n) not in (None, before[n]) for n in ("flash-next-0", "flash-next-0-1"))
        return views[0] if new and views[0].available else None

    group0 = sim.wait_for(recreated, 240, "group 0 recreated whole and ready")
    assert flushed.prestop_runs >= 1  # the leader drained and flushed before it went
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in shell.pods()}["flash-next-1"] == before["flash-next-1"]
    res = engine.generate(group0.ip, 30000, shell.prompt)
    assert res.storage_tokens and res.storage_tokens > 0, res  # every node's shard read back from its own claim
