"""The thin shell of one reconcile: gather state, call the pure core, apply, write status once.

Level-based: every trigger (create, update, resume, timer, child event) runs the same function, which
converges the children to the plan and is a no-op (zero writes) when they already match.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError

from . import claim_history, disk_change, diskusage, drift, engine, metrics, policies, render, rollout, router, units
from . import status_model as sm
from .conditions import Condition, transitions
from .kube import Kube
from .plan import Plan, plan
from .status import CRASH_LOOPING, POD_FAILING, Observed, PodProblem, build_status, conditions_for

Obj = dict[str, Any]
EventSink = Callable[[Obj, str, str, str], None]
"""post_event(body, type, reason, message)."""


def utc_now() -> str:
    """RFC 3339 timestamp, second precision, as Kubernetes writes it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    """What one reconcile did (for logs, tests and metrics)."""

    applied: list[str] = field(default_factory=list)
    status_written: bool = False
    error: str | None = None
    rollout_actions: int = 0
    """Side effects the rollout attempted (canary, delete, warm check): the next step must look again."""


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(namespace: str, name: str) -> threading.Lock:
    """Serialize reconciles of one resource (timer, watch and child events may overlap)."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


Seen = dict[tuple[str, str], Obj | None]
"""Children already read in this reconcile, by (kind, name): each is read once per pass."""


def _apply_children(kube: Kube, objects: list[Obj], outcome: Outcome, seen: Seen) -> Obj | None:
    """Apply what drifted; return the live StatefulSet (as applied or as found)."""
    sts = None
    for obj in objects:
        meta = obj["metadata"]
        key = (obj["kind"], meta["name"])
        live = seen[key] if key in seen else kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if not drift.is_applied(obj, live):
            live = kube.apply(obj)
            outcome.applied.append(f"{obj['kind']}/{meta['name']}")
        if obj["kind"] == "StatefulSet":
            sts = live
    return sts


def _merge_diff(old: Any, new: Any) -> Any:
    """RFC 7386 patch turning `old` into `new`: changed members, nested keys `new` leaves out nulled, lists and
    scalars replaced whole. Applied to the freshly read status it yields exactly `new`, so a key a later state
    leaves out (restart.reason after a resume) can never survive; a patch never fails on a missing path."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: Obj = {k: None for k in old if k not in new}
    out.update({k: _merge_diff(old.get(k), v) for k, v in new.items() if old.get(k) != v})
    return out


def _status_delta(new: Obj, old: Obj) -> Obj:
    """Merge patch turning `old` into `new`; every status key is the operator's (Kopf keeps its own
    bookkeeping in annotations), so a top-level key `new` leaves out is removed too."""
    return _merge_diff(old, new) if old != new else {}


def _ensure_admin_secret(kube: Kube, meta: Obj, old: sm.QwenHiCacheServerStatus, outcome: Outcome) -> str:
    """Create the admin API key Secret once (tracked in status, so a no-op reconcile does not even try)."""
    name = render.admin_secret_name(meta["name"])
    created = old.admin_secret != name and kube.create_if_absent(
        render.get_admin_secret(meta, secrets.token_hex(32)))
    if created:
        outcome.applied.append(f"Secret/{name}")
    return name


def _annotate_claims(kube: Kube, meta: Obj, fingerprint: str, keep: int) -> tuple[str, ...]:
    """Record the cache fingerprint, and the ones it replaced, on each cache volume claim (they outlive the
    resource); the earlier namespaces the claims hold, newest first."""
    claims = kube.list("v1", "PersistentVolumeClaim", meta["namespace"], render.selector(meta["name"]))
    for claim in claims:
        notes = claim["metadata"].get("annotations") or {}
        if (wanted := claim_history.annotations_for(notes, fingerprint, keep)) is not None:
            kube.annotate("v1", "PersistentVolumeClaim", meta["namespace"], claim["metadata"]["name"], wanted)
            claim["metadata"]["annotations"] = {**notes, **wanted}
    return claim_history.previous_on_claims(claims, fingerprint)


def _pod_problems(pods: list[Obj]) -> tuple[PodProblem, ...]:
    """Init-container failures (e.g. the cache guard refusing a directory of another configuration) and
    containers in a crash loop, each with the container's last message (its log tail on an error exit)."""
    out = []
    for pod in pods:
        status, name = pod.get("status") or {}, pod["metadata"]["name"]
        for st in status.get("initContainerStatuses") or []:
            term = (st.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                out.append(PodProblem(POD_FAILING, f"pod {name}: init container {st['name']} exited "
                                                   f"{term['exitCode']}{_detail(term)}"))
        for st in status.get("containerStatuses") or []:
            if ((st.get("state") or {}).get("waiting") or {}).get("reason") == CRASH_LOOP:
                last = (st.get("lastState") or {}).get("terminated") or {}
                out.append(PodProblem(CRASH_LOOPING, f"pod {name}: container {st['name']} in a crash loop, restarted "
                                      f"{st.get('restartCount', 0)} times, last exit {last.get('exitCode', '?')}"
                                      f"{_detail(last)}"))
    return tuple(out)


CRASH_LOOP = "CrashLoopBackOff"
MESSAGE_CHARS = 600  # the tail of a container's last message kept in a condition


def _detail(term: Obj) -> str:
    detail = (term.get("message") or term.get("reason") or "").strip()
    return f": {detail[-MESSAGE_CHARS:]}" if detail else ""


def _run_rollout(kube: Kube, meta: Obj, old: sm.QwenHiCacheServerStatus, p: Plan, pods: list[Obj], now: str,
                 outcome: Outcome) -> sm.Restart:
    """Advance the restart state machine one step and perform its side effects."""
    views = [rollout.PodView.from_pod(pod) for pod in pods]
    policy = p.derived.policy
    rs, actions = rollout.plan_rollout(old.restart, views, p.target, p.spec.replicas, policy, now)
    outcome.rollout_actions = len(actions)
    port, prompt = p.spec.runtime.port, rollout.canary_prompt(meta["name"])
    for act in actions:
        if act.kind == "canary":
            res = engine.generate(act.ip, port, prompt) if act.ip else engine.CanaryResult(None, None, "no pod IP")
            rs = rollout.canary_sent(rs, act.pod, res.prompt_tokens, res.error)
        elif act.kind == "delete":
            if _evict(kube, meta, p, rs, act):
                rs = rollout.deleted(rs, act.pod, now)
        elif act.kind == "baseline":
            rs = rollout.baseline_read(rs, act.pod, act.uid, engine.cache_metrics(act.ip, port))
        elif act.kind == "verify":
            res = engine.generate(act.ip, port, prompt)
            metrics = engine.cache_metrics(act.ip, port) if res.storage_tokens is not None else {}
            rs = rollout.verified(rs, act.pod, res.storage_tokens, res.error, policy, now, metrics)
    return rs


def _evict(kube: Kube, meta: Obj, p: Plan, rs: sm.Restart, act: rollout.Action) -> bool:
    """Take one old pod down, if that still keeps the promise: availability is checked again on pods listed
    right now (another pod may have gone since the plan), and the eviction API applies the server's
    PodDisruptionBudget too. False: not now, a later pass tries again."""
    if not router.ready_to_delete(kube, meta, p.spec, rs, act.pod):
        return False  # seam "before delete": the router still routes to it
    pods = kube.list("v1", "Pod", meta["namespace"], render.selector(meta["name"]))
    views = [rollout.PodView.from_pod(pod) for pod in pods]
    if not rollout.may_take_down(views, act.pod, act.uid, p.spec.replicas, p.derived.policy):
        return False
    return kube.evict_pod(meta["namespace"], act.pod, act.uid) is not None


def reconcile(kube: Kube, body: Obj, post_event: EventSink, now: str | None = None) -> Outcome:
    """Converge one QwenHiCacheServer's children and status."""
    meta = body["metadata"]
    with _lock_for(meta["namespace"], meta["name"]):
        fresh = kube.get_server(meta["namespace"], meta["name"])
        if fresh is None or fresh["metadata"].get("deletionTimestamp"):
            return Outcome()
        return _reconcile_locked(kube, fresh, post_event, now or utc_now())


def _converge(kube: Kube, meta: Obj, old: sm.QwenHiCacheServerStatus, p: Plan, outcome: Outcome, now: str,
              seen: Seen) -> Observed:
    """Apply children, keep the cache bookkeeping, advance a rollout; report what was seen."""
    children = [o for o in p.objects if not router.is_manifest(o)]
    if not old.model_fields_set:  # never reconciled: nothing to compare with, apply without reading first (faster)
        seen = {(o["kind"], o["metadata"]["name"]): None for o in children} | seen
    sts = _apply_children(kube, children, outcome, seen)
    secret = _ensure_admin_secret(kube, meta, old, outcome)
    disk = p.spec.hicache.disk
    history = _annotate_claims(kube, meta, p.derived.layout.fingerprint, disk.keep_old_namespaces) \
        if disk.enabled else ()
    pods = kube.list("v1", "Pod", meta["namespace"], render.selector(meta["name"]))
    restart = _run_rollout(kube, meta, old, p, pods, now, outcome)
    routing = router.sync(kube, meta, p.spec, restart, old.router)  # seam "after warm check": listed again
    return Observed(sts=sts, restart=restart, pod_problems=_pod_problems(pods), admin_secret=secret, router=routing,
                    disk_usage=_disk_usage(p, pods), claim_history=history)


def _disk_usage(p: Plan, pods: list[Obj]) -> tuple[tuple[str, Obj | None], ...]:
    """Each running pod's disk tier as its cache-usage sidecar reports it (None when it does not answer)."""
    if not p.spec.hicache.disk.enabled:
        return ()
    running = [(pod["metadata"]["name"], ip) for pod in pods if (ip := (pod.get("status") or {}).get("podIP"))]
    return tuple((name, diskusage.read_usage(ip, timeout=2.0)) for name, ip in sorted(running))


def _smallest_node_memory(kube: Kube, spec: Obj) -> int | None:
    """Smallest allocatable memory among nodes matching the node selector; None when unknown or unreadable."""
    selector = ((spec.get("runtime") or {}).get("nodeSelector")) or {}
    nodes = kube.list_nodes(selector)
    sizes = [units.to_bytes(str(m)) for n in nodes
             if (m := ((n.get("status") or {}).get("allocatable") or {}).get("memory"))]
    return min(sizes) if sizes else None


def _cache_claims(kube: Kube, meta: Obj) -> list[Obj]:
    prefix = f"{render.CACHE_VOLUME}-{meta['name']}-"
    claims = kube.list("v1", "PersistentVolumeClaim", meta["namespace"], render.selector(meta["name"]))
    return [c for c in claims if c["metadata"]["name"].startswith(prefix)]


def _expand_claims(kube: Kube, meta: Obj, size: str) -> str | None:
    """Expand every cache claim below `size`; the API server's refusal (StorageClass without
    allowVolumeExpansion, an unbound claim) comes back as the reason, nothing half-done is hidden."""
    for name in disk_change.claims_to_expand(_cache_claims(kube, meta), size):
        try:
            kube.resize_claim(meta["namespace"], name, size)
        except (ApiException, DynamicApiError) as err:
            detail = getattr(err, "summary", lambda: "")() or getattr(err, "body", "") or str(err)
            return (f"hicache.disk.size grew to {size}, but cache volume {name} cannot be expanded: {detail}; "
                    "use a StorageClass with allowVolumeExpansion: true, or set hicache.disk.size back")
    return None


def _disk_step(kube: Kube, body: Obj, p: Plan, post_event: EventSink, outcome: Outcome, seen: Seen) -> Plan:
    """A changed disk tier as a real operation (see disk_change): expand claims, re-create the StatefulSet
    without its pods, or refuse with the reason. The new set is applied once the old one is gone."""
    meta = body["metadata"]
    def is_serving_set(o: Obj) -> bool:
        return o["kind"] == "StatefulSet" and o["metadata"]["name"] == meta["name"]

    desired = next((o for o in p.objects if is_serving_set(o)), None)
    if desired is None:
        return p
    live = seen[("StatefulSet", meta["name"])] = kube.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
    later = replace(p, objects=[o for o in p.objects if not is_serving_set(o)])
    if live is not None and live["metadata"].get("deletionTimestamp"):
        return later  # being orphaned: its deletion event triggers the reconcile that applies the new set
    change = disk_change.classify(live, desired)
    if change.kind == "none":
        return p
    if change.refused:
        return replace(p, objects=[], problems=[policies.Problem(change.reason, change.message), *p.problems])
    if change.kind == "grow" and (why := _expand_claims(kube, meta, change.size or "")):
        return replace(p, objects=[], problems=[policies.Problem("DiskExpansionRefused", why), *p.problems])
    if kube.delete_orphaning("apps/v1", "StatefulSet", meta["namespace"], meta["name"], live["metadata"]["uid"]):
        outcome.applied.append(f"StatefulSet/{meta['name']} (deleted, pods orphaned)")
        post_event(body, "Normal", change.reason, change.message)
    return later


def _what_runs(kube: Kube, meta: Obj, old: sm.QwenHiCacheServerStatus) -> Observed:
    """A refused spec applies nothing: report the workload that keeps running and keep a rollout's record."""
    try:
        sts = kube.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
    except (ApiException, DynamicApiError):
        sts = None
    return Observed(sts=sts, restart=old.restart, router=old.router)


def _reconcile_locked(kube: Kube, body: Obj, post_event: EventSink, now: str) -> Outcome:
    meta, stored = body["metadata"], body.get("status") or {}
    old = sm.read_status(stored)
    p = plan(meta, body.get("spec") or {}, _smallest_node_memory(kube, body.get("spec") or {}))
    outcome = Outcome()
    obs = Observed()
    if not p.blocked:
        try:
            seen: Seen = {}
            p = _disk_step(kube, body, p, post_event, outcome, seen)
            if not p.blocked:
                obs = _converge(kube, meta, old, p, outcome, now, seen)
        except (ApiException, DynamicApiError) as err:
            outcome.error = f"reconcile failed: {getattr(err, 'reason', '')} {getattr(err, 'body', err)}"
            obs = Observed(apply_error=outcome.error, restart=old.restart, router=old.router)
    if p.blocked:
        obs = _what_runs(kube, meta, old)
    new = build_status(p, obs, old, meta.get("generation", 0), now).wire()  # serialized once, here
    delta = _status_delta(new, stored)
    if delta:
        kube.patch_status(meta["namespace"], meta["name"], delta)
        outcome.status_written = True
    # After the write, so a failed patch (retried next time) is never counted twice.
    metrics.observe_restart_status(meta["namespace"], meta["name"], old.restart, obs.restart, now)
    _post_transitions(body, conditions_for(p, obs), old.conditions, post_event)
    return outcome


def _post_transitions(body: Obj, new: list[Condition], old: list[Condition] | None, post_event: EventSink) -> None:
    """An event per condition change; a new resource gets one summary plus its warnings, not one per condition."""
    changed = [c for c in transitions(new, old) if c.type != "Progressing"]
    if not old:
        post_event(body, "Normal", "Accepted", "; ".join(f"{c.type}={c.status}" for c in changed))
        changed = [c for c in changed if _is_bad(c.type, c.status, c.reason)]
    for c in changed:
        kind = "Warning" if _is_bad(c.type, c.status, c.reason) else "Normal"
        post_event(body, kind, c.reason, f"{c.type}={c.status}: {c.message}".rstrip(": "))


NOT_A_WARNING = {("CachePersistent", "DiskTierDisabled")}
"""False, but by the admin's own choice (a server without a disk tier): no Warning event."""


def _is_bad(ctype: str, status: str, reason: str = "") -> bool:
    """Whether a condition in this state needs the admin's attention (a Warning event)."""
    if (ctype, reason) in NOT_A_WARNING:
        return False
    return status == ("True" if ctype == "Degraded" else "False") and ctype != "Ready"
