"""What `status.groups` says about a multi-node server, one entry per LeaderWorkerSet group. Pure.

Per group: its leader, how many of its nodes (pods) are ready, each node's disk tier (the pod's cache-usage
sidecar, the numbers `replicaCache` shows per pod), and the group's last warm-start result (the canary is replayed
at the leader, and the runtime's hit is the MIN over every rank, so one result speaks for every node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import status_model as sm
from .diskusage import DiskUsage
from .group_rollout import groups_of
from .rollout import PodView

Obj = dict[str, Any]


def group_entries(name: str, pods: list[Obj], size: int, replicas: int, usage: Mapping[str, DiskUsage | None],
                  restart: sm.Restart | None) -> tuple[sm.GroupStatus, ...]:
    """`status.groups`: every desired group, present or not; `usage`: pod name -> its sidecar's numbers."""
    members = groups_of(pods)
    results = {r.pod: r for r in restart.results} if restart else {}
    out = []
    for group in range(replicas):
        leader = f"{name}-{group}"
        nodes = [_node(leader, worker, members.get(group, {}).get(worker), usage) for worker in range(size)]
        result = results.get(leader)
        last = sm.GroupRestart(warm=result.warm, storage_tokens=result.storage_tokens) if result else None
        out.append(sm.GroupStatus(group=group, leader=leader, ready_nodes=sum(n.ready for n in nodes), nodes=nodes,
                                  last_restart=last))
    return tuple(out)


def _node(leader: str, worker: int, pod: Obj | None, usage: Mapping[str, DiskUsage | None]) -> sm.GroupNode:
    """One node of a group: ready or not, and its own volume's numbers when its sidecar answered."""
    pod_name = leader if worker == 0 else f"{leader}-{worker}"
    view = PodView.from_pod(pod) if pod else None
    u = usage.get(pod_name)
    disk = {} if u is None else {"disk_used_bytes": u.used_bytes, "disk_cap_bytes": u.cap_bytes,
                                 "disk_used_ratio": u.used_ratio, "disk_page_files": u.page_files}
    return sm.GroupNode(node=worker, pod=pod_name, ready=bool(view and view.available), **disk)


def groups_summary(entries: tuple[sm.GroupStatus, ...], size: int) -> str:
    """`ready groups/desired, nodes per group`, for the one-line summaries."""
    whole = sum(1 for e in entries if e.ready_nodes == size)
    return f"{whole}/{len(entries)} groups of {size} nodes ready"
