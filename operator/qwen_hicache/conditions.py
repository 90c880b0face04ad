"""Status conditions: the one `Condition` type (metav1.Condition's shape) with its merge and transition rules.

`lastTransitionTime` changes only when a condition's status flips, so a no-op reconcile produces the
identical status and therefore no write. Conditions are a list-type map keyed by `type` in the CRD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .typed import ApiModel

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Problem:
    """A reason the spec cannot (blocking) or should not (warning) be served as written: the policies find them,
    a plan carries them, the status turns each into its condition."""

    reason: str
    message: str
    blocking: bool = True
    condition: str = "SpecValid"
    """The condition type this problem sets to False."""


class Condition(ApiModel):
    """One observation about the resource in the style of metav1.Condition."""

    type: str
    """SpecValid, SizingValid, CachePersistent, ImagePinned, CacheWarm, Ready, Progressing or Degraded."""
    status: Status
    reason: str
    """CamelCase reason, e.g. InvalidSpec, ApplyFailed, PodFailing, CrashLooping, ColdStart."""
    message: str
    """What happened and, when something is refused, what keeps running and how to fix it."""
    observed_generation: int | None = None
    """metadata.generation this condition was computed for."""
    last_transition_time: str | None = None
    """When `status` last flipped (RFC 3339)."""

    def stamped(self, observed_generation: int, now: str, previous: Condition | None) -> Condition:
        """The condition as stored, keeping the old transition time when the status did not flip."""
        changed = previous is None or previous.status != self.status
        when = now if changed else (previous.last_transition_time or now)
        return self.model_copy(update={"observed_generation": observed_generation, "last_transition_time": when})

    def same_as(self, other: Condition | None) -> bool:
        """Same status, reason and message (what an event reports)."""
        return other is not None and (other.status, other.reason, other.message) == (
            self.status, self.reason, self.message)


def merge(new: list[Condition], old: list[Condition] | None, observed_generation: int, now: str) -> list[Condition]:
    """New conditions in a stable order, each carrying its previous transition time when unchanged."""
    by_type = {c.type: c for c in old or []}
    return [c.stamped(observed_generation, now, by_type.get(c.type)) for c in sorted(new, key=lambda c: c.type)]


def transitions(new: list[Condition], old: list[Condition] | None) -> list[Condition]:
    """Conditions whose status, reason or message changed: these become Kubernetes events."""
    by_type = {c.type: c for c in old or []}
    return [c for c in new if not c.same_as(by_type.get(c.type))]


def condition(type_: str, status: Status, reason: str, message: str) -> Condition:
    """An observation (stamped with generation and time by `merge`)."""
    return Condition(type=type_, status=status, reason=reason, message=message)
