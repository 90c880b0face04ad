"""Derive `status` from the plan and the observed workload. Pure: the clock is passed in.

Conditions:
- `SpecValid` / `SizingValid`: the spec can be served as written (else nothing is applied).
- `CachePersistent`: pages reach the disk tier, so a restart can warm-start.
- `CacheWarm`: the last verified restart of each pod served the canary from disk (False, PartlyWarm: some pod
  restored only part of it).
- `ImagePinned`, `DiskWriteRate`: advisories (False: a Warning event, nothing blocked).
- `Ready`: every desired replica is ready. `Progressing`: the workload or a rollout is converging.
- `Degraded`: something needs the admin (invalid spec, failed apply, paused rollout, refused cache).
"""

from __future__ import annotations

from datetime import UTC, datetime

from . import status_model as sm
from .conditions import Condition, condition, merge
from .diskusage import DiskUsage
from .observed import CRASH_LOOPING, POD_FAILING, Observed, PodProblem  # noqa: F401 - re-exported
from .plan_model import Plan


def _validity(plan: Plan) -> list[Condition]:
    out = []
    for ctype, ok_reason in (("SpecValid", "Valid"), ("SizingValid", "Fits")):
        blocking = [p for p in plan.problems if p.blocking and p.condition == ctype]
        if blocking:
            out.append(condition(ctype, "False", blocking[0].reason, "; ".join(p.message for p in blocking)))
        elif ctype == "SpecValid" or plan.spec is not None:
            out.append(condition(ctype, "True", ok_reason, "" if ctype == "SpecValid" else "host and disk fit"))
    return out


def _persistence(plan: Plan) -> list[Condition]:
    if plan.spec is None:
        return []
    if not plan.spec.hicache.disk.enabled:
        return [condition("CachePersistent", "False", "DiskTierDisabled", "hicache.disk.enabled is false")]
    warn = [p for p in plan.problems if p.condition == "CachePersistent"]
    if warn:
        return [condition("CachePersistent", "False", warn[0].reason, warn[0].message)]
    return [condition("CachePersistent", "True", "WriteThrough", "pages are written through to the disk tier")]


ADVISORY_CONDITIONS = {
    "ImagePinned": ("Digest", "runtime.image is pinned by digest"),
    "DiskWriteRate": ("AsBudgeted", "the disk tier's measured write rate is not below "
                                    "hicache.disk.writeBytesPerSecond (or not measured yet)"),
}
"""Conditions set False by a non-blocking policy problem (a Warning event), True otherwise."""


def _advisories(plan: Plan) -> list[Condition]:
    if plan.spec is None:
        return []
    out = []
    for ctype, (reason, message) in ADVISORY_CONDITIONS.items():
        warn = [p for p in plan.problems if p.condition == ctype]
        out.append(condition(ctype, "False", warn[0].reason, warn[0].message) if warn
                   else condition(ctype, "True", reason, message))
    return out


def _verified(restart: sm.Restart | None) -> list[sm.RestartResult]:
    """Restart results on an existing cache (a new cache namespace is cold by design)."""
    return [r for r in (restart.results if restart else []) if not r.new_cache_namespace]


def _warmth(restart: sm.Restart | None) -> list[Condition]:
    if restart and restart.reason == "ColdStart":
        return [condition("CacheWarm", "False", "ColdStart", restart.message or "")]
    results = _verified(restart)
    if not results:
        return [condition("CacheWarm", "Unknown", "NotVerified", "no restart on an existing cache verified yet")]
    tokens = sum(r.storage_tokens for r in results)
    if partial := [r for r in results if r.warmth == "Partial"]:
        shares = ", ".join(f"{r.pod} {r.canary_hit_share:.0%}" for r in partial)
        return [condition("CacheWarm", "False", "PartlyWarm",
                          f"{len(partial)} of {len(results)} restarted pod(s) restored only part of the canary from "
                          f"disk ({shares} of its pages): writes queued at the stop were lost or pages were "
                          "evicted; compare status.cache's measured write rate with hicache.disk.writeBytesPerSecond "
                          "(see docs/runbooks.md)")]
    return [condition("CacheWarm", "True", "WarmStart",
                      f"{len(results)} restarted pod(s) served the canary from disk ({tokens} tokens restored)")]


def _rollout_message(rs: sm.Restart) -> str:
    current = ", ".join(f"{e.pod}:{e.step}" for e in rs.in_flight)
    total = len(rs.done) + len(rs.pending) + len(rs.in_flight)
    return f"restarting {current or 'next pod'} ({len(rs.done)}/{total} done)"


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
    return [condition("Ready", "True" if ok else "False", "AllReplicasReady" if ok else "ReplicasNotReady", summary),
            condition("Progressing", "False", reason, "nothing new is applied until the spec is fixed"),
            condition("Degraded", "True", reason, message + REFUSED_NOTE)]


def _workload(plan: Plan, obs: Observed) -> list[Condition]:
    """Ready/Progressing/Degraded from the StatefulSet, the rollout and the pods."""
    if blocked := _blocked(plan, obs):
        reason, message = blocked
        if plan.blocked and obs.sts:
            return _refused_while_running(reason, message, obs)
        return [condition("Ready", "False", reason, message),
                condition("Progressing", "False", reason, "nothing is applied until this is fixed"),
                condition("Degraded", "True", reason, message)]
    desired = plan.spec.replicas if plan.spec else 0
    ready = int(((obs.sts or {}).get("status") or {}).get("readyReplicas") or 0)
    summary = f"{ready}/{desired} replicas ready"
    rs = obs.restart
    if rs and rs.phase == "Paused":
        degraded = condition("Degraded", "True", rs.reason or "", rs.message or "")
    elif obs.pod_problems:
        looping = any(p.reason == CRASH_LOOPING for p in obs.pod_problems)
        degraded = condition("Degraded", "True", CRASH_LOOPING if looping else POD_FAILING,
                             "; ".join(p.message for p in obs.pod_problems))
    else:
        degraded = condition("Degraded", "False", "AsExpected", "")
    if rs and rs.phase == "Rolling":
        progressing = condition("Progressing", "True", "RollingRestart", _rollout_message(rs))
    elif ready < desired:
        progressing = condition("Progressing", "True", "WaitingForReplicas", summary)
    else:
        progressing = condition("Progressing", "False", "AllReplicasReady" if desired else "ScaledToZero", summary)
    if desired == 0:
        ready_c = condition("Ready", "False", "ScaledToZero", "replicas is 0")
    elif ready >= desired:
        ready_c = condition("Ready", "True", "AllReplicasReady", summary)
    else:
        ready_c = condition("Ready", "False", "ReplicasNotReady", summary)
    return [ready_c, progressing, degraded]


def conditions_for(plan: Plan, obs: Observed) -> list[Condition]:
    """Every condition this reconcile observes."""
    warm = _warmth(obs.restart) if plan.spec is not None and plan.spec.hicache.disk.enabled else []
    return [*_validity(plan), *_persistence(plan), *_advisories(plan), *warm, *_workload(plan, obs)]


def cache_history(new: sm.Cache | None, old: sm.Cache | None, keep: int, on_claims: tuple[str, ...] = ()
                  ) -> sm.Cache | None:  # fmt: skip
    """`status.cache` with the earlier fingerprints still kept on the volumes (newest first): the previous
    status's, then any the claims record (a recreated resource starts from those)."""
    if new is None:
        return None
    previous = list(old.previous_fingerprints or []) if old else []
    if old and old.fingerprint and old.fingerprint != new.fingerprint:
        previous.insert(0, old.fingerprint)
    previous = list(dict.fromkeys(fp for fp in [*previous, *on_claims] if fp != new.fingerprint))[:keep]
    return new.model_copy(update={"previous_fingerprints": previous or None})


def build_status(plan: Plan, obs: Observed, old: sm.QwenHiCacheServerStatus | None, generation: int,
                 now: str) -> sm.QwenHiCacheServerStatus:
    """The complete new status; identical to `old` when nothing changed (so no write happens)."""
    old = old or sm.QwenHiCacheServerStatus()
    desired = plan.spec.replicas if plan.spec else 0
    ready = int(((obs.sts or {}).get("status") or {}).get("readyReplicas") or 0)
    if plan.blocked:
        ready, desired = _running(obs)
    return sm.QwenHiCacheServerStatus(
        observed_generation=generation,
        replicas=desired,
        ready_replicas=ready,
        replicas_summary=f"{ready}/{desired}",
        conditions=merge(conditions_for(plan, obs), old.conditions, generation, now),
        restart=obs.restart,
        admin_secret=obs.admin_secret or old.admin_secret,
        router=obs.router,
        **_described(plan, obs, old, now),
    )


def _described(plan: Plan, obs: Observed, old: sm.QwenHiCacheServerStatus, now: str) -> dict:
    """launch/sizing/cache of what runs: the plan's once applied; the last applied ones while a change is refused
    (nothing of a refused spec reaches the cluster, so its sizing would describe pods that do not exist)."""
    if plan.blocked:
        return {"launch": old.launch, "sizing": old.sizing, "cache": old.cache, "replica_cache": old.replica_cache,
                "cache_summary": old.cache_summary, "groups": old.groups}
    keep = plan.spec.hicache.disk.keep_old_namespaces if plan.spec else 0
    entries, summary = replica_cache(obs.disk_usage, obs.restart, old, now)
    return {"launch": plan.launch, "sizing": plan.sizing, "replica_cache": entries, "cache_summary": summary,
            "cache": cache_history(plan.cache, old.cache, keep, obs.claim_history),
            "groups": list(obs.groups) if obs.groups is not None else None}


# -- Per-replica cache: disk tier use vs cap, namespace age, last restart's restored tokens -----------------


def _stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(since: int, now: str) -> str:
    """A coarse age (changes at most hourly, so the summary does not rewrite status every reconcile)."""
    seconds = max(0, int(datetime.strptime(now, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()) - since)
    return f"{seconds // 86400}d" if seconds >= 86400 else f"{seconds // 3600}h"


def _entry(pod: str, usage: DiskUsage, now: str) -> sm.ReplicaCache:
    created = usage.namespace_created_at
    return sm.ReplicaCache(
        pod=pod, disk_used_bytes=usage.used_bytes, disk_page_files=usage.page_files, disk_cap_bytes=usage.cap_bytes,
        disk_used_ratio=usage.used_ratio, old_namespaces_bytes=usage.old_namespaces_bytes,
        namespace_created=_stamp(created) if created is not None else None,
        namespace_age=_age(created, now) if created is not None else None)


def replica_cache(usage: tuple[tuple[str, DiskUsage | None], ...], restart: sm.Restart | None,
                  old: sm.QwenHiCacheServerStatus, now: str) -> tuple[list[sm.ReplicaCache] | None, str | None]:
    """`replicaCache` (one entry per pod) and the one-line `cacheSummary` for `kubectl get`.

    Disk numbers come from each pod's cache-usage sidecar (qwen_hicache.diskusage), the same endpoint
    Prometheus scrapes. A pod that does not answer keeps its previous entry, so a slow sidecar does not
    make the status flap; restored tokens are the pod's last verified restart (status.restart.results).
    """
    before = {e.pod: e for e in old.replica_cache or []}
    restored = {r.pod: r.storage_tokens for r in (restart.results if restart else [])}
    entries = []
    for pod, numbers in usage:
        if numbers is None and pod not in before:
            continue  # no sidecar answer yet (or none at all): say nothing rather than guess
        entry = _entry(pod, numbers, now) if numbers is not None else before[pod]
        entries.append(entry.model_copy(update={"last_restored_tokens": restored.get(pod,
                                                                                    entry.last_restored_tokens)}))
    if not entries:
        return None, None
    ratios = [e.disk_used_ratio for e in entries if e.disk_used_ratio is not None]
    ages = [e.namespace_age for e in entries if e.namespace_age is not None]
    parts = [f"disk {max(ratios):.0%}" if ratios else "disk ?"]
    if results := _verified(restart):
        parts.append(f"{sum(1 for r in results if r.warm)}/{len(results)} warm")
        if partial := sum(1 for r in results if r.warmth == "Partial"):
            parts.append(f"{partial} partly warm")
    if ages:
        parts.append(f"ns {min(ages, key=lambda a: (a[-1] == 'd', int(a[:-1])))}")
    return entries, " | ".join(parts)
