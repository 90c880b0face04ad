"""Derive `status` from the plan and the observed workload. Pure: the clock is passed in.

Conditions:
- `SpecValid` / `SizingValid`: the spec can be served as written (else nothing is applied).
- `CachePersistent`: pages reach the disk tier, so a restart can warm-start.
- `Ready`: every desired replica is ready. `Progressing`: the workload is converging.
- `Degraded`: something needs the admin (invalid spec, failed apply).
"""

from __future__ import annotations

from typing import Any

from .conditions import Condition, merge
from .plan import Plan

Obj = dict[str, Any]


def _validity(plan: Plan) -> list[Condition]:
    out = []
    for ctype, ok_reason in (("SpecValid", "Valid"), ("SizingValid", "Fits")):
        blocking = [p for p in plan.problems if p.blocking and p.condition == ctype]
        if blocking:
            out.append(Condition(ctype, "False", blocking[0].reason, "; ".join(p.message for p in blocking)))
        elif ctype == "SpecValid" or plan.spec is not None:
            out.append(Condition(ctype, "True", ok_reason, "" if ctype == "SpecValid" else "host and disk fit"))
    return out


def _persistence(plan: Plan) -> list[Condition]:
    if plan.spec is None:
        return []
    if not plan.spec.hicache.disk.enabled:
        return [Condition("CachePersistent", "False", "DiskTierDisabled", "hicache.disk.enabled is false")]
    warn = [p for p in plan.problems if p.condition == "CachePersistent"]
    if warn:
        return [Condition("CachePersistent", "False", warn[0].reason, warn[0].message)]
    return [Condition("CachePersistent", "True", "WriteThrough", "pages are written through to the disk tier")]


def _workload(plan: Plan, sts: Obj | None, apply_error: str | None) -> list[Condition]:
    """Ready/Progressing/Degraded from the StatefulSet as observed (or the reason there is none)."""
    if plan.blocked:
        first = next(p for p in plan.problems if p.blocking)
        return [
            Condition("Ready", "False", first.reason, first.message),
            Condition("Progressing", "False", first.reason, "nothing is applied until the spec is fixed"),
            Condition("Degraded", "True", first.reason, first.message),
        ]
    if apply_error:
        return [
            Condition("Ready", "False", "ApplyFailed", apply_error),
            Condition("Progressing", "False", "ApplyFailed", apply_error),
            Condition("Degraded", "True", "ApplyFailed", apply_error),
        ]
    desired = plan.spec.replicas if plan.spec else 0
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
    summary = f"{ready}/{desired} replicas ready"
    healthy = Condition("Degraded", "False", "AsExpected", "")
    if desired == 0:
        return [Condition("Ready", "False", "ScaledToZero", "replicas is 0"),
                Condition("Progressing", "False", "ScaledToZero", summary), healthy]
    if ready >= desired:
        return [Condition("Ready", "True", "AllReplicasReady", summary),
                Condition("Progressing", "False", "AllReplicasReady", summary), healthy]
    return [Condition("Ready", "False", "ReplicasNotReady", summary),
            Condition("Progressing", "True", "WaitingForReplicas", summary), healthy]


def conditions_for(plan: Plan, sts: Obj | None, apply_error: str | None = None) -> list[Condition]:
    """Every condition this reconcile observes."""
    return [*_validity(plan), *_persistence(plan), *_workload(plan, sts, apply_error)]


def build_status(
    plan: Plan, sts: Obj | None, old: Obj | None, generation: int, now: str, apply_error: str | None = None
) -> Obj:
    """The complete new status; identical to `old` when nothing changed (so no write happens)."""
    old = old or {}
    desired = plan.spec.replicas if plan.spec else 0
    sts_status = (sts or {}).get("status") or {}
    ready = int(sts_status.get("readyReplicas") or 0)
    status: Obj = {
        "observedGeneration": generation,
        "replicas": desired,
        "readyReplicas": ready,
        "replicasSummary": f"{ready}/{desired}",
        "conditions": merge(conditions_for(plan, sts, apply_error), old.get("conditions"), generation, now),
    }
    if plan.launch:
        status["launch"] = plan.launch
    if plan.sizing:
        status["sizing"] = plan.sizing
    return without_nulls(status)


def without_nulls(value: Any) -> Any:
    """Drop null members: a merge patch deletes them, so keeping them would make every compare differ."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [without_nulls(v) for v in value]
    return value
