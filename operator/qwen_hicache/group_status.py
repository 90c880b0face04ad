"""What `status.groups` says about a multi-node server, one entry per LeaderWorkerSet group. Pure.

Per group: its leader, how many of its nodes (pods) are ready, each node's disk tier (the pod's cache-usage
sidecar, the numbers `replicaCache` shows per pod), and the group's last warm-start result (the canary is replayed
at the leader, and the runtime's hit is the MIN over every rank, so one result speaks for every node).
"""

from __future__ import annotations

from typing import Any

from .group_rollout import groups_of
from .rollout import PodView

Obj = dict[str, Any]
_DISK_KEYS = ("diskUsedBytes", "diskCapBytes", "diskUsedRatio", "diskPageFiles")


def group_entries(name: str, pods: list[Obj], size: int, replicas: int, usage: dict[str, Obj | None],
                  restart: Obj | None) -> list[Obj]:
    """`status.groups`: every desired group, present or not; `usage`: pod name -> its sidecar's numbers."""
    members = groups_of(pods)
    results = {r["pod"]: r for r in (restart or {}).get("results") or []}
    out = []
    for group in range(replicas):
        pods_of = members.get(group, {})
        leader = f"{name}-{group}"
        nodes = []
        for worker in range(size):
            pod = pods_of.get(worker)
            pod_name = leader if worker == 0 else f"{leader}-{worker}"
            view = PodView.from_pod(pod) if pod else None
            numbers = usage.get(pod_name) or {}
            nodes.append({"node": worker, "pod": pod_name, "ready": bool(view and view.available),
                          **{k: numbers[k] for k in _DISK_KEYS if k in numbers}})  # fmt: skip
        entry: Obj = {"group": group, "leader": leader, "readyNodes": sum(n["ready"] for n in nodes),
                      "nodes": nodes}  # fmt: skip
        if leader in results:
            result = results[leader]
            entry["lastRestart"] = {"warm": bool(result.get("warm")), "storageTokens": result.get("storageTokens", 0)}
        out.append(entry)
    return out


def groups_summary(entries: list[Obj], size: int) -> str:
    """`ready groups/desired, nodes per group`, for the one-line summaries."""
    whole = sum(1 for e in entries if e["readyNodes"] == size)
    return f"{whole}/{len(entries)} groups of {size} nodes ready"
