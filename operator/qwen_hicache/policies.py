"""Small pure policy checks (cert-manager style) for what the schema cannot express.

Each check looks at one concern and returns a Problem or None. Blocking problems stop the operator from
applying anything (no half-valid workload); warnings become a condition and an event but do not block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import launch
from .spec import QwenHiCacheServerSpec, flag_name


@dataclass(frozen=True)
class Problem:
    """A reason the spec cannot (blocking) or should not (warning) be served as written."""

    reason: str
    message: str
    blocking: bool = True
    condition: str = "SpecValid"
    """The condition type this problem sets to False."""


Check = Callable[[QwenHiCacheServerSpec, launch.LaunchSizing], Problem | None]


def managed_flag_override(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Problem | None:
    """extraArgs may not repeat a flag derived from the spec: status, sizing and cache identity would lie."""
    managed = launch.managed_flags(spec, sizing)
    clash = sorted({f for f in map(flag_name, spec.runtime.extra_args) if f in managed})
    if not clash:
        return None
    return Problem(
        "ManagedFlagInExtraArgs",
        f"runtime.extraArgs sets {', '.join(clash)}, which the operator derives from the spec; "
        "set the corresponding spec field instead",
    )


def managed_env_override(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Problem | None:
    """The file tier's directory and cap belong to the operator (the volume layout depends on them)."""
    clash = sorted({e.name for e in spec.runtime.env} & launch.MANAGED_ENV)
    if not clash:
        return None
    return Problem(
        "ManagedEnvInSpec",
        f"runtime.env sets {', '.join(clash)}, which the operator manages; use hicache.disk instead",
    )


def duplicate_env(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Problem | None:
    """Kubernetes keeps only one value per name; a duplicate is almost always a mistake."""
    names = [e.name for e in spec.runtime.env]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if not dupes:
        return None
    return Problem("DuplicateEnv", f"runtime.env repeats {', '.join(dupes)}")


def write_back_not_persistent(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Problem | None:
    """`write_back` only writes pages to disk when the GPU evicts them: a restart finds a cold cache."""
    if not (spec.hicache.disk.enabled and spec.hicache.write_policy == "write_back"):
        return None
    return Problem(
        "WriteBackNotPersisted",
        "hicache.writePolicy write_back never writes un-evicted prefixes to the disk tier, so a restart "
        "cannot warm-start from disk; use write_through for a persistent cache",
        blocking=False,
        condition="CachePersistent",
    )


CHECKS: tuple[Check, ...] = (managed_flag_override, managed_env_override, duplicate_env, write_back_not_persistent)


def evaluate(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> list[Problem]:
    """Every problem found, blocking ones first."""
    found = [p for p in (check(spec, sizing) for check in CHECKS) if p]
    return sorted(found, key=lambda p: not p.blocking)
