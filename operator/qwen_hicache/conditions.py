"""Status conditions: small pure helpers in the style of metav1.Condition.

`lastTransitionTime` changes only when a condition's status flips, so a no-op reconcile produces the
identical status and therefore no write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    """One observation about the resource: a type, its truth, a CamelCase reason and a human message."""

    type: str
    status: Status
    reason: str
    message: str

    def wire(self, observed_generation: int, now: str, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The condition as stored, keeping the old transition time when the status did not flip."""
        changed = previous is None or previous.get("status") != self.status
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": observed_generation,
            "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
        }


def merge(
    new: list[Condition], old: list[dict[str, Any]] | None, observed_generation: int, now: str
) -> list[dict[str, Any]]:
    """New conditions in a stable order, each carrying its previous transition time when unchanged."""
    by_type = {c.get("type"): c for c in old or []}
    return [c.wire(observed_generation, now, by_type.get(c.type)) for c in sorted(new, key=lambda c: c.type)]


def transitions(new: list[Condition], old: list[dict[str, Any]] | None) -> list[Condition]:
    """Conditions whose status, reason or message changed: these become Kubernetes events."""
    by_type = {c.get("type"): c for c in old or []}
    out = []
    for c in new:
        prev = by_type.get(c.type)
        if prev is None or (prev.get("status"), prev.get("reason"), prev.get("message")) != (
            c.status, c.reason, c.message
        ):
            out.append(c)
    return out
