"""Pure builder of the LeaderWorkerSet a multi-node server runs (`nodesPerReplica > 1`; one node keeps the
StatefulSet of `render`, unchanged). It is built from that StatefulSet (its metadata, pod template and claim
templates), so it needs nothing `render` derives and `render` picks the form.

One LWS group per replica, one pod per node: the leader (node 0) is today's server pod, and its workers run the
same runtime arguments on the other nodes' GPUs. What the runtime and LWS v0.9 decide here (multinode-lws notes):

- `--nnodes N --node-rank $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):<distInitPort>` on every
  pod; the LWS pod webhook sets the variables.
- Only node 0 runs the HTTP API: the leader keeps the `/ready` probe, the preStop drain and flush (its SIGTERM
  broadcasts the runtime's ShutdownReq, which drains every rank's queue); nodes > 0 serve only `/health`, so
  workers probe that and have no preStop (they ignore SIGTERM).
- Every pod runs `cache-guard`: the runtime creates the cache directory on TP rank 0 only, so on a worker's own
  volume every write would fail without it; on workers it also sweeps stale `.tmp` files (the runtime's sweep runs
  on rank 0 only).
- One claim per pod from the claim template (`hicache-<server>-<group>` for leaders, `...-<group>-<node>` for
  workers), always Retain/Retain: LWS deletes a group's worker StatefulSet whenever the group is recreated, and a
  `whenDeleted: Delete` policy would delete the workers' caches with it. `retention: Delete` is the operator's.
- `RecreateGroupOnPodRestart` (a TP group cannot survive a member's restart), `startupPolicy: LeaderCreated`
  (`LeaderReady` deadlocks: the leader's API is ready only once every rank joined), `maxSurge: 0` (a surge group
  would start on fresh, cold claims), and the partition the operator holds for its group-by-group rollout.
- `subdomainPolicy: UniquePerReplica`: with `Shared`, LWS names its headless Service after the LWS, which is the
  server's client Service here; it then creates none, and no pod could resolve its leader.
"""

from __future__ import annotations

import copy
from typing import Any

from . import podlifecycle, render_router
from .constants import (  # noqa: F401 - re-exported
    GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    WORKER_INDEX_LABEL,
    pod_script,
    selector,
)
from .drift import HASH_ANNOTATION, with_hash
from .rollout import CONFIG_HASH_ANNOTATION, RESTART_ANNOTATION, target
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
DEFAULT_DIST_INIT_PORT = 20000
WORKER_SWEEP = pod_script("worker_sweep.sh")
WORKER_GUARD_SCRIPT = podlifecycle.GUARD_SCRIPT + WORKER_SWEEP


def dist_init_port(spec: QwenHiCacheServerSpec) -> int:
    return spec.runtime.dist_init_port or DEFAULT_DIST_INIT_PORT


def group_args(spec: QwenHiCacheServerSpec) -> list[str]:
    """The runtime's multi-node flags, the same on every pod of a group (LWS sets the variables)."""
    return ["--nnodes", str(spec.nodes), "--node-rank", "$(LWS_WORKER_INDEX)",
            "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{dist_init_port(spec)}"]  # fmt: skip


def gpus_per_pod(spec: QwenHiCacheServerSpec) -> int:
    return spec.runtime.tensor_parallel_size // spec.nodes


def leader_selector(name: str) -> dict[str, str]:
    """The serving pods of a multi-node server: its group leaders (the PDB, Services and router select these)."""
    return {**selector(name), WORKER_INDEX_LABEL: "0"}


def _runtime(pod: Obj) -> Obj:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "sglang")


def _leader(template: Obj, spec: QwenHiCacheServerSpec) -> Obj:
    leader = copy.deepcopy(template)
    container = _runtime(leader)
    container["args"] = [*container["args"], *group_args(spec)]
    gpus = str(gpus_per_pod(spec))
    for kind in ("requests", "limits"):
        container["resources"][kind][spec.runtime.gpu_resource_name] = gpus
    container["ports"].append({"name": "dist-init", "containerPort": dist_init_port(spec), "protocol": "TCP"})
    for usage in (c for c in leader["spec"]["containers"] if c["name"] == "cache-usage"):
        usage["env"] += _node_ranks_env(spec)
    return leader


def _node_ranks_env(spec: QwenHiCacheServerSpec) -> list[Obj]:
    """The cache-usage sidecar counts and caps only this node's ranks: its volume holds no other shard."""
    index = f"metadata.labels['{WORKER_INDEX_LABEL}']"
    return [{"name": "QWEN_HICACHE_RANKS_PER_POD", "value": str(gpus_per_pod(spec))},
            {"name": "QWEN_HICACHE_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}}]  # fmt: skip


def _worker(leader: Obj) -> Obj:
    worker = copy.deepcopy(leader)
    container = _runtime(worker)
    container.pop("lifecycle", None)  # no API, and it ignores SIGTERM: node 0's shutdown drains its ranks
    container["ports"] = [p for p in container["ports"] if p["name"] != "dist-init"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[probe]["httpGet"]["path"] = "/health"  # the runtime's dummy health server on nodes > 0
    for init in worker["spec"].get("initContainers") or []:
        if init["name"] == "cache-guard":
            init["command"] = ["sh", "-c", WORKER_GUARD_SCRIPT]
    return worker


def get_leaderworkerset(sts: Obj, spec: QwenHiCacheServerSpec, partition: int, down: int) -> Obj:
    """The server's LeaderWorkerSet in place of its StatefulSet `sts` (`render.get_statefulset`); `partition`:
    groups below it keep their revision (the operator lowers it group by group, from the highest index down);
    `down`: groups that may be down at once (derive.Derived.allowed_down)."""
    leader = _leader(sts["spec"]["template"], spec)
    lwt: Obj = {
        "size": spec.nodes,
        "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": leader,
        "workerTemplate": _worker(leader),
    }
    if claims := sts["spec"].get("volumeClaimTemplates"):
        lwt["volumeClaimTemplates"] = claims
        lwt["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain", "whenScaled": "Retain"}
    rolling = {"maxUnavailable": down, "maxSurge": 0,
               "partition": max(0, min(partition, spec.replicas))}  # fmt: skip
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": sts["metadata"],
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling},
            "leaderWorkerTemplate": lwt,
        },
    }


def group_dns_name(name: str, namespace: str, group: int) -> str:
    """A group leader's stable DNS name under UniquePerReplica (what LWS_LEADER_ADDRESS holds, fully qualified)."""
    return render_router.worker_host(name, namespace, group, nodes=2)


def in_groups(objects: list[Obj], spec: QwenHiCacheServerSpec, name: str, down: int) -> list[Obj]:
    """A single-node server's objects (`render.unstamped`) as a multi-node server's: the LeaderWorkerSet in the
    StatefulSet's place, and the Services and the PodDisruptionBudget select group leaders only (workers serve no
    API). A client Service the router took over keeps the router's selector."""
    out = []
    for obj in objects:
        if obj["kind"] == "StatefulSet":
            obj = get_leaderworkerset(obj, spec, 0, down)
        elif obj["kind"] == "PodDisruptionBudget":
            obj["spec"]["selector"] = {"matchLabels": leader_selector(name)}
        elif obj["kind"] == "Service" and obj["spec"]["selector"] == selector(name):
            obj["spec"]["selector"] = leader_selector(name)
        out.append(obj)
    return out


def partition_in(lws: Obj) -> int:
    """The partition an LWS holds (0 when unset: every group at the current revision)."""
    rolling = ((lws.get("spec") or {}).get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
    return int(rolling.get("partition") or 0)


def template_target(lws: Obj) -> str:
    """The rollout target the LWS's leader template carries (what its new groups will run)."""
    leader = ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    ann = (leader.get("metadata") or {}).get("annotations") or {}
    return target(ann.get(CONFIG_HASH_ANNOTATION, ""), ann.get(RESTART_ANNOTATION))


def with_partition(lws: Obj, partition: int) -> Obj:
    """The desired LWS holding another partition, stamped again (the hash covers the partition)."""
    obj = copy.deepcopy(lws)
    obj["metadata"]["annotations"] = {k: v for k, v in (obj["metadata"].get("annotations") or {}).items()
                                      if k != HASH_ANNOTATION}  # fmt: skip
    if not obj["metadata"]["annotations"]:
        del obj["metadata"]["annotations"]
    rolling = obj["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    rolling["partition"] = max(0, min(partition, obj["spec"]["replicas"]))
    return with_hash(obj)
