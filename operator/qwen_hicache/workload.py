"""The serving workload's manager: the one child kind that runs the pods (LWS's "one manager per child kind").

`ServingSet` manages a StatefulSet of one pod per replica. The reconciler asks the manager of the spec's
workload for the four things that depend on the kind: the desired object in the plan, the change of a
template the API server cannot change in place (the StatefulSet's volume claim templates: `disk_step`), the
units the rollout restarts (`views`: pods here, whole groups for a LeaderWorkerSet), and how one unit is taken
down (`release`: an eviction here, a lower partition for a LeaderWorkerSet). A second kind is one more class
with the same methods, picked by `manager_for`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from . import disk_change, gather, policies, rollout
from .gather import Live
from .kube import API_ERRORS, KubeClient
from .plan import Plan
from .status_model import Restart

Obj = dict[str, Any]
EventSink = Any
"""post_event(body, type, reason, message)."""


class Workload(Protocol):
    """What the reconciler needs from the manager of the serving workload's kind."""

    kind: str

    def desired(self, p: Plan) -> Obj | None: ...
    def disk_step(self, kube: KubeClient, live: Live, body: Obj, p: Plan, claims: list[Obj], post_event: EventSink,
                  applied: list[str]) -> Plan: ...  # fmt: skip
    def views(self, pods: list[Obj]) -> list[rollout.PodView]: ...
    def release(self, kube: KubeClient, meta: Obj, p: Plan, rs: Restart, act: rollout.Action) -> bool: ...


class ServingSet:
    """A StatefulSet (`OnDelete`, one pod and one cache claim per replica), named like the server."""

    kind = "StatefulSet"

    def desired(self, p: Plan) -> Obj | None:
        name = p.meta.get("name")
        return next((o for o in p.children if o["kind"] == self.kind and o["metadata"]["name"] == name), None)

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
            return _refused(p, policies.Problem(change.reason, change.message))
        if change.kind == "grow" and (why := _expand_claims(kube, meta, claims, change.size or "")):
            return _refused(p, policies.Problem("DiskExpansionRefused", why))
        if kube.delete_orphaning("apps/v1", self.kind, meta["namespace"], meta["name"], current["metadata"]["uid"]):
            applied.append(f"{self.kind}/{meta['name']} (deleted, pods orphaned)")
            post_event(body, "Normal", change.reason, change.message)
        return later

    def views(self, pods: list[Obj]) -> list[rollout.PodView]:
        return [rollout.PodView.from_pod(pod) for pod in pods]

    def release(self, kube: KubeClient, meta: Obj, p: Plan, rs: Restart, act: rollout.Action) -> bool:
        """Evict one old pod, if that still keeps the promise: availability is checked again on pods listed right
        now (another pod may have gone since the plan), and the eviction API applies the server's
        PodDisruptionBudget too. False: not now, a later pass tries again."""
        views = self.views(gather.serving_pods(kube, meta))
        if not rollout.may_take_down(views, act.pod, act.uid, p.spec.replicas, p.derived.policy):
            return False
        return kube.evict_pod(meta["namespace"], act.pod, act.uid) is not None


def _refused(p: Plan, problem: policies.Problem) -> Plan:
    return replace(p, children=[], problems=[problem, *p.problems])


def _expand_claims(kube: KubeClient, meta: Obj, claims: list[Obj], size: str) -> str | None:
    """Expand every cache claim below `size`; the API server's refusal (StorageClass without
    allowVolumeExpansion, an unbound claim) comes back as the reason, nothing half-done is hidden."""
    for name in disk_change.claims_to_expand(gather.cache_claims(claims, meta["name"]), size):
        try:
            kube.resize_claim(meta["namespace"], name, size)
        except API_ERRORS as err:
            detail = getattr(err, "summary", lambda: "")() or getattr(err, "body", "") or str(err)
            return (f"hicache.disk.size grew to {size}, but cache volume {name} cannot be expanded: {detail}; "
                    "use a StorageClass with allowVolumeExpansion: true, or set hicache.disk.size back")
    return None


def manager_for(p: Plan) -> Workload:
    """The manager of the spec's serving workload (a StatefulSet; multi-node groups add theirs here)."""
    return ServingSet()
