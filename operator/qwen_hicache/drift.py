"""Decide whether a desired object is already in place, so a no-op reconcile makes no write call.

The desired object carries a hash of itself in an annotation; the live object matches when every field
we render is present with the same value. Fields the server or other controllers add are ignored, and
a field we stopped rendering changes the hash, so its removal is applied too. `Live` holds the live side for one
pass (gather reads it, apply keeps it current), here below both so that apply needs no reader.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .constants import HASH_ANNOTATION  # noqa: F401 - re-exported
from .units import same_quantity

Obj = dict[str, Any]
Key = tuple[str, str]
"""(kind, name) of a child."""


def key_of(obj: Obj) -> Key:
    return obj["kind"], obj["metadata"]["name"]


@dataclass
class Live:
    """The children as the cluster has them, by (kind, name); None: absent. Updated by the apply helper with
    what it applied, so later steps of the same pass compare against what is there now."""

    objects: dict[Key, Obj | None] = field(default_factory=dict)

    def get(self, key: Key) -> Obj | None:
        return self.objects.get(key)

    def __contains__(self, key: Key) -> bool:
        return key in self.objects

    def put(self, key: Key, obj: Obj | None) -> None:
        self.objects[key] = obj


def content_hash(obj: Any) -> str:
    """Stable short hash of a JSON-able object."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` whose metadata records the hash of its own content."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), HASH_ANNOTATION: content_hash(obj)}
    return {**obj, "metadata": meta}


def with_hashes(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`with_hash` of each object (render stamps everything it renders at once)."""
    return [with_hash(o) for o in objects]


def is_subset(want: Any, have: Any) -> bool:
    """True when every value in `want` appears in `have` (lists element-wise, same length). Quantities compare by
    value: the API server stores them canonically ("2000m" comes back as "2"), and the hash annotation still
    catches any change of the desired object itself."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have or (isinstance(want, str) and isinstance(have, str) and same_quantity(want, have))


def is_applied(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """True when applying `desired` would change nothing we own."""
    return live is not None and is_subset(desired, live)
