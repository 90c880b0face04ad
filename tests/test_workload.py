"""The workload managers through reconcile() against the in-memory API server (tests/fakekube.py): a multi-node
server (`nodesPerReplica: 2`, LeaderWorkerSet groups), the exact API calls of one pass, with a LeaderWorkerSet
controller stand-in that is stricter than the real one (it recreates whole groups, only at or above the partition,
and makes nothing ready by itself)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from qwen_hicache import render_lws, workload
from qwen_hicache.constants import selector
from qwen_hicache.spec import KIND
from test_reconciler import NAME, NOW, NS, Runtime, World, server
from test_reconciler import runtime as runtime  # noqa: F401 - the fixture

pytestmark = pytest.mark.fake
SIZE, REPLICAS = 2, 2
POD_SEL = f"app.kubernetes.io/instance={NAME}"
CLAIM_SEL = f"{render_lws.LWS_NAME_LABEL}={NAME}"
OWNED_SEL = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/managed-by=qwen-hicache-operator"
LEADERS = {f"{NAME}-{g}" for g in range(REPLICAS)}


def gpu_node(gpus: int) -> dict:
    return {"metadata": {"name": f"n{gpus}", "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"allocatable": {"memory": "2000Gi", "nvidia.com/gpu": str(gpus)}}}  # fmt: skip


class Groups(World):
    """The fake API server with one multi-node server, and what LWS and its StatefulSets would do."""

    def __init__(self, runtime: Runtime, nodes: list[dict] | None = None, **spec: Any) -> None:
        super().__init__(runtime, server(nodesPerReplica=SIZE, **{"router.enabled": False, **spec}), nodes)

    def lws(self) -> dict:
        return self.kube.find("LeaderWorkerSet", NAME)

    def partition(self) -> int:
        return self.lws()["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"]

    def controller(self, ready: bool = True) -> None:
        """LWS: every group at or above the partition whose pods are not at the template is recreated whole
        (new uids, same claims); groups below it are left alone; readyReplicas counts whole ready groups."""
        lws = self.lws()
        lwt, replicas = lws["spec"]["leaderWorkerTemplate"], lws["spec"]["replicas"]
        want = lwt["leaderTemplate"]["metadata"]["annotations"]
        for g in range(replicas):
            leader = self.kube.find("Pod", f"{NAME}-{g}")
            stale = leader is None or leader["metadata"]["annotations"] != want
            if g >= render_lws.partition_in(lws) and stale:
                for w in range(SIZE):
                    self.pod(g, w, lwt["leaderTemplate" if w == 0 else "workerTemplate"], ready)
        ready_groups = sum(all(self._ready(f"{NAME}-{g}" + (f"-{w}" if w else "")) for w in range(SIZE))
                           for g in range(replicas))  # fmt: skip
        lws["status"] = {"replicas": replicas, "readyReplicas": ready_groups}

    def _ready(self, name: str) -> bool:
        pod = self.kube.find("Pod", name)
        return bool(pod and pod["status"]["conditions"][0]["status"] == "True")

    def pod(self, g: int, w: int, template: dict, ready: bool = True, created: str = NOW[0]) -> None:
        self.born += 1
        name = f"{NAME}-{g}" + (f"-{w}" if w else "")
        # As LWS v0.9.0's StatefulSets label a group's claims: the LWS's name and indexes, not the template's labels.
        index = {render_lws.GROUP_INDEX_LABEL: str(g)} if w else {render_lws.WORKER_INDEX_LABEL: "0"}
        self.kube.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": f"hicache-{name}", "namespace": NS,
                                    "labels": {render_lws.LWS_NAME_LABEL: NAME, **index}},
                       "spec": {"resources": {"requests": {"storage": "1"}}}})  # fmt: skip
        labels = {**template["metadata"]["labels"], render_lws.GROUP_INDEX_LABEL: str(g),
                  render_lws.WORKER_INDEX_LABEL: str(w), render_lws.LWS_NAME_LABEL: NAME}  # fmt: skip
        conditions = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": NOW[1]}]
        self.kube.put({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}-{self.born}",
                                    "labels": labels, "annotations": dict(template["metadata"]["annotations"]),
                                    "creationTimestamp": created},
                       "status": {"podIP": f"10.0.{g}.{w + 1}", "conditions": conditions}})  # fmt: skip

    def converged(self) -> Groups:
        self.reconcile()
        self.controller()
        self.reconcile(1)
        return self


def test_a_new_multi_node_server_applies_one_leaderworkerset_and_selects_leaders(runtime: Runtime) -> None:
    world = Groups(runtime)
    world.reconcile()
    assert world.kube.writes == [
        ("apply", "Service", f"{NAME}-headless"), ("apply", "Service", NAME), ("apply", "LeaderWorkerSet", NAME),
        ("apply", "PodDisruptionBudget", NAME), ("create", "Secret", f"{NAME}-admin"), ("patch_status", KIND, NAME)]
    assert world.kube.find("StatefulSet", NAME) is None
    assert world.partition() == 0
    leaders = {**selector(NAME), render_lws.WORKER_INDEX_LABEL: "0"}
    assert world.kube.find("Service", NAME)["spec"]["selector"] == leaders
    assert world.kube.find("PodDisruptionBudget", NAME)["spec"]["selector"] == {"matchLabels": leaders}
    assert world.condition("SpecValid")["status"] == "True"


def test_a_converged_groups_resync_writes_nothing_and_reports_each_group(runtime: Runtime) -> None:
    world = Groups(runtime).converged()
    outcome = world.reconcile(5)
    assert world.kube.writes == [] and not outcome.applied
    assert world.kube.reads == [
        ("get", KIND, NAME), ("list", "Node"), ("list", "Service", OWNED_SEL), ("get", "LeaderWorkerSet", NAME),
        ("get", "PodDisruptionBudget", NAME), ("list", "PersistentVolumeClaim", CLAIM_SEL), ("list", "Pod", POD_SEL)]
    status = world.status()
    assert world.condition("Ready")["status"] == "True" and status["replicasSummary"] == "2/2"
    assert [(g["group"], g["leader"], g["readyNodes"]) for g in status["groups"]] == [
        (0, f"{NAME}-0", 2), (1, f"{NAME}-1", 2)]
    assert [n["pod"] for n in status["groups"][1]["nodes"]] == [f"{NAME}-1", f"{NAME}-1-1"]
    claims = [o for (k, _, _), o in world.kube.objects.items() if k == "PersistentVolumeClaim"]
    assert len(claims) == REPLICAS * SIZE  # every node's claim records the cache namespace it holds
    assert all(c["metadata"]["annotations"]["qwenhicache.io/fingerprint"] == status["cache"]["fingerprint"]
               for c in claims)  # fmt: skip


def test_a_restart_applies_the_new_template_holding_every_group_then_releases_the_highest(runtime: Runtime) -> None:
    world = Groups(runtime).converged()
    before = {n: world.kube.find("Pod", n)["metadata"]["uid"] for n in (f"{NAME}-0", f"{NAME}-1-1")}
    world.edit(restart="r1")
    world.reconcile(2)
    # One apply: the new template and partition = replicas together, so LWS restarts nothing by itself.
    assert world.kube.writes == [("apply", "LeaderWorkerSet", NAME), ("patch_status", KIND, NAME)]
    lws = world.lws()
    assert world.partition() == REPLICAS
    assert lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["annotations"][
        "qwenhicache.io/restart"] == "r1"
    assert ("generate", "10.0.1.1") in runtime.calls  # the canary at group 1's leader
    world.controller()
    assert {n: world.kube.find("Pod", n)["metadata"]["uid"] for n in before} == before  # nothing restarted

    world.reconcile(3)  # release: the partition goes down to group 1, nothing is evicted
    assert world.kube.writes == [("apply", "LeaderWorkerSet", NAME), ("patch_status", KIND, NAME)]
    assert world.partition() == 1 and world.status()["restart"]["partition"] == 1
    assert world.status()["restart"]["inFlight"][0] == {**world.status()["restart"]["inFlight"][0],
                                                         "pod": f"{NAME}-1", "step": "WaitingReady"}
    world.controller()  # LWS recreates group 1 only
    assert world.kube.find("Pod", f"{NAME}-0")["metadata"]["uid"] == before[f"{NAME}-0"]
    assert world.kube.find("Pod", f"{NAME}-1-1")["metadata"]["uid"] != before[f"{NAME}-1-1"]
    world.reconcile(4)  # the warm check at the leader, then group 0's canary; a replayed pass lowers nothing twice
    for minute in range(6, 20):
        world.reconcile(minute)
        world.controller()
        if world.status()["restart"]["phase"] == "Complete":
            break
    rs = world.status()["restart"]
    assert rs["phase"] == "Complete" and [r["pod"] for r in rs["results"]] == [f"{NAME}-1", f"{NAME}-0"]
    assert world.partition() == 0
    assert all(g["lastRestart"]["warm"] for g in world.status()["groups"])
    world.reconcile(30)
    assert world.kube.writes == []


def test_a_worker_back_without_its_group_gets_its_leader_evicted_by_uid(runtime: Runtime) -> None:
    world = Groups(runtime).converged()
    leader_uid = world.kube.find("Pod", f"{NAME}-0")["metadata"]["uid"]
    template = world.lws()["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    world.pod(0, 1, template, ready=False, created=NOW[4])  # created after its leader turned Ready (NOW[1])
    world.reconcile(5)
    assert ("evict", "Pod", f"{NAME}-0", leader_uid, "Foreground") in world.kube.writes  # dependents first
    assert world.kube.find("Pod", f"{NAME}-0") is None
    assert world.events.count(("Warning", workload.LONE_WORKER)) == 1


def test_retention_delete_makes_the_server_own_every_cache_claim_once(runtime: Runtime) -> None:
    world = Groups(runtime, **{"hicache.disk.retention": "Delete"}).converged()
    claims = sorted(n for (k, _, n) in world.kube.objects if k == "PersistentVolumeClaim")
    assert claims == [f"hicache-{NAME}-0", f"hicache-{NAME}-0-1", f"hicache-{NAME}-1", f"hicache-{NAME}-1-1"]
    for name in claims:
        refs = world.kube.find("PersistentVolumeClaim", name)["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [(KIND, "uid-srv", False)]
    world.reconcile(5)
    assert world.kube.writes == []


def test_retain_leaves_the_claims_unowned(runtime: Runtime) -> None:
    world = Groups(runtime).converged()
    assert not world.kube.find("PersistentVolumeClaim", f"hicache-{NAME}-1-1")["metadata"].get("ownerReferences")


def test_a_node_count_no_node_can_hold_applies_nothing_and_says_why(runtime: Runtime) -> None:
    world = Groups(runtime, nodes=[gpu_node(1)])  # each pod needs tensorParallelSize 2 / 2 nodes = 1 GPU: fits
    world.reconcile()
    assert ("apply", "LeaderWorkerSet", NAME) in world.kube.writes
    world = Groups(runtime, nodes=[gpu_node(1)], **{"runtime.tensorParallelSize": 4})
    world.reconcile()
    assert world.kube.writes == [("patch_status", KIND, NAME)]
    assert world.condition("SizingValid")["status"] == "False" and "needs 2 GPUs" in world.condition(
        "SizingValid")["message"]


def test_a_disk_change_on_groups_is_refused_and_the_groups_keep_running(runtime: Runtime) -> None:
    world = Groups(runtime).converged()
    world.edit(**{"hicache.disk.size": "800Gi"})
    world.reconcile(5)
    assert world.kube.writes == [("patch_status", KIND, NAME)]
    assert world.condition("Degraded")["reason"] == "DiskChangeRefused"
    assert world.condition("Ready")["status"] == "True"


def test_a_release_whose_status_write_was_lost_is_never_undone(runtime: Runtime) -> None:
    """The operator lowered the partition, then died before writing status: the next pass keeps it down."""
    world = Groups(runtime).converged()
    world.edit(restart="r1")
    world.reconcile(2)  # template + partition 2, canary at group 1
    stored = world.status()["restart"]
    world.reconcile(3)  # release: partition 1 ...
    assert world.partition() == 1
    world.kube.server()["status"]["restart"] = stored  # ... whose status write never happened
    world.controller()
    world.reconcile(4)
    assert world.partition() == 1 and ("apply", "LeaderWorkerSet", NAME) not in world.kube.writes



def test_a_multi_node_server_without_the_leaderworkerset_api_says_so_in_status(runtime: Runtime) -> None:
    """No LWS CRD on the cluster: the pass stops at the LeaderWorkerSet read and reports it (never an unhandled
    discovery error: the resync would log a traceback every period); nothing of the group is applied."""
    from qwen_hicache.kube import NotServed

    world = Groups(runtime)
    world.kube.fail[("get", "LeaderWorkerSet")] = NotServed(render_lws.LWS_API_VERSION, "LeaderWorkerSet")
    outcome = world.reconcile()
    assert outcome.error and "does not serve LeaderWorkerSet" in outcome.error
    assert [w for w in world.kube.writes if w[0] != "patch_status"] == []
    ready = world.condition("Ready")
    assert ready["status"] == "False" and ready["reason"] == "ApplyFailed", ready
    assert "does not serve LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)" in ready["message"]


def test_a_group_still_forming_on_a_new_servers_first_pass_starts_no_rollout(runtime: Runtime) -> None:
    """LWS makes a group's leader first and its workers after it (startupPolicy LeaderCreated). A first pass slow
    enough to find a leader LWS already made from the template it just applied (no worker yet) took that group for
    one at another target and started a rollout at creation: the leader was drained from the router and its warm
    check, on an empty cache, came back cold, so the router never listed it again (the router e2e test's failure
    in a full run: 'the router did not list both leaders within 120 s')."""
    world = Groups(runtime, **{"router.enabled": True})
    apply = world.kube.apply

    def quick_lws(obj: dict) -> dict:
        applied = apply(obj)
        if obj["kind"] == "LeaderWorkerSet":  # LWS creates group 0's leader at once, not ready, no worker yet
            world.pod(0, 0, applied["spec"]["leaderWorkerTemplate"]["leaderTemplate"], ready=False)
        return applied

    world.kube.apply = quick_lws  # type: ignore[method-assign]
    outcome = world.reconcile()
    assert outcome.rollout_actions == 0 and runtime.calls == []  # no canary, no warm check
    restart = world.status()["restart"]
    assert restart["phase"] == "Complete" and not restart.get("inFlight") and not restart.get("pending"), restart
    assert world.partition() == 0
    manifest = world.kube.find("ConfigMap", f"{NAME}-router-workers")["data"]["workers.json"]
    assert [w["id"] for w in json.loads(manifest)["workers"]] == [f"{NAME}-0", f"{NAME}-1"]  # no leader drained
    world.kube.apply = apply  # type: ignore[method-assign]
    lwt = world.lws()["spec"]["leaderWorkerTemplate"]
    world.pod(0, 0, lwt["leaderTemplate"])  # group 0 forms: its leader ready, then its worker
    world.pod(0, 1, lwt["workerTemplate"])
    world.controller()  # group 1
    world.reconcile(1)
    assert world.status()["restart"]["phase"] == "Complete" and world.status()["replicasSummary"] == "2/2"


def test_a_group_rollout_drains_each_leader_from_the_router_before_its_group_goes_down(runtime: Runtime) -> None:
    """The single-node rollout's router seam, for groups: a group's leader leaves the router's worker list after
    its canary, the partition is lowered past the group only once no router routes to it any more, and the leader
    is listed again after its warm check. The router stand-in follows the manifest one pass late."""
    world = Groups(runtime, **{"router.enabled": True})
    world.reconcile()
    world.controller()
    world.router_pod()

    def manifest() -> set[str]:
        text = world.kube.find("ConfigMap", f"{NAME}-router-workers")["data"]["workers.json"]
        return {w["id"] for w in json.loads(text)["workers"]}

    runtime.routes = dict.fromkeys(LEADERS, "ready")
    world.reconcile(1)
    assert manifest() == LEADERS
    world.edit(restart="r1")
    lowered: list[tuple[int, set[str]]] = []  # (partition, what the router routed to when the pass lowered it)
    for minute in range(2, 30):
        routed, before = set(runtime.routes), world.partition()
        world.reconcile(minute)
        if world.partition() < before:
            lowered.append((world.partition(), routed))
        world.controller()
        runtime.routes = dict.fromkeys(manifest(), "ready")  # the router reads the new manifest after the pass
        if world.status()["restart"]["phase"] == "Complete":
            break
    rs = world.status()["restart"]
    assert rs["phase"] == "Complete" and [r["pod"] for r in rs["results"]] == [f"{NAME}-1", f"{NAME}-0"], rs
    assert all(r["warm"] for r in rs["results"])
    # Group 1 went down only after the router stopped routing to its leader, then group 0 likewise.
    assert lowered == [(1, {f"{NAME}-0"}), (0, {f"{NAME}-1"})], lowered
    assert manifest() == LEADERS and world.status()["router"]["drained"] == []
