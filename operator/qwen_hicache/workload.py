"""The serving workload's manager: the one child kind that runs the pods (LWS's "one manager per child kind").

`ServingSet` manages a StatefulSet of one pod per replica; `GroupSet` a LeaderWorkerSet of one group of
`nodesPerReplica` pods per replica (docs/multinode.md). The reconciler asks the manager of the spec's workload
for what depends on the kind: the desired object in the plan, the step before apply (`disk_step`: the
StatefulSet's volume claim templates the API server cannot change in place; for groups also the partition the
rollout holds and the claims' owner), the units the rollout restarts (`views`: pods, or whole groups), how one
unit is taken down (`release`: an eviction, or a lower partition), the repair of a broken unit (`repair`) and
what `status.groups` says. `manager_for` picks the class.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from . import disk_change, gather, group_rollout, group_status, render_lws, rollout
from . import status_model as sm
from .apply import apply_if_drifted
from .conditions import Problem
from .constants import owner_reference
from .diskusage import DiskUsage
from .drift import is_subset
from .gather import Live
from .kube import API_ERRORS, KubeClient
from .plan_model import Plan
from .status_model import Restart
from .units import binary

Obj = dict[str, Any]
EventSink = Any
"""post_event(body, type, reason, message)."""
LONE_WORKER = "LoneWorker"
"""The event reason of a group's leader evicted because a worker came back without its group."""


class Workload(Protocol):
    """What the reconciler needs from the manager of the serving workload's kind."""

    kind: str
    api_version: str

    def desired(self, p: Plan) -> Obj | None: ...
    def claims(self, kube: KubeClient, meta: Obj) -> list[Obj]: ...
    def disk_step(self, kube: KubeClient, live: Live, body: Obj, p: Plan, claims: list[Obj], post_event: EventSink,
                  applied: list[str]) -> Plan: ...  # fmt: skip
    def views(self, pods: list[Obj]) -> list[rollout.PodView]: ...
    def release(self, kube: KubeClient, live: Live, meta: Obj, p: Plan, rs: Restart,
                act: rollout.Action) -> Restart | None: ...  # fmt: skip
    def repair(self, kube: KubeClient, body: Obj, pods: list[Obj], post_event: EventSink,
               applied: list[str]) -> None: ...  # fmt: skip
    def groups(self, pods: list[Obj], usage: tuple[tuple[str, DiskUsage | None], ...],
               restart: Restart | None) -> tuple[sm.GroupStatus, ...] | None: ...  # fmt: skip


Usage = tuple[tuple[str, DiskUsage | None], ...]


class ServingSet:
    """A StatefulSet (`OnDelete`, one pod and one cache claim per replica), named like the server."""

    kind = "StatefulSet"
    api_version = "apps/v1"

    def desired(self, p: Plan) -> Obj | None:
        name = p.meta.get("name")
        return next((o for o in p.children if o["kind"] == self.kind and o["metadata"]["name"] == name), None)

    def claims(self, kube: KubeClient, meta: Obj) -> list[Obj]:
        """The set's volume claims (labelled like its pods)."""
        return gather.claims(kube, meta)

    def disk_step(self, kube: KubeClient, live: Live, body: Obj, p: Plan, claims: list[Obj], post_event: EventSink,
                  applied: list[str]) -> Plan:  # fmt: skip
        """A changed disk tier as a real operation (see disk_change): expand claims, re-create the StatefulSet
        without its pods, or refuse with the reason. The new set is applied once the old one is gone."""
        meta = body["metadata"]
        desired = self.desired(p)
        if desired is None:
            return p
        current = live.get((self.kind, meta["name"]))
        later = replace(p, children=[o for o in p.children if o is not desired])
        if current is not None and current["metadata"].get("deletionTimestamp"):
            return later  # being orphaned: its deletion event triggers the reconcile that applies the new set
        change = disk_change.classify(current, desired)
        if change.kind == "none":
            return p
        if change.refused:
            return _refused(p, Problem(change.reason, change.message))
        if change.kind == "grow" and (why := _expand_claims(kube, meta, claims, change.size or "")):
            return _refused(p, Problem("DiskExpansionRefused", why))
        if kube.delete_orphaning("apps/v1", self.kind, meta["namespace"], meta["name"], current["metadata"]["uid"]):
            applied.append(f"{self.kind}/{meta['name']} (deleted, pods orphaned)")
            post_event(body, "Normal", change.reason, change.message)
        return later

    def views(self, pods: list[Obj]) -> list[rollout.PodView]:
        return [rollout.PodView.from_pod(pod) for pod in pods]

    def release(self, kube: KubeClient, live: Live, meta: Obj, p: Plan, rs: Restart,
                act: rollout.Action) -> Restart | None:  # fmt: skip
        """Evict one old pod, if that still keeps the promise: availability is checked again on pods listed right
        now (another pod may have gone since the plan), and the eviction API applies the server's
        PodDisruptionBudget too. None: not now, a later pass tries again."""
        views = self.views(gather.serving_pods(kube, meta))
        if not rollout.may_take_down(views, act.pod, act.uid, p.spec.replicas, p.derived.policy):
            return None
        return rs if kube.evict_pod(meta["namespace"], act.pod, act.uid) is not None else None

    def repair(self, kube: KubeClient, body: Obj, pods: list[Obj], post_event: EventSink,
               applied: list[str]) -> None:  # fmt: skip
        """Nothing: the StatefulSet recreates a lost pod by itself."""

    def groups(self, pods: list[Obj], usage: Usage, restart: Restart | None) -> tuple[sm.GroupStatus, ...] | None:
        return None


class GroupSet:
    """A LeaderWorkerSet (render_lws): one group of `nodesPerReplica` pods per replica, each pod with its own
    cache claim; the operator holds the partition and rolls group by group (group_rollout)."""

    kind = render_lws.LWS_KIND
    api_version = render_lws.LWS_API_VERSION

    def __init__(self, name: str, size: int, replicas: int, restart: Restart | None, target: str = "") -> None:
        self.name, self.size, self.replicas, self.restart, self.target = name, size, replicas, restart, target

    def desired(self, p: Plan) -> Obj | None:
        return next((o for o in p.children if o["kind"] == self.kind and o["metadata"]["name"] == self.name), None)

    def claims(self, kube: KubeClient, meta: Obj) -> list[Obj]:
        """The groups' volume claims: LWS's StatefulSets label them with the LWS's name and indexes only, never
        with the claim template's labels (measured on LWS v0.9.0), so they are listed by the LWS name."""
        return kube.list("v1", "PersistentVolumeClaim", meta["namespace"], {render_lws.LWS_NAME_LABEL: self.name})

    def partition(self, current: Obj | None, target: str) -> int:
        """The partition to apply now. The rollout's, once it runs for this target; a template that changes the
        target is applied with every group held (`replicas`) in the same write, else LWS would roll every group
        itself; otherwise what the LWS holds (a crash between that write and the status write lost no step)."""
        if self.restart is not None and self.restart.id == target:
            wanted = group_rollout.partition_of(self.restart, self.replicas)
            if current is not None and render_lws.template_target(current) == target:
                # Never up within a rollout: a release applied just before a crash that lost its status write
                # is kept (raising it would send a group LWS is recreating back to the old revision).
                wanted = min(wanted, render_lws.partition_in(current))
            return wanted
        if current is None:
            return 0
        if render_lws.template_target(current) != target:
            return self.replicas
        return render_lws.partition_in(current)

    def disk_step(self, kube: KubeClient, live: Live, body: Obj, p: Plan, claims: list[Obj], post_event: EventSink,
                  applied: list[str]) -> Plan:  # fmt: skip
        """Before apply: refuse a changed claim template (not supported on groups yet), hold the partition, and
        give each cache claim the server as owner under `retention: Delete` (the LWS keeps claims: Retain)."""
        desired = self.desired(p)
        if desired is None:
            return p
        current = live.get((self.kind, self.name))
        if current is not None and not is_subset(_claim_templates(desired), _claim_templates(current)):
            return _refused(p, Problem("DiskChangeRefused", (
                "hicache.disk (enabled, size or storageClassName) cannot change on a multi-node server yet: a "
                "LeaderWorkerSet's claim templates are fixed; set it back to what runs")))
        if p.spec.hicache.disk.enabled and p.spec.hicache.disk.retention == "Delete":
            _own_claims(kube, body["metadata"], gather.cache_claims(claims, self.name), applied)
        held = render_lws.with_partition(desired, self.partition(current, p.target))
        return replace(p, children=[held if o is desired else o for o in p.children])

    def views(self, pods: list[Obj]) -> list[rollout.PodView]:
        """Every desired group, a missing one as down (group_views), once the server has a rollout record: on
        its first pass a new server's groups are all missing or still forming (LWS was quick: a leader made from
        the template this pass applied, its workers not yet), and that is a creation, not a restart."""
        if self.restart is None:
            return group_rollout.group_views(self.name, pods, self.size, forming_at=self.target)
        return group_rollout.group_views(self.name, pods, self.size, self.replicas)

    def release(self, kube: KubeClient, live: Live, meta: Obj, p: Plan, rs: Restart,
                act: rollout.Action) -> Restart | None:  # fmt: skip
        """Lower the partition to the group's index (LWS then recreates that group on its claims), if taking it
        down still keeps the promise on groups listed right now. The partition only goes down within a rollout,
        so a replayed release restarts nothing twice."""
        views = self.views(gather.serving_pods(kube, meta))
        if not rollout.may_take_down(views, act.pod, act.uid, p.spec.replicas, p.derived.policy):
            return None
        desired = self.desired(p)
        if desired is None:
            return None
        rs = group_rollout.released(rs, act.pod, self.replicas)
        apply_if_drifted(kube, live, render_lws.with_partition(desired, group_rollout.partition_of(rs, self.replicas)))
        return rs

    def repair(self, kube: KubeClient, body: Obj, pods: list[Obj], post_event: EventSink,
               applied: list[str]) -> None:  # fmt: skip
        """A worker recreated without its group (LWS #998) waits for a rendezvous that is over: evict its leader
        (uid precondition, so only that incarnation; the budget applies) and LWS recreates the whole group. The
        eviction propagates in the foreground, as LWS's own group delete does: the leader's name stays taken
        until its worker StatefulSet and the lone worker are gone, so no new leader starts under it while the
        lone worker (a non-zero rank ignores SIGTERM and lives out its grace period) could still join it (seen
        on the real control plane with background propagation: the new group formed with the dying worker and
        broke when it was killed). Each eviction is said in a `LoneWorker` event on the server."""
        for lone in group_rollout.lone_workers(pods):
            if kube.evict_pod(body["metadata"]["namespace"], lone.leader, lone.leader_uid, dependents_first=True):
                applied.append(f"Pod/{lone.leader} (evicted: worker {lone.worker} came back without its group)")
                post_event(body, "Warning", LONE_WORKER, (
                    f"group {lone.group}: worker {lone.worker} was recreated without its group and waits for a "
                    f"rendezvous that is over (LeaderWorkerSet issue #998); evicted its leader {lone.leader} "
                    f"(uid {lone.leader_uid}) so LeaderWorkerSet recreates the whole group"))

    def groups(self, pods: list[Obj], usage: Usage, restart: Restart | None) -> tuple[sm.GroupStatus, ...]:
        return group_status.group_entries(self.name, pods, self.size, self.replicas, dict(usage), restart)


def _claim_templates(lws: Obj) -> list[Obj]:
    return ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("volumeClaimTemplates") or []


def _own_claims(kube: KubeClient, meta: Obj, claims: list[Obj], applied: list[str]) -> None:
    """An owner reference to the server on each cache claim that lacks one, so the garbage collector deletes them
    with the server (not a controller reference: a claim has at most one controller, and the operator is not it)."""
    owner = {**owner_reference(meta), "controller": False, "blockOwnerDeletion": False}
    for claim in claims:
        refs = claim["metadata"].get("ownerReferences") or []
        if not any(r.get("uid") == owner["uid"] for r in refs):
            kube.set_owners("v1", "PersistentVolumeClaim", meta["namespace"], claim["metadata"]["name"],
                            [*refs, owner])  # fmt: skip
            applied.append(f"PersistentVolumeClaim/{claim['metadata']['name']} (owned: retention Delete)")


def _refused(p: Plan, problem: Problem) -> Plan:
    return replace(p, children=[], problems=[problem, *p.problems])


def _expand_claims(kube: KubeClient, meta: Obj, claims: list[Obj], size: str) -> str | None:
    """Expand every cache claim below `size`; the API server's refusal (StorageClass without
    allowVolumeExpansion, an unbound claim) comes back as the reason, nothing half-done is hidden."""
    for name in disk_change.claims_to_expand(gather.cache_claims(claims, meta["name"]), size):
        try:
            kube.resize_claim(meta["namespace"], name, size)
        except API_ERRORS as err:
            detail = getattr(err, "summary", lambda: "")() or getattr(err, "body", "") or str(err)
            return (f"hicache.disk.size grew to {binary(size)}, but cache volume {name} cannot be expanded: {detail}; "
                    "use a StorageClass with allowVolumeExpansion: true, or set hicache.disk.size back")
    return None


def manager_for(p: Plan, name: str = "", restart: Restart | None = None) -> Workload:
    """The manager of the spec's serving workload: a StatefulSet, or LeaderWorkerSet groups across nodes (also
    while a change is refused: readiness is the running groups'); `restart`: the rollout as last recorded (a
    group's partition follows it)."""
    if p.spec is not None and p.spec.nodes > 1:
        return GroupSet(name or p.meta.get("name", ""), p.spec.nodes, p.spec.replicas, restart, p.target)
    return ServingSet()
