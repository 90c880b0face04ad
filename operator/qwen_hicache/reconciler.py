"""The thin shell of one reconcile: lock, gather, plan, apply, write status once.

Level-based: every trigger (create, update, resume, timer, child event) runs the same function, which
converges the children to the plan and is a no-op (zero writes) when they already match. The pass is:
gather (gather.py: children, pods, claims, node memory), plan (plan.py: the pure core), apply every drifted
child (apply.py), act (execute.py and the workload manager: the admin Secret, the claims' fingerprints, the
rollout's step, the router's manifest), then one status patch with the delta.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import execute, gather, metrics, rollout, router
from . import status_model as sm
from .apply import apply_if_drifted
from .conditions import Condition, transitions
from .kube import API_ERRORS, KubeClient, namespace_terminating
from .observed import Observed
from .plan import plan
from .plan_model import Plan
from .status import build_status, conditions_for
from .workload import Workload, manager_for

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
    namespace_terminating: bool = False
    """The namespace is being deleted: the pass stopped, wrote nothing and posts no events (they would be refused)."""


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()
_newest: dict[tuple[str, str], str] = {}
"""resourceVersion of the newest version of each resource this process has read or written (under its lock)."""
_passed: dict[tuple[str, str], float] = {}
"""When (time.monotonic()) the last successful pass of each resource started."""
_workloads_seen: dict[tuple[str, str], Hashable] = {}
"""(namespace, name) of a workload -> `workload_mark` of it as the last successful pass left it."""


def _lock_for(namespace: str, name: str) -> threading.Lock:
    """Serialize reconciles of one resource (timer, watch and child events may overlap)."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


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


def reconcile(kube: KubeClient, body: Obj, post_event: EventSink, now: str | None = None) -> Outcome:
    """Converge one QwenHiCacheServer's children and status.

    Triggers of one resource coalesce, as a controller's work queue does: one that waited for the lock while a
    later-started pass ran is done (that pass read the resource and every child after the trigger came). Timers,
    child events and the create lane otherwise queued full passes of the same resource behind each other."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    asked = time.monotonic()
    with _lock_for(*key):
        if _covered(key, asked, meta.get("resourceVersion")):
            return Outcome()
        started = time.monotonic()
        fresh = _current(kube, body, key)
        if fresh is None or fresh["metadata"].get("deletionTimestamp"):
            forget(*key)
            return Outcome()
        _newest[key] = fresh["metadata"].get("resourceVersion", "")
        outcome = _reconcile_locked(kube, fresh, post_event, now or utc_now())
        if not outcome.error:
            _passed[key] = started
        return outcome


def _covered(key: tuple[str, str], asked: float, rv: str | None) -> bool:
    """Whether a successful pass that started after this trigger came has already seen all it can signal: the
    children and pods it read afresh, and the resource itself, unless the trigger carries a version other than the
    newest this process knows (a spec edit that pass, acting on the version it knew, may not have seen)."""
    return _passed.get(key, asked) > asked and (rv is None or rv == _newest.get(key))


def _current(kube: KubeClient, body: Obj, key: tuple[str, str]) -> Obj | None:
    """The resource to act on: `body` itself when it is the very version this process last read or wrote, else a
    fresh GET.

    Why the GET: a trigger's body can predate this process's own last status write (Kopf's watch lags), and a pass
    on a stale status would repeat a rollout step. A body carrying the resourceVersion of our last read or write
    *is* that version (versions are never reused), and only this process writes the status, under this lock: so
    its status is current, exactly as a GET would return it; a newer spec is at most as racy as a GET (the edit's
    own update event runs the next pass). Resync timers carry Kopf's latest body, so a quiet resource skips the
    GET; a trigger without a version (a child event) always reads."""
    rv = body["metadata"].get("resourceVersion")
    if rv and _newest.get(key) == rv and "spec" in body:
        return json.loads(json.dumps(body))  # a copy the pass owns (JSON's round trip: 5x cheaper than deepcopy)
    return kube.get_server(*key)


def _refs(p: Plan, meta: Obj) -> list[gather.Ref]:
    """Every child this pass may compare: the plan's, and the router's manifest (applied by router.py)."""
    refs = [gather.ref_of(o) for o in p.children]
    if router.active(p.spec):
        refs.append(("v1", *router.manifest_key(meta)))
    return refs


def _converge(kube: KubeClient, body: Obj, old: sm.QwenHiCacheServerStatus, p: Plan, workload: Workload,
              post_event: EventSink, outcome: Outcome, now: str) -> tuple[Plan, Observed]:  # fmt: skip
    """Gather, run the workload's disk step, apply children, keep the cache bookkeeping, advance a rollout."""
    meta = body["metadata"]
    live = gather.children(kube, meta, _refs(p, meta), first=not old.model_fields_set,
                           always=frozenset({workload.kind}))
    disk = p.spec.hicache.disk
    claims = workload.claims(kube, meta) if disk.enabled else []
    p = workload.disk_step(kube, live, body, p, claims, post_event, outcome.applied)
    if p.blocked:
        return p, Observed()
    for obj in p.children:
        apply_if_drifted(kube, live, obj, outcome.applied)
    secret = execute.ensure_admin_secret(kube, meta, old, outcome.applied)
    history = execute.annotate_claims(kube, meta, gather.cache_claims(claims, meta["name"]),
                                      p.derived.layout.fingerprint, disk.keep_old_namespaces) if disk.enabled else ()
    pods = gather.pods(kube, meta)
    workload.repair(kube, body, pods.serving, post_event, outcome.applied)
    release = functools.partial(workload.release, kube, live, meta, p)
    restart, outcome.rollout_actions = execute.run_rollout(kube, live, meta, old.restart, p,
                                                           workload.views(pods.serving), pods.router, release, now)
    routing = router.sync(kube, live, meta, p.spec, restart, pods.router, old.router, outcome.applied)
    running = live.get((workload.kind, meta["name"])) if workload.desired(p) else None  # None: being re-created
    usage = gather.disk_usage(pods.serving) if disk.enabled else ()
    return p, Observed(sts=running, restart=restart, admin_secret=secret,
                       pod_problems=gather.pod_problems(pods.serving), router=routing, claim_history=history,
                       disk_usage=usage, groups=workload.groups(pods.serving, usage, restart))


def _what_runs(kube: KubeClient, meta: Obj, old: sm.QwenHiCacheServerStatus, workload: Workload) -> Observed:
    """A refused spec applies nothing: report the workload that keeps running and keep a rollout's record."""
    try:
        running = kube.get(workload.api_version, workload.kind, meta["namespace"], meta["name"])
    except API_ERRORS:
        running = None
    return Observed(sts=running, restart=old.restart, router=old.router)


def _reconcile_locked(kube: KubeClient, body: Obj, post_event: EventSink, now: str) -> Outcome:
    meta, stored = body["metadata"], body.get("status") or {}
    old = sm.read_status(stored)
    measured = rollout.measured_write_rate(old.restart, old.cache and old.cache.measured_write_bytes_per_second)
    p = plan(meta, body.get("spec") or {}, *gather.node_capacity(kube, body.get("spec") or {}),
             measured_write_rate=measured)
    workload = manager_for(p, meta["name"], old.restart)
    outcome = Outcome()
    obs = Observed()
    if not p.blocked:
        try:
            p, obs = _converge(kube, body, old, p, workload, post_event, outcome, now)
        except API_ERRORS as err:
            if namespace_terminating(err):
                outcome.namespace_terminating = True
                return outcome
            outcome.error = f"reconcile failed: {getattr(err, 'reason', '')} {getattr(err, 'body', err)}"
            obs = Observed(apply_error=outcome.error, restart=old.restart, router=old.router)
    if p.blocked:
        obs = _what_runs(kube, meta, old, workload)
    elif not outcome.error:
        _remember_workload(meta["namespace"], obs.sts)
    new = build_status(p, obs, old, meta.get("generation", 0), now).wire()  # serialized once, here
    delta = _status_delta(new, stored)
    if delta:
        key = (meta["namespace"], meta["name"])
        _remember(key, None)  # a patch that fails may still have been stored: no version is known until it answers
        _remember(key, kube.patch_status(*key, delta))
        outcome.status_written = True
    # After the write, so a failed patch (retried next time) is never counted twice.
    metrics.observe_restart_status(meta["namespace"], meta["name"], old.restart, obs.restart, now)
    _post_prestop_failures(body, old.restart, obs.restart, post_event)
    _post_transitions(body, conditions_for(p, obs), old.conditions, post_event)
    return outcome


def workload_mark(obj: Obj | None) -> Hashable:
    """All a pass reads of its workload: which incarnation, its spec (by generation), the labels and annotations
    drift is checked on, deletion, and the ready count the status reports."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    return (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
            json.dumps([meta.get("labels"), meta.get("annotations")], sort_keys=True),
            (obj.get("status") or {}).get("readyReplicas"))  # fmt: skip


def workload_seen(obj: Obj) -> bool:
    """Whether the last successful pass of its server already saw this workload exactly (a watch event of our own
    apply, or of the StatefulSet controller's bookkeeping): a pass on it would read the same and write nothing."""
    meta = obj.get("metadata") or {}
    return _workloads_seen.get((meta.get("namespace", ""), meta.get("name", ""))) == workload_mark(obj)


def forget(namespace: str, name: str) -> None:
    """A deleted server's bookkeeping goes with it (its workload shares its name)."""
    _newest.pop((namespace, name), None)
    _workloads_seen.pop((namespace, name), None)
    _passed.pop((namespace, name), None)


def _remember_workload(namespace: str, running: Obj | None) -> None:
    if running is not None:
        _workloads_seen[(namespace, running["metadata"]["name"])] = workload_mark(running)


def _remember(key: tuple[str, str], written: Obj | None) -> None:
    """The version our status patch produced is now the newest we know (None: unknown, read next time)."""
    rv = ((written or {}).get("metadata") or {}).get("resourceVersion")
    if rv:
        _newest[key] = rv
    else:
        _newest.pop(key, None)


def _post_transitions(body: Obj, new: list[Condition], old: list[Condition] | None, post_event: EventSink) -> None:
    """An event per condition change; a new resource gets one summary plus its warnings, not one per condition."""
    changed = [c for c in transitions(new, old) if c.type != "Progressing"]
    if not old:
        post_event(body, "Normal", "Accepted", "; ".join(f"{c.type}={c.status}" for c in changed))
        changed = [c for c in changed if _is_bad(c.type, c.status, c.reason)]
    for c in changed:
        kind = "Warning" if _is_bad(c.type, c.status, c.reason) else "Normal"
        post_event(body, kind, c.reason, f"{c.type}={c.status}: {c.message}".rstrip(": "))


def _post_prestop_failures(body: Obj, old: sm.Restart | None, new: sm.Restart | None, post_event: EventSink) -> None:
    """One Warning per restarted pod whose predecessor's final flush failed or timed out (after the status write,
    so a retried pass never posts it twice): its queued backups may be lost, the pod partly cold."""
    for r in rollout.failed_prestops(old, new):
        assert r.pre_stop is not None
        post_event(body, "Warning", PRESTOP_FAILED, f"pod {r.pod}: the replaced pod's preStop flush ended "
                   f"{r.pre_stop.outcome}{': ' + r.pre_stop.message if r.pre_stop.message else ''}; queued disk "
                   "writes may be lost (see status.restart.results)")


PRESTOP_FAILED = "PreStopFlushFailed"
NOT_A_WARNING = {("CachePersistent", "DiskTierDisabled")}
"""False, but by the admin's own choice (a server without a disk tier): no Warning event."""


def _is_bad(ctype: str, status: str, reason: str = "") -> bool:
    """Whether a condition in this state needs the admin's attention (a Warning event)."""
    if (ctype, reason) in NOT_A_WARNING:
        return False
    return status == ("True" if ctype == "Degraded" else "False") and ctype != "Ready"
