"""The LeaderWorkerSet of a multi-node server (render_lws): leader and worker templates, claims, rollout knobs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from qwen_hicache import podlifecycle, render, render_lws, rollout
from qwen_hicache.cli import offline_meta
from qwen_hicache.plan import objects, parse_spec, plan
from resources import derived, variant

DOC = variant(**{"spec.nodesPerReplica": 2, "spec.runtime.tensorParallelSize": 4,
                 "spec.hicache.hostMemoryPerRankGB": 16, "spec.replicas": 2,
                 "spec.hicache.disk": {"enabled": True, "size": "1Ti", "retention": "Delete"}})  # fmt: skip


def lws(doc: dict = DOC, partition: int = 0) -> dict:
    d = derived(doc)
    return render_lws.get_leaderworkerset(render.get_statefulset(offline_meta(doc), d), d.spec, partition,
                                          d.allowed_down)


def containers(pod: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])}


def test_one_group_per_replica_one_pod_per_node_recreated_whole() -> None:
    obj = lws()
    spec, lwt = obj["spec"], obj["spec"]["leaderWorkerTemplate"]
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (
        "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "flash-next")
    assert (spec["replicas"], lwt["size"], lwt["restartPolicy"]) == (2, 2, "RecreateGroupOnPodRestart")
    assert spec["startupPolicy"] == "LeaderCreated"  # LeaderReady deadlocks: node 0 is ready only once all joined
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}  # Shared would clash with the Service
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate", "rollingUpdateConfiguration": {
        "maxUnavailable": 1, "maxSurge": 0, "partition": 0}}
    assert lws(partition=7)["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] == 2


def test_every_pod_gets_its_ranks_gpus_the_group_flags_and_its_own_retained_claim() -> None:
    lwt = lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        sglang = containers(lwt[role])["sglang"]
        assert sglang["resources"]["limits"]["nvidia.com/gpu"] == "2"  # 4 ranks over 2 nodes
        assert sglang["args"][-6:] == ["--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)",
                                       "--dist-init-addr", "$(LWS_LEADER_ADDRESS):20000"]  # fmt: skip
        assert "--tp-size" in sglang["args"] and sglang["args"][sglang["args"].index("--tp-size") + 1] == "4"
        assert {"cache-guard", "cache-usage"} <= set(containers(lwt[role]))
    claim = lwt["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == render.CACHE_VOLUME  # hicache-<server>-<group>[-<node>]
    # retention: Delete must not reach LWS: it deletes a group's worker StatefulSet at every group recreation
    assert lwt["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_only_the_leader_serves_drains_and_flushes() -> None:
    lwt = lws()["spec"]["leaderWorkerTemplate"]
    leader, worker = containers(lwt["leaderTemplate"])["sglang"], containers(lwt["workerTemplate"])["sglang"]
    assert leader["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "preStop" in leader["lifecycle"]
    assert {p["name"]: p["containerPort"] for p in leader["ports"]} == {"http": 30000, "dist-init": 20000}
    assert "lifecycle" not in worker  # nodes > 0 ignore SIGTERM; node 0's ShutdownReq drains their queues
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert worker[probe]["httpGet"]["path"] == "/health"  # the dummy health server has no /ready
    assert lwt["workerTemplate"]["spec"]["terminationGracePeriodSeconds"] == (
        lwt["leaderTemplate"]["spec"]["terminationGracePeriodSeconds"])


def test_a_server_with_one_node_keeps_its_statefulset() -> None:
    """render_lws is only for nodesPerReplica > 1; one node renders what it always did (goldens unchanged)."""
    spec = parse_spec(variant(**{"spec.nodesPerReplica": 1})["spec"])
    assert spec.nodes == 1 and render_lws.gpus_per_pod(spec) == spec.runtime.tensor_parallel_size


def test_templates_validate_as_core_pod_templates() -> None:
    lwt = lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        body = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": lwt[role]}
        kubernetes_validate.validate(body, "1.35", strict=True)


@pytest.mark.parametrize("script", ["leader", "worker"])
def test_cache_guard_makes_the_directory_and_the_worker_one_sweeps_partial_pages(tmp_path: Path,
                                                                                script: str) -> None:
    lwt = lws()["spec"]["leaderWorkerTemplate"]
    guard = containers(lwt[f"{script}Template"])["cache-guard"]
    assert guard["command"][2] == (render_lws.WORKER_GUARD_SCRIPT if script == "worker" else podlifecycle.GUARD_SCRIPT)
    (tmp_path / "v1-x").mkdir()
    stale = tmp_path / "v1-x" / ".abc.tmp"
    stale.write_text("half a page")
    env = {"QWEN_HICACHE_CACHE_ROOT": str(tmp_path), "QWEN_HICACHE_FINGERPRINT": "v1-x", "QWEN_HICACHE_KEEP_OLD": "1",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    out = subprocess.run(guard["command"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "v1-x" / podlifecycle.MARKER).exists()
    assert stale.exists() == (script == "leader")  # the runtime sweeps on TP rank 0, the leader's node
    fresh = tmp_path / "v1-y"
    env["QWEN_HICACHE_FINGERPRINT"] = "v1-y"
    assert subprocess.run(guard["command"], env=env, capture_output=True, timeout=30).returncode == 0
    assert fresh.is_dir()  # a worker's fresh volume gets its directory, which the runtime would never create


def test_services_budget_and_router_reach_group_leaders_only() -> None:
    doc = variant(**{"spec.nodesPerReplica": 2, "spec.runtime.tensorParallelSize": 4,
                     "spec.hicache.hostMemoryPerRankGB": 16, "spec.router": {"enabled": True}})  # fmt: skip
    objs = {(o["kind"], o["metadata"]["name"]): o for o in objects(plan(offline_meta(doc), doc["spec"]))}
    leaders = render_lws.leader_selector("flash-next")
    assert ("StatefulSet", "flash-next") not in objs and ("LeaderWorkerSet", "flash-next") in objs
    assert objs[("Service", "flash-next-headless")]["spec"]["selector"] == leaders
    assert objs[("PodDisruptionBudget", "flash-next")]["spec"]["selector"] == {"matchLabels": leaders}
    assert objs[("Service", "flash-next")]["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    workers = json.loads(objs[("ConfigMap", "flash-next-router-workers")]["data"]["workers.json"])["workers"]
    assert [w["url"] for w in workers] == [
        f"http://{render_lws.group_dns_name('flash-next', 'default', g)}:30000" for g in range(2)]


def test_the_partition_is_restamped_and_clamped() -> None:
    obj = render.render_all(offline_meta(DOC), derived(DOC))[2]
    held = render_lws.with_partition(obj, 9)
    assert render_lws.partition_in(held) == 2 and render_lws.partition_in(obj) == 0
    assert held["metadata"]["annotations"] != obj["metadata"]["annotations"]  # the hash covers the partition
    assert render_lws.with_partition(held, 0) == obj
    assert render_lws.template_target(obj) == rollout.target_of(parse_spec(DOC["spec"]))
