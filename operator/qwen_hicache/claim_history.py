"""Which cache namespaces a cache volume holds, recorded on its claim (pure).

The claims outlive the resource (the StatefulSet's claims are retained), so a server deleted and created
again finds its volumes, and with them the namespaces earlier configurations wrote: `status.cache
.previousFingerprints` is rebuilt from the claims instead of starting empty, and a new fingerprint never
overwrites the record of the one it replaces.
"""

from __future__ import annotations

from typing import Any

from .constants import FINGERPRINT_ANNOTATION, PREVIOUS_FINGERPRINTS_ANNOTATION

Obj = dict[str, Any]


def _split(value: str | None) -> list[str]:
    return [fp for fp in (value or "").split(",") if fp]


def annotations_for(current: dict[str, str] | None, fingerprint: str, keep: int) -> dict[str, str] | None:
    """The claim's annotations once `fingerprint` is current: the one it replaces moves to the front of the
    history, which keeps `keep` entries (what the cache guard keeps on disk); None when nothing changes."""
    current = current or {}
    was = current.get(FINGERPRINT_ANNOTATION)
    previous = _split(current.get(PREVIOUS_FINGERPRINTS_ANNOTATION))
    if was and was != fingerprint:
        previous.insert(0, was)
    previous = list(dict.fromkeys(fp for fp in previous if fp != fingerprint))[:keep]
    wanted = {FINGERPRINT_ANNOTATION: fingerprint, PREVIOUS_FINGERPRINTS_ANNOTATION: ",".join(previous)}
    return None if all(current.get(k, "") == v for k, v in wanted.items()) else wanted


def previous_on_claims(claims: list[Obj], fingerprint: str) -> tuple[str, ...]:
    """Namespaces other than `fingerprint` that the claims record, newest first (first claim's order wins)."""
    seen: dict[str, None] = {}
    for claim in claims:
        notes = claim.get("metadata", {}).get("annotations") or {}
        for fp in [notes.get(FINGERPRINT_ANNOTATION), *_split(notes.get(PREVIOUS_FINGERPRINTS_ANNOTATION))]:
            if fp and fp != fingerprint:
                seen.setdefault(fp)
    return tuple(seen)
