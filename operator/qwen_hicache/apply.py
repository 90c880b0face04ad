"""The one way the operator writes a child: server-side apply, and only when the live object has drifted.

Every child goes through `apply_if_drifted`, the router's manifest and its scaled-down Deployment included, so
a no-op reconcile writes nothing and each pass compares against what it applied itself (read your writes).
"""

from __future__ import annotations

from typing import Any

from .drift import HASH_ANNOTATION, Live, is_applied, key_of
from .kube import KubeClient

Obj = dict[str, Any]


def apply_if_drifted(kube: KubeClient, live: Live, obj: Obj, applied: list[str] | None = None) -> Obj:
    """The live object once it matches `obj` (stamped by `drift.with_hash`): read from the cluster unless `live`
    already holds it, applied when it lacks what `obj` renders. `applied` collects `Kind/name` of each write."""
    meta = obj["metadata"]
    assert HASH_ANNOTATION in (meta.get("annotations") or {}), "stamp desired objects with drift.with_hash"
    key = key_of(obj)
    if key not in live:
        live.put(key, kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]))
    current = live.get(key)
    if is_applied(obj, current):
        return current  # type: ignore[return-value]
    current = kube.apply(obj)
    live.put(key, current)
    if applied is not None:
        applied.append(f"{obj['kind']}/{meta['name']}")
    return current
