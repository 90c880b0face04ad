"""The cache-aware rolling restart of a multi-node server, group by group, on the pod rollout's state machine.

A LeaderWorkerSet group (leader + workers, one TP group) takes the place of a pod: `group_views()` folds each
group's pods into one `rollout.PodView`, so `rollout.plan_rollout` keeps every promise it keeps for pods (highest
index first, canary before, warm check after, never more than maxUnavailable down and never all, resumable from
`status.restart` after an operator crash, a cold or late group pauses the rollout where it is):

- a group is *available* only when its leader and every worker serve, all at one target (a group half old and
  half new is on its way, not serving);
- its *uid* is its members' uids together, so a group whose members were replaced (any of them) is a new
  incarnation, and one that comes back all at the new target has new pods throughout (an old pod never carries
  the new target);
- the pod rollout's `delete` is the group's *release*: the operator lowers the LWS `partition` to the group's
  index (LWS then recreates exactly the groups at or above it, on the same claims); the partition only ever goes
  down within one rollout, so a replayed step restarts nothing twice.

The canary goes to the leader, and so does the warm check: the runtime MIN-reduces a storage hit over every rank,
so a hit at the leader proves every node's volume served its shard.

LWS issue #998: a deleted worker can be recreated by its StatefulSet before LWS recreates the group, and then
waits alone for a rendezvous that is over. `lone_workers()` finds such groups (a worker created after its
leader turned Ready); the shell deletes the leader (uid precondition), and LWS recreates the whole group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .constants import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL
from .rollout import PodView
from .status_model import Restart

Obj = dict[str, Any]
MIXED = ""
"""The target of a group whose members disagree: never the rollout's, never 'already replaced'."""


def _labels(pod: Obj) -> dict[str, str]:
    return pod["metadata"].get("labels") or {}


def groups_of(pods: list[Obj]) -> dict[int, dict[int, Obj]]:
    """Pods by group index, then worker index (0 = leader); pods without LWS index labels are left out."""
    out: dict[int, dict[int, Obj]] = {}
    for pod in pods:
        labels = _labels(pod)
        group, worker = labels.get(GROUP_INDEX_LABEL), labels.get(WORKER_INDEX_LABEL)
        if group is not None and worker is not None and group.isdigit() and worker.isdigit():
            out.setdefault(int(group), {})[int(worker)] = pod
    return out


def group_view(name: str, group: int, members: dict[int, Obj], size: int) -> PodView:
    """One group as the rollout sees it (see the module docstring)."""
    views = {w: PodView.from_pod(p) for w, p in members.items()}
    leader = views.get(0)
    targets = {v.target for v in views.values()}
    complete = len(views) == size and all(w in views for w in range(size))
    same = len(targets) == 1
    return PodView(
        name=f"{name}-{group}",
        ordinal=group,
        uid="|".join(views[w].uid if w in views else "-" for w in range(size)),
        ready=complete and same and all(v.ready for v in views.values()),
        ip=leader.ip if leader else None,
        target=targets.pop() if same and complete else MIXED,
        fingerprint=leader.fingerprint if leader else "",
        terminating=any(v.terminating for v in views.values()),
    )


def forming(members: dict[int, Obj], size: int, target: str) -> bool:
    """A group LWS is still creating from the template at `target`: not every member there yet (the leader comes
    first, the workers after it), and each one there made at that target."""
    targets = {PodView.from_pod(p).target for p in members.values()}
    return bool(members) and len(members) < size and targets == {target}


def group_views(name: str, pods: list[Obj], size: int, replicas: int = 0, forming_at: str | None = None
                ) -> list[PodView]:  # fmt: skip
    """A view per group with pods, and (`replicas`) per desired group with none right now: such a group is down,
    at no target, and a rollout that starts now plans it in its turn. Left out of the plan, it would come back
    (LWS recreating it at the held partition, on the old revision) behind a partition already lowered past it,
    and LWS would restart it at once beside the group being rolled: two groups down, no canary, no warm check.

    `forming_at` (a server with no rollout record yet, so its first pass): groups still forming at that target are
    left out. Their view is at no target (`MIXED`: not complete), which would start a rollout at creation: the
    leader drained from the router, then a warm check on an empty cache, cold, and the leader never listed again."""
    members = groups_of(pods)
    wanted = sorted(set(members) | set(range(replicas)))
    return [group_view(name, g, members.get(g, {}), size) for g in wanted
            if forming_at is None or not forming(members.get(g, {}), size, forming_at)]


def group_index(group_name: str) -> int:
    return int(group_name.rsplit("-", 1)[-1])


def partition_of(rs: Restart | None, replicas: int) -> int:
    """The LWS partition the operator holds: groups below it keep their revision.

    No rollout, or a finished one: 0 (every group at the current revision). A rollout in progress: the lowest
    group it released, else `replicas` (a new template is applied with nothing released)."""
    if not rs or rs.phase == "Complete":
        return 0
    return max(0, min(replicas if rs.partition is None else rs.partition, replicas))


def released(rs: Restart, group_name: str, replicas: int) -> Restart:
    """Record that the group is released: the partition goes down to its index (never up)."""
    return rs.model_copy(deep=True, update={"partition": min(partition_of(rs, replicas), group_index(group_name))})


@dataclass(frozen=True)
class LoneWorker:
    """A group whose worker came back without it (LWS #998): the leader to delete so LWS recreates the group."""

    group: int
    leader: str
    leader_uid: str
    worker: str


def _time(value: str | None) -> datetime | None:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ") if value else None


def _ready_since(pod: Obj) -> datetime | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return _time(cond.get("lastTransitionTime"))
    return None


def lone_workers(pods: list[Obj]) -> list[LoneWorker]:
    """Groups with a worker created after its leader turned Ready: the leader turns Ready only once every rank
    joined, so such a worker was recreated alone and waits for a rendezvous that is over.

    Both times have whole-second precision. A worker created in the very second its leader turned Ready counts
    when it is not Ready itself: a worker of the group as it formed was created, started and joined before the
    leader's readiness probe passed, seconds to minutes earlier (about 10 s on the e2e cluster), while LWS
    #998's worker comes back within a second of its deletion, which can fall in that second (CI, 2026-12-05)."""
    out = []
    for group, members in sorted(groups_of(pods).items()):
        leader = members.get(0)
        if leader is None or leader["metadata"].get("deletionTimestamp"):
            continue
        since = _ready_since(leader)
        for w, pod in sorted(members.items()):
            created = _time(pod["metadata"].get("creationTimestamp"))
            if not (w and since and created) or pod["metadata"].get("deletionTimestamp"):
                continue
            if created > since or (created == since and _ready_since(pod) is None):
                out.append(LoneWorker(group, leader["metadata"]["name"], leader["metadata"]["uid"],
                                      pod["metadata"]["name"]))  # fmt: skip
                break
    return out
