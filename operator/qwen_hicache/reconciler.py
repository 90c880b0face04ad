"""The thin shell of one reconcile: gather state, call the pure core, apply, write status once.

Level-based: every trigger (create, update, resume, timer, child event) runs the same function, which
converges the children to the plan and is a no-op (zero writes) when they already match.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError

from . import drift
from .conditions import transitions
from .kube import Kube
from .plan import plan
from .status import build_status, conditions_for

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


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(namespace: str, name: str) -> threading.Lock:
    """Serialize reconciles of one resource (timer, watch and child events may overlap)."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def _apply_children(kube: Kube, objects: list[Obj], outcome: Outcome) -> Obj | None:
    """Apply what drifted; return the live StatefulSet (as applied or as found)."""
    sts = None
    for obj in objects:
        meta = obj["metadata"]
        live = kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if not drift.is_applied(obj, live):
            live = kube.apply(obj)
            outcome.applied.append(f"{obj['kind']}/{meta['name']}")
        if obj["kind"] == "StatefulSet":
            sts = live
    return sts


def _status_delta(new: Obj, old: Obj) -> Obj:
    """Merge patch turning `old` into `new` for the keys this operator owns (stale keys are nulled)."""
    delta = {k: v for k, v in new.items() if old.get(k) != v}
    delta.update({k: None for k in ("launch", "sizing") if k in old and k not in new})
    return delta


def reconcile(kube: Kube, body: Obj, post_event: EventSink, now: str | None = None) -> Outcome:
    """Converge one QwenHiCacheServer's children and status."""
    meta = body["metadata"]
    with _lock_for(meta["namespace"], meta["name"]):
        fresh = kube.get_server(meta["namespace"], meta["name"])
        if fresh is None or fresh["metadata"].get("deletionTimestamp"):
            return Outcome()
        return _reconcile_locked(kube, fresh, post_event, now or utc_now())


def _reconcile_locked(kube: Kube, body: Obj, post_event: EventSink, now: str) -> Outcome:
    meta, old = body["metadata"], body.get("status") or {}
    p = plan(meta, body.get("spec") or {})
    outcome = Outcome()
    sts = None
    if not p.blocked:
        try:
            sts = _apply_children(kube, p.objects, outcome)
        except (ApiException, DynamicApiError) as err:
            outcome.error = f"applying children failed: {getattr(err, 'reason', '')} {getattr(err, 'body', err)}"
    new = build_status(p, sts, old, meta.get("generation", 0), now, outcome.error)
    delta = _status_delta(new, old)
    if delta:
        kube.patch_status(meta["namespace"], meta["name"], delta)
        outcome.status_written = True
    for c in transitions(conditions_for(p, sts, outcome.error), old.get("conditions")):
        if c.type != "Progressing":
            kind = "Warning" if _is_bad(c.type, c.status) else "Normal"
            post_event(body, kind, c.reason, f"{c.type}={c.status}: {c.message}".rstrip(": "))
    return outcome


def _is_bad(ctype: str, status: str) -> bool:
    """Whether a condition in this state needs the admin's attention (a Warning event)."""
    return status == ("True" if ctype == "Degraded" else "False") and ctype != "Ready"
