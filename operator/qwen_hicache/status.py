"""Derive `status` from the plan and the observed workload. Pure: the clock is passed in.

Conditions:
- `SpecValid` / `SizingValid`: the spec can be served as written (else nothing is applied).
- `CachePersistent`: pages reach the disk tier, so a restart can warm-start.
- `CacheWarm`: the last verified restart of each pod served the canary from disk.
- `Ready`: every desired replica is ready. `Progressing`: the workload or a rollout is converging.
- `Degraded`: something needs the admin (invalid spec, failed apply, paused rollout, refused cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .conditions import Condition, merge
from .plan import Plan

Obj = dict[str, Any]
CRASH_LOOPING, POD_FAILING = "CrashLooping", "PodFailing"


@dataclass(frozen=True)
class PodProblem:
    """A pod's trouble as Degraded reports it: `reason` is CRASH_LOOPING (a container in CrashLoopBackOff) or
    POD_FAILING (an init container failed, e.g. the cache guard refused a directory)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What this reconcile saw and did, besides the plan."""

    sts: Obj | None = None
    restart: Obj | None = None
    apply_error: str | None = None
    pod_problems: tuple[PodProblem, ...] = ()
    admin_secret: str | None = None
    router: Obj | None = None
    disk_usage: tuple[tuple[str, Obj | None], ...] = ()
    """(pod, its cache-usage sidecar's numbers or None) per running pod; see `replica_cache`."""
    claim_history: tuple[str, ...] = ()
    """Earlier cache namespaces the cache volume claims record, newest first (see claim_history)."""


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


ADVISORY_CONDITIONS = {"ImagePinned": ("Digest", "runtime.image is pinned by digest")}
"""Conditions set False by a non-blocking policy problem (a Warning event), True otherwise."""


def _advisories(plan: Plan) -> list[Condition]:
    if plan.spec is None:
        return []
    out = []
    for ctype, (reason, message) in ADVISORY_CONDITIONS.items():
        warn = [p for p in plan.problems if p.condition == ctype]
        out.append(Condition(ctype, "False", warn[0].reason, warn[0].message) if warn
                   else Condition(ctype, "True", reason, message))
    return out


def _warmth(restart: Obj | None) -> list[Condition]:
    results = (restart or {}).get("results") or []
    if (restart or {}).get("reason") == "ColdStart":
        return [Condition("CacheWarm", "False", "ColdStart", restart["message"])]
    results = [r for r in results if not r.get("newCacheNamespace")]
    if not results:
        return [Condition("CacheWarm", "Unknown", "NotVerified", "no restart on an existing cache verified yet")]
    tokens = sum(r["storageTokens"] for r in results)
    return [Condition("CacheWarm", "True", "WarmStart",
                      f"{len(results)} restarted pod(s) served the canary from disk ({tokens} tokens restored)")]


def _rollout_message(rs: Obj) -> str:
    current = ", ".join(e["pod"] + ":" + e["step"] for e in rs.get("inFlight", []))
    total = len(rs["done"]) + len(rs["pending"]) + len(rs.get("inFlight", []))
    return f"restarting {current or 'next pod'} ({len(rs['done'])}/{total} done)"


def _blocked(plan: Plan, obs: Observed) -> tuple[str, str] | None:
    """The first reason nothing converges, if any."""
    if plan.blocked:
        first = next(p for p in plan.problems if p.blocking)
        return first.reason, first.message
    if obs.apply_error:
        return "ApplyFailed", obs.apply_error
    return None


def _running(obs: Observed) -> tuple[int, int]:
    """(ready, desired) of the StatefulSet that runs, whatever the spec now asks."""
    sts = obs.sts or {}
    return int((sts.get("status") or {}).get("readyReplicas") or 0), int((sts.get("spec") or {}).get("replicas") or 0)


REFUSED_NOTE = "; this change is refused, nothing of it is applied: the previously applied configuration keeps running"


def _refused_while_running(reason: str, message: str, obs: Observed) -> list[Condition]:
    """A refused change of a server that runs: readiness is the running workload's; the refusal is Degraded."""
    ready, desired = _running(obs)
    summary = f"{ready}/{desired} replicas ready (previous configuration)"
    ok = desired > 0 and ready >= desired
    return [Condition("Ready", "True" if ok else "False", "AllReplicasReady" if ok else "ReplicasNotReady", summary),
            Condition("Progressing", "False", reason, "nothing new is applied until the spec is fixed"),
            Condition("Degraded", "True", reason, message + REFUSED_NOTE)]


def _workload(plan: Plan, obs: Observed) -> list[Condition]:
    """Ready/Progressing/Degraded from the StatefulSet, the rollout and the pods."""
    if blocked := _blocked(plan, obs):
        reason, message = blocked
        if plan.blocked and obs.sts:
            return _refused_while_running(reason, message, obs)
        return [Condition("Ready", "False", reason, message),
                Condition("Progressing", "False", reason, "nothing is applied until this is fixed"),
                Condition("Degraded", "True", reason, message)]
    desired = plan.spec.replicas if plan.spec else 0
    ready = int(((obs.sts or {}).get("status") or {}).get("readyReplicas") or 0)
    summary = f"{ready}/{desired} replicas ready"
    rs = obs.restart or {}
    if rs.get("phase") == "Paused":
        degraded = Condition("Degraded", "True", rs["reason"], rs["message"])
    elif obs.pod_problems:
        looping = any(p.reason == CRASH_LOOPING for p in obs.pod_problems)
        degraded = Condition("Degraded", "True", CRASH_LOOPING if looping else POD_FAILING,
                             "; ".join(p.message for p in obs.pod_problems))
    else:
        degraded = Condition("Degraded", "False", "AsExpected", "")
    if rs.get("phase") == "Rolling":
        progressing = Condition("Progressing", "True", "RollingRestart", _rollout_message(rs))
    elif ready < desired:
        progressing = Condition("Progressing", "True", "WaitingForReplicas", summary)
    else:
        progressing = Condition("Progressing", "False", "AllReplicasReady" if desired else "ScaledToZero", summary)
    if desired == 0:
        ready_c = Condition("Ready", "False", "ScaledToZero", "replicas is 0")
    elif ready >= desired:
        ready_c = Condition("Ready", "True", "AllReplicasReady", summary)
    else:
        ready_c = Condition("Ready", "False", "ReplicasNotReady", summary)
    return [ready_c, progressing, degraded]


def conditions_for(plan: Plan, obs: Observed) -> list[Condition]:
    """Every condition this reconcile observes."""
    warm = _warmth(obs.restart) if plan.spec is not None and plan.spec.hicache.disk.enabled else []
    return [*_validity(plan), *_persistence(plan), *_advisories(plan), *warm, *_workload(plan, obs)]


def cache_history(new: Obj, old: Obj | None, keep: int, on_claims: tuple[str, ...] = ()) -> Obj:
    """`status.cache` with the earlier fingerprints still kept on the volumes (newest first): the previous
    status's, then any the claims record (a recreated resource starts from those)."""
    if not new:
        return {}
    old = old or {}
    previous = list(old.get("previousFingerprints") or [])
    if old.get("fingerprint") and old["fingerprint"] != new["fingerprint"]:
        previous.insert(0, old["fingerprint"])
    previous = list(dict.fromkeys(fp for fp in [*previous, *on_claims] if fp != new["fingerprint"]))[:keep]
    return {**new, "previousFingerprints": previous} if previous else dict(new)


def build_status(plan: Plan, obs: Observed, old: Obj | None, generation: int, now: str) -> Obj:
    """The complete new status; identical to `old` when nothing changed (so no write happens)."""
    old = old or {}
    desired = plan.spec.replicas if plan.spec else 0
    ready = int(((obs.sts or {}).get("status") or {}).get("readyReplicas") or 0)
    if plan.blocked:
        ready, desired = _running(obs)
    status: Obj = {
        "observedGeneration": generation,
        "replicas": desired,
        "readyReplicas": ready,
        "replicasSummary": f"{ready}/{desired}",
        "conditions": merge(conditions_for(plan, obs), old.get("conditions"), generation, now),
    }
    status.update({k: v for k, v in _described(plan, obs, old, now).items() if v})
    return without_nulls(status)


def _described(plan: Plan, obs: Observed, old: Obj, now: str) -> Obj:
    """launch/sizing/cache of what runs: the plan's once applied; the last applied ones while a change is refused
    (nothing of a refused spec reaches the cluster, so its sizing would describe pods that do not exist)."""
    common = {"restart": obs.restart, "adminSecret": obs.admin_secret or old.get("adminSecret"), "router": obs.router}
    if plan.blocked:
        kept = ("launch", "sizing", "cache", "replicaCache", "cacheSummary")
        return {**{k: old.get(k) for k in kept}, **common}
    keep = plan.spec.hicache.disk.keep_old_namespaces if plan.spec else 0
    cache = cache_history(plan.cache, old.get("cache"), keep, obs.claim_history)
    return {"launch": plan.launch, "sizing": plan.sizing, "cache": cache, **common,
            **replica_cache(obs.disk_usage, obs.restart, old, now)}


# -- Per-replica cache: disk tier use vs cap, namespace age, last restart's restored tokens -----------------


def _age(since: int, now: str) -> str:
    """A coarse age (changes at most hourly, so the summary does not rewrite status every reconcile)."""
    seconds = max(0, int(datetime.strptime(now, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()) - since)
    return f"{seconds // 86400}d" if seconds >= 86400 else f"{seconds // 3600}h"


def _restored(restart: Obj | None) -> dict[str, int]:
    return {r["pod"]: int(r.get("storageTokens") or 0) for r in (restart or {}).get("results") or []}


def replica_cache(usage: tuple[tuple[str, Obj | None], ...], restart: Obj | None, old: Obj, now: str) -> Obj:
    """`replicaCache` (one entry per pod) and the one-line `cacheSummary` for `kubectl get`.

    Disk numbers come from each pod's cache-usage sidecar (qwen_hicache.diskusage), the same endpoint
    Prometheus scrapes. A pod that does not answer keeps its previous entry, so a slow sidecar does not
    make the status flap; restored tokens are the pod's last verified restart (status.restart.results).
    """
    if not usage:
        return {}
    before = {e["pod"]: e for e in old.get("replicaCache") or []}
    restored = _restored(restart)
    entries = []
    for pod, numbers in usage:
        if not numbers and pod not in before:
            continue  # no sidecar answer yet (or none at all): say nothing rather than guess
        entry = {"pod": pod, **({k: v for k, v in numbers.items() if k != "fingerprint"} if numbers else
                                {k: v for k, v in before.get(pod, {}).items() if k != "pod"})}
        if "namespaceCreatedAt" in entry and isinstance(entry["namespaceCreatedAt"], int):
            created = entry.pop("namespaceCreatedAt")
            entry["namespaceCreated"] = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            entry["namespaceAge"] = _age(created, now)
        if pod in restored:
            entry["lastRestoredTokens"] = restored[pod]
        entries.append(entry)
    if not entries:
        return {}
    ratios = [e["diskUsedRatio"] for e in entries if "diskUsedRatio" in e]
    ages = [e["namespaceAge"] for e in entries if "namespaceAge" in e]
    parts = [f"disk {max(ratios):.0%}" if ratios else "disk ?"]
    results = [r for r in (restart or {}).get("results") or [] if not r.get("newCacheNamespace")]
    if results:
        parts.append(f"{sum(1 for r in results if r.get('warm'))}/{len(results)} warm")
    if ages:
        parts.append(f"ns {min(ages, key=lambda a: (a[-1] == 'd', int(a[:-1])))}")
    return {"replicaCache": entries, "cacheSummary": " | ".join(parts)}


def without_nulls(value: Any) -> Any:
    """Drop null members: a merge patch deletes them, so keeping them would make every compare differ."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [without_nulls(v) for v in value]
    return value
