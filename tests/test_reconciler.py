"""reconcile() against the in-memory API server (tests/fakekube.py): the exact API calls of one pass, table-driven,
in the style of cert-manager's controller tests. No network: the runtime, the routers and the sidecars answer
through stubs (`Runtime`)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakekube import FakeKube
from kubernetes.client.exceptions import ApiException
from qwen_hicache import diskusage, engine, reconciler, router
from qwen_hicache.constants import (
    CONFIG_HASH_ANNOTATION,
    FINGERPRINT_ANNOTATION,
    RESTART_ANNOTATION,
    router_labels,
    selector,
)
from qwen_hicache.constants import labels as server_labels
from qwen_hicache.spec import API_VERSION, KIND
from resources import example

pytestmark = pytest.mark.fake
NS, NAME = "ns", "srv"
NOW = [f"2026-01-01T00:{m:02d}:00Z" for m in range(60)]


@dataclass
class Runtime:
    """What the pods answer: the canary, the storage counters, each router's worker list, the sidecars."""

    storage_tokens: int = 4032
    routes: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    prestop: diskusage.PreStopRecord | None = None
    """The last preStop record every sidecar reports (None: the sidecars do not answer)."""

    def generate(self, ip: str, port: int, text: str, timeout: float = 0) -> engine.CanaryResult:
        self.calls.append(("generate", ip))
        return engine.CanaryResult(4096, self.storage_tokens)

    def cache_metrics(self, ip: str, port: int, timeout: float = 0) -> dict[str, float]:
        self.calls.append(("metrics", ip))
        return {"sglang:cached_tokens_total{storage}": 0.0}

    def router_workers(self, ip: str, port: int, timeout: float = 0) -> dict[str, str]:
        self.calls.append(("workers", ip))
        return dict(self.routes)

    def read_usage(self, ip: str, port: int = 0, timeout: float = 0) -> diskusage.DiskUsage | None:
        return diskusage.DiskUsage(0, 0, prestop=self.prestop) if self.prestop else None


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Runtime:
    rt = Runtime()
    monkeypatch.setattr(engine, "generate", rt.generate)
    monkeypatch.setattr(engine, "cache_metrics", rt.cache_metrics)
    monkeypatch.setattr(router, "router_workers", rt.router_workers)
    monkeypatch.setattr(engine, "read_usage", rt.read_usage)
    return rt


def set_spec(doc: dict, changes: dict[str, Any]) -> None:
    """Set dotted spec paths (`"hicache.disk.size"`) on `doc`."""
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = doc["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value


def server(**spec_changes: Any) -> dict:
    doc = example()
    doc["metadata"] = {"name": NAME, "namespace": NS, "uid": "uid-srv", "generation": 1}
    set_spec(doc, spec_changes)
    return doc


class World:
    """The fake API server with one QwenHiCacheServer, and what the cluster's own controllers would do."""

    def __init__(self, runtime: Runtime, doc: dict | None = None, nodes: list[dict] | None = None) -> None:
        doc = server() if doc is None else doc
        self.kube, self.runtime, self.events = FakeKube(doc, nodes=nodes), runtime, []
        self.born = 0
        """Pod incarnations made so far (each gets its own uid)."""

    def reconcile(self, minute: int = 0) -> reconciler.Outcome:
        self.kube.reset()
        return reconciler.reconcile(self.kube, {"metadata": {"namespace": NS, "name": NAME}},
                                    lambda body, kind, reason, msg: self.events.append((kind, reason)), NOW[minute])

    def edit(self, **spec_changes: Any) -> None:
        obj = self.kube.server()
        set_spec(obj, spec_changes)
        obj["metadata"]["generation"] += 1

    def statefulset_controller(self, ready: bool = True) -> None:
        """Pods and claims for every replica at the set's template (as the StatefulSet controller makes them)."""
        sts = self.kube.find("StatefulSet", NAME)
        template, replicas = sts["spec"]["template"], sts["spec"]["replicas"]
        for i in range(replicas):
            self.kube.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": f"hicache-{NAME}-{i}", "namespace": NS, "labels": server_labels(NAME)},
                           "spec": {"resources": {"requests": {"storage": "644245094400"}}}})  # fmt: skip
            if self.kube.find("Pod", f"{NAME}-{i}") is None:
                self.pod(i, template["metadata"]["annotations"], ready)
        sts["status"] = {"replicas": replicas, "readyReplicas": replicas if ready else 0}

    def pod(self, i: int, annotations: dict, ready: bool = True) -> None:
        self.born += 1
        conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
        self.kube.put({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"{NAME}-{i}", "namespace": NS, "uid": f"uid-pod-{self.born}-0",
                                    "labels": server_labels(NAME), "annotations": dict(annotations)},
                       "status": {"podIP": f"10.0.0.{i + 1}", "conditions": conditions}})  # fmt: skip

    def router_pod(self) -> None:
        self.kube.put({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"{NAME}-router-abc", "namespace": NS, "labels": router_labels(NAME)},
                       "status": {"podIP": "10.0.1.1", "conditions": [{"type": "Ready", "status": "True"}]}})

    def converged(self) -> World:
        """Created, its pods and claims made and ready, a router pod up, reconciled until nothing changes."""
        self.reconcile()
        self.statefulset_controller()
        self.router_pod()
        self.runtime.routes = {f"{NAME}-0": "ready", f"{NAME}-1": "ready"}
        self.reconcile(1)
        return self

    def status(self) -> dict:
        return self.kube.server().get("status") or {}

    def condition(self, ctype: str) -> dict:
        return next(c for c in self.status()["conditions"] if c["type"] == ctype)


SERVER_SEL = ",".join(f"{k}={v}" for k, v in sorted(selector(NAME).items()))
OWNED_SEL = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/managed-by=qwen-hicache-operator"
READS_OF_A_PASS = [
    ("get", KIND, NAME), ("list", "Node"),
    ("list", "Service", OWNED_SEL), ("get", "StatefulSet", NAME), ("get", "PodDisruptionBudget", NAME),
    ("get", "Deployment", f"{NAME}-router"), ("get", "ConfigMap", f"{NAME}-router-workers"),
    ("list", "PersistentVolumeClaim", SERVER_SEL), ("list", "Pod", f"app.kubernetes.io/instance={NAME}"),
]
"""Every read of one pass of a converged server with its router and disk tier: nine, each child read once."""


def _new(world: World) -> None:
    pass


def _noop(world: World) -> None:
    world.converged()


def _service_edited(world: World) -> None:
    world.converged()
    world.kube.find("Service", f"{NAME}-headless")["spec"]["ports"][0]["port"] = 8080


def _invalid(world: World) -> None:
    world.converged()
    world.edit(**{"runtime.tensorParallelSize": 0})


def _shrunk(world: World) -> None:
    world.converged()
    world.edit(**{"hicache.disk.size": "100Gi"})


def _grown(world: World) -> None:
    world.converged()
    world.edit(**{"hicache.disk.size": "800Gi"})


def _apply_fails(world: World) -> None:
    world.converged()
    world.kube.find("StatefulSet", NAME)["spec"]["replicas"] = 5
    world.kube.fail[("apply", "StatefulSet")] = ApiException(status=500, reason="Internal Server Error")


def _namespace_terminating(world: World) -> None:
    world.kube.fail[("apply", "Service")] = ApiException(status=403, reason="Forbidden")
    world.kube.fail[("apply", "Service")].body = (
        '{"kind":"Status","reason":"Forbidden","details":{"causes":[{"reason":"NamespaceTerminating"}]},"code":403}')


def _restart(world: World) -> None:
    world.converged()
    world.edit(restart="r1")


def _restart_canary_sent(world: World) -> None:
    _restart(world)
    world.reconcile(2)
    world.runtime.routes = {f"{NAME}-0": "ready"}  # the router no longer routes to srv-1


@dataclass(frozen=True)
class Case:
    name: str
    arrange: Callable[[World], None]
    writes: list[tuple[str, ...]]
    """Exactly the writes of the pass under test, in order."""
    reads: list[tuple[str, ...]] | None = None
    """Exactly its reads, when the case pins them."""
    check: Callable[[World, reconciler.Outcome], object] = lambda world, outcome: True
    """What the pass left in the status, the events, the runtime's calls."""


CASES = [
    Case("a new server is applied without reading children it cannot have", _new, writes=[
        ("apply", "Service", f"{NAME}-headless"), ("apply", "Service", NAME), ("apply", "StatefulSet", NAME),
        ("apply", "PodDisruptionBudget", NAME), ("apply", "Service", f"{NAME}-router"),
        ("apply", "Deployment", f"{NAME}-router"), ("create", "Secret", f"{NAME}-admin"),
        ("apply", "ConfigMap", f"{NAME}-router-workers"), ("patch_status", KIND, NAME)],
        reads=[("get", KIND, NAME), ("list", "Node"), ("get", "StatefulSet", NAME),
               ("list", "PersistentVolumeClaim", SERVER_SEL), ("list", "Pod", f"app.kubernetes.io/instance={NAME}")],
        check=lambda w, o: w.events == [("Normal", "Accepted")] and w.condition("SpecValid")["status"] == "True"),
    Case("a converged server's resync reads each child once and writes nothing", _noop, writes=[],
         reads=READS_OF_A_PASS,
         check=lambda w, o: not o.applied and not o.status_written and w.condition("Ready")["status"] == "True"),
    Case("an edited child is applied again, alone", _service_edited,
         writes=[("apply", "Service", f"{NAME}-headless")], reads=READS_OF_A_PASS),
    Case("an invalid spec applies nothing and says why", _invalid, writes=[("patch_status", KIND, NAME)],
         reads=[("get", KIND, NAME), ("list", "Node"), ("get", "StatefulSet", NAME)],
         check=lambda w, o: w.condition("SpecValid")["reason"] == "InvalidSpec"
         and w.condition("Ready")["status"] == "True" and ("Warning", "InvalidSpec") in w.events),
    Case("a shrunk disk is refused with the current size", _shrunk, writes=[("patch_status", KIND, NAME)],
         check=lambda w, o: w.condition("Degraded")["reason"] == "DiskShrinkRefused"
         and "600Gi" in w.condition("Degraded")["message"]),
    Case("a grown disk expands each claim, then re-creates the set without its pods", _grown, writes=[
        ("resize", "PersistentVolumeClaim", f"hicache-{NAME}-0", "858993459200"),
        ("resize", "PersistentVolumeClaim", f"hicache-{NAME}-1", "858993459200"),
        ("delete_orphaning", "StatefulSet", NAME), ("patch_status", KIND, NAME)],
        check=lambda w, o: ("Normal", "DiskExpanding") in w.events and w.kube.find("Pod", f"{NAME}-0") is not None),
    Case("a failed apply is Degraded, retried later, and writes the rest", _apply_fails, writes=[
        ("apply", "StatefulSet", NAME), ("patch_status", KIND, NAME)],
        check=lambda w, o: o.error and w.condition("Degraded")["reason"] == "ApplyFailed"),
    Case("in a namespace being deleted the pass stops at the refused create: no status, no event, no retry",
         _namespace_terminating, writes=[("apply", "Service", f"{NAME}-headless")],
         check=lambda w, o: o.namespace_terminating and not o.error and w.events == [] and not w.status()),
    Case("a restart sends the canary to the highest pod first, then drains it from the router", _restart,
         writes=[("apply", "StatefulSet", NAME), ("apply", "ConfigMap", f"{NAME}-router-workers"),
                 ("patch_status", KIND, NAME)],
         check=lambda w, o: ("generate", "10.0.0.2") in w.runtime.calls and o.rollout_actions == 1
         and w.status()["restart"]["inFlight"][0]["step"] == "Delete" and w.status()["router"]["drained"] == [
             f"{NAME}-1"]),
    Case("once no router routes to it the pod is evicted by uid", _restart_canary_sent,
         writes=[("evict", "Pod", f"{NAME}-1", "uid-pod-2-0"), ("patch_status", KIND, NAME)],
         check=lambda w, o: w.status()["restart"]["inFlight"][0]["step"] == "WaitingReady"
         and w.kube.find("Pod", f"{NAME}-1") is None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_pass_makes_exactly_these_api_calls(case: Case, runtime: Runtime) -> None:
    world = World(runtime)
    case.arrange(world)
    outcome = world.reconcile(5)
    assert world.kube.writes == case.writes
    if case.reads is not None:
        assert world.kube.reads == case.reads
    assert case.check(world, outcome)


def test_a_second_pass_after_any_change_writes_nothing(runtime: Runtime) -> None:
    """Level-based: whatever one pass wrote, the next one finds in place (no write, not even the status)."""
    for arrange in (_new, _service_edited, _invalid, _shrunk):
        world = World(runtime)
        arrange(world)
        world.reconcile(5)
        world.reconcile(5)
        assert world.kube.writes == [], arrange.__name__


def test_the_grown_set_is_applied_by_the_next_pass_and_adopts_the_pods(runtime: Runtime) -> None:
    world = World(runtime)
    _grown(world)
    world.reconcile(5)
    world.reconcile(6)
    sts = world.kube.find("StatefulSet", NAME)
    assert ("apply", "StatefulSet", NAME) in world.kube.writes
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "858993459200"


def test_a_blocked_eviction_keeps_the_pod_in_delete(runtime: Runtime) -> None:
    world = World(runtime)
    _restart_canary_sent(world)
    world.kube.evictions_blocked = True  # the PodDisruptionBudget allows no disruption now
    world.reconcile(5)
    assert ("evict", "Pod", f"{NAME}-1", "uid-pod-2-0") in world.kube.writes
    assert world.status()["restart"]["inFlight"][0]["step"] == "Delete" and world.kube.find("Pod", f"{NAME}-1")


def test_a_new_server_with_a_same_named_set_left_behind_is_compared_not_blindly_applied(runtime: Runtime) -> None:
    left = World(runtime).converged().kube.find("StatefulSet", NAME)
    world = World(runtime)
    world.kube.put(copy.deepcopy(left))
    world.edit(**{"hicache.disk.size": "100Gi"})
    world.reconcile(5)
    assert ("get", "StatefulSet", NAME) in world.kube.reads and world.kube.find("StatefulSet", NAME) is not None
    assert world.condition("Degraded")["reason"] == "DiskShrinkRefused"


def test_pods_are_listed_once_per_pass_for_both_the_rollout_and_the_router(runtime: Runtime) -> None:
    world = World(runtime)
    world.converged()
    world.reconcile(5)
    assert [c for c in world.kube.calls if c[:2] == ("list", "Pod")] == [
        ("list", "Pod", f"app.kubernetes.io/instance={NAME}")]
    assert {CONFIG_HASH_ANNOTATION, RESTART_ANNOTATION, FINGERPRINT_ANNOTATION} <= set(
        world.kube.find("Pod", f"{NAME}-0")["metadata"]["annotations"])
    assert world.kube.server()["apiVersion"] == API_VERSION


def _restarted(runtime: Runtime, record: diskusage.PreStopRecord) -> World:
    """srv-1 (uid-pod-2-0) evicted by a restart, its successor (uid-pod-3-0) ready and checked warm; every sidecar
    reports `record` as its volume's last preStop."""
    world = World(runtime)
    _restart_canary_sent(world)
    world.reconcile(5)
    world.statefulset_controller()
    runtime.prestop = record
    world.reconcile(6)  # the successor's baseline
    world.reconcile(7)  # its warm check
    return world


def test_a_failed_prestop_is_in_the_pods_result_and_one_warning(runtime: Runtime) -> None:
    world = _restarted(runtime, diskusage.PreStopRecord("uid-pod-2-0", "timeout", "flush: timed out", "srv-1",
                                                        1767225600, 41.5))
    result = world.status()["restart"]["results"][0]
    assert result["pod"] == f"{NAME}-1" and result["preStop"] == {
        "outcome": "timeout", "message": "flush: timed out", "seconds": 41.5, "finished": "2026-01-01T00:00:00Z"}
    assert world.events.count(("Warning", reconciler.PRESTOP_FAILED)) == 1
    world.reconcile(8)
    world.reconcile(9)
    assert world.events.count(("Warning", reconciler.PRESTOP_FAILED)) == 1


def test_an_ok_prestop_is_recorded_quietly(runtime: Runtime) -> None:
    world = _restarted(runtime, diskusage.PreStopRecord("uid-pod-2-0", "ok", "flush: 200"))
    assert world.status()["restart"]["results"][0]["preStop"] == {"outcome": "ok", "message": "flush: 200"}
    assert not [e for e in world.events if e[0] == "Warning"]


def test_a_record_an_older_incarnation_left_is_not_reported(runtime: Runtime) -> None:
    world = _restarted(runtime, diskusage.PreStopRecord("uid-pod-0-0", "failed", "an older pod's"))
    assert "preStop" not in world.status()["restart"]["results"][0]
    assert not [e for e in world.events if e[0] == "Warning"]


def test_a_body_of_the_version_last_written_is_acted_on_without_reading_it_again(runtime: Runtime) -> None:
    """A resync timer's body is Kopf's latest; when it is the version our own status write produced, the GET would
    return exactly it. An older body (Kopf's watch lagging behind our write) is read afresh."""
    world = World(runtime).converged()
    newest = copy.deepcopy(world.kube.server())
    world.kube.reset()
    reconciler.reconcile(world.kube, newest, lambda *a: None, NOW[5])
    assert world.kube.reads == READS_OF_A_PASS[1:] and world.kube.writes == []
    stale = copy.deepcopy(newest)
    stale["metadata"]["resourceVersion"] = "1"
    world.kube.reset()
    reconciler.reconcile(world.kube, stale, lambda *a: None, NOW[5])
    assert world.kube.reads == READS_OF_A_PASS and world.kube.writes == []


def test_after_a_status_write_a_body_from_before_it_is_read_again(runtime: Runtime) -> None:
    world = World(runtime)
    before = copy.deepcopy(world.kube.server())
    world.reconcile()  # writes the status: a new version
    world.kube.reset()
    reconciler.reconcile(world.kube, before, lambda *a: None, NOW[1])
    assert world.kube.reads[0] == ("get", KIND, NAME)


def test_a_statefulset_event_showing_what_the_last_pass_saw_needs_no_pass(runtime: Runtime) -> None:
    """Our own apply's event and the controller's revision bookkeeping change nothing a pass reads; readiness,
    a spec edit (generation) or another incarnation do."""
    world = World(runtime).converged()
    sts = copy.deepcopy(world.kube.find("StatefulSet", NAME))
    assert reconciler.workload_seen(sts)
    sts["status"]["currentRevision"] = sts["metadata"]["resourceVersion"] = "other"
    assert reconciler.workload_seen(sts)
    for path, value in [("status", {"readyReplicas": 1}), ("metadata.generation", 9), ("metadata.uid", "u2")]:
        changed = copy.deepcopy(sts)
        *parents, leaf = path.split(".")
        node = changed
        for part in parents:
            node = node[part]
        node[leaf] = value
        assert not reconciler.workload_seen(changed), path


def test_a_deleted_server_leaves_no_versions_behind(runtime: Runtime) -> None:
    world = World(runtime).converged()
    assert reconciler.workload_seen(world.kube.find("StatefulSet", NAME))
    reconciler.forget(NS, NAME)
    assert not reconciler.workload_seen(world.kube.find("StatefulSet", NAME))
    assert (NS, NAME) not in reconciler._newest


def test_triggers_queued_behind_a_pass_coalesce_into_the_next_one(runtime: Runtime) -> None:
    """A, running, holds the lock; B and C (child events: no version) wait. Whichever passes first started after
    the other came, so the other is done when it gets the lock: two passes for three triggers."""
    world = World(runtime).converged()
    world.kube.reset()
    inside, release = threading.Event(), threading.Event()
    get = world.kube.get

    def slow_get(api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        if kind == "StatefulSet" and not release.is_set():
            inside.set()
            release.wait(5)
        return get(api_version, kind, namespace, name)

    world.kube.get = slow_get  # type: ignore[method-assign]
    ref = {"metadata": {"namespace": NS, "name": NAME}}
    threads = [threading.Thread(target=reconciler.reconcile, args=(world.kube, ref, lambda *a: None, NOW[5]))
               for _ in range(3)]  # fmt: skip
    threads[0].start()
    assert inside.wait(5)
    for t in threads[1:]:
        t.start()
    time.sleep(0.2)  # both wait for the lock
    release.set()
    for t in threads:
        t.join(5)
    assert [c for c in world.kube.calls if c[:2] == ("get", "StatefulSet")] == [("get", "StatefulSet", NAME)] * 2


def test_a_trigger_with_a_version_the_covering_pass_did_not_act_on_still_runs(runtime: Runtime) -> None:
    """A spec edit's update event carries a version the last pass (acting on the version it knew, without a GET)
    may not have seen: it is never coalesced away."""
    world = World(runtime).converged()
    edited = copy.deepcopy(world.kube.server())
    edited["metadata"]["resourceVersion"] = "999999"
    reconciler._passed[(NS, NAME)] = time.monotonic() + 60  # as if a pass started after these triggers came
    try:
        world.kube.reset()
        reconciler.reconcile(world.kube, {"metadata": {"namespace": NS, "name": NAME}}, lambda *a: None, NOW[5])
        assert world.kube.calls == []
        reconciler.reconcile(world.kube, edited, lambda *a: None, NOW[5])
        assert world.kube.reads == READS_OF_A_PASS
    finally:
        reconciler.forget(NS, NAME)
