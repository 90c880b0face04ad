"""Disk-tier changes as real operations: what a new spec means for the StatefulSet's volume claims.

A StatefulSet's `volumeClaimTemplates` are immutable; applying a changed one fails forever. So the operator
compares the live set's claim template with the desired one and turns the difference into an operation:

- **grow** (`hicache.disk.size` raised): expand every existing cache claim in place (needs a StorageClass with
  `allowVolumeExpansion: true`), then delete the StatefulSet with `propagationPolicy: Orphan` and apply the new
  one, which adopts the running pods: no pod restarts, no page is lost. The new size's file-tier cap takes
  effect at each pod's next restart.
- **shrink**: refused (a volume never shrinks); the message names the current size.
- **enable** / **disable** the disk tier, or another template change: re-create the set the same way; the pod
  template changed too, so the cache-aware rollout restarts the pods one at a time onto the new volumes.
- **class** (`storageClassName` changed): refused; existing claims cannot change class.

Pure: the reconciler gathers the live objects and performs the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .units import binary, to_bytes

Obj = dict[str, Any]
Kind = Literal["none", "grow", "shrink", "recreate", "class"]
EXPAND_ANNOTATION_KEY = "allowVolumeExpansion"


@dataclass(frozen=True)
class DiskChange:
    """What turning the live StatefulSet into the desired one takes."""

    kind: Kind
    reason: str = ""
    message: str = ""
    size: str | None = None
    """The desired claim size (for grow: what each claim is expanded to)."""

    @property
    def refused(self) -> bool:
        return self.kind in ("shrink", "class")


def _claim(sts: Obj | None) -> Obj | None:
    templates = ((sts or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return templates[0] if templates else None


def _storage(claim: Obj) -> str:
    return str((((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage", "0"))


def _comparable(claim: Obj | None) -> Obj | None:
    """The parts of a claim template that the API server would compare (it stores defaults we do not send)."""
    if claim is None:
        return None
    spec = claim.get("spec") or {}
    return {"name": (claim.get("metadata") or {}).get("name"), "labels": (claim.get("metadata") or {}).get("labels"),
            "accessModes": spec.get("accessModes"), "storage": to_bytes(_storage(claim))}


def classify(live: Obj | None, desired: Obj) -> DiskChange:
    """The operation that moves the live StatefulSet's claim template to the desired one."""
    if live is None:
        return DiskChange("none")
    old, new = _claim(live), _claim(desired)
    if old is None and new is None:
        return DiskChange("none")
    if old is None or new is None:
        what = "enables" if new is not None else "disables"
        return DiskChange("recreate", "DiskTierChanged",
                          f"the spec {what} the disk tier: re-creating the StatefulSet (pods kept) and rolling the "
                          "pods one at a time onto the new volume layout")
    new_class = (new.get("spec") or {}).get("storageClassName")
    old_class = (old.get("spec") or {}).get("storageClassName")
    if new_class is not None and new_class != old_class:
        return DiskChange("class", "DiskClassChangeRefused",
                          f"hicache.disk.storageClassName {new_class!r}: the cache volumes exist with class "
                          f"{old_class!r} and a claim cannot change class; set it back, or delete the server and its "
                          "hicache-* claims to start over on the new class")
    old_bytes, new_bytes = to_bytes(_storage(old)), to_bytes(_storage(new))
    if new_bytes < old_bytes:
        return DiskChange("shrink", "DiskShrinkRefused",
                          f"hicache.disk.size asks for {binary(_storage(new))} per volume but the cache volumes have "
                          f"{binary(_storage(old))}: a volume cannot shrink; set hicache.disk.size to at least "
                          f"{binary(_storage(old))} (or lower capPerRank to use less of it)")
    if new_bytes > old_bytes:
        return DiskChange("grow", "DiskExpanding",
                          f"growing the cache volumes from {binary(_storage(old))} to {binary(_storage(new))} in place "
                          "(pods keep running)", size=_storage(new))
    if _comparable(old) != _comparable(new):
        return DiskChange("recreate", "DiskTemplateChanged", "the cache volume template changed: re-creating the "
                          "StatefulSet (pods kept)")
    return DiskChange("none")


def claims_to_expand(claims: list[Obj], size: str) -> list[str]:
    """Cache claims whose request is below `size`."""
    want = to_bytes(size)
    return sorted(c["metadata"]["name"] for c in claims if to_bytes(_storage(c)) < want)


def expansion_blocker(claims: list[Obj], classes: dict[str, Obj | None]) -> str | None:
    """Why these claims cannot be expanded (their StorageClass forbids it or is unknown), or None."""
    bad = []
    for c in claims:
        name = (c.get("spec") or {}).get("storageClassName")
        sc = classes.get(name or "")
        if not sc or not sc.get(EXPAND_ANNOTATION_KEY):
            bad.append(f"{c['metadata']['name']} (StorageClass {name!r}"
                       f"{' not found' if not sc else ' has allowVolumeExpansion unset or false'})")
    if not bad:
        return None
    return ("hicache.disk.size grew, but these cache volumes cannot be expanded: " + ", ".join(bad)
            + "; use a StorageClass with allowVolumeExpansion: true, or set hicache.disk.size back")
