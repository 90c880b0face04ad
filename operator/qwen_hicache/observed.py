"""What one reconcile saw and did besides the plan: the record the executor fills and the status reads."""

from __future__ import annotations

from dataclasses import dataclass

from . import status_model as sm
from .diskusage import DiskUsage

CRASH_LOOPING, POD_FAILING = "CrashLooping", "PodFailing"


@dataclass(frozen=True)
class PodProblem:
    """A pod's trouble as Degraded reports it: `reason` is CRASH_LOOPING (a container in CrashLoopBackOff) or
    POD_FAILING (an init container failed, e.g. the cache guard refused a directory)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What this reconcile saw and did, besides the plan."""

    sts: dict | None = None
    """The live StatefulSet (as applied or found): readiness of what runs."""
    restart: sm.Restart | None = None
    apply_error: str | None = None
    pod_problems: tuple[PodProblem, ...] = ()
    admin_secret: str | None = None
    router: sm.Router | None = None
    disk_usage: tuple[tuple[str, DiskUsage | None], ...] = ()
    """(pod, its cache-usage sidecar's numbers or None) per running pod; see `replica_cache`."""
    groups: tuple[sm.GroupStatus, ...] | None = None
    """Multi-node servers: each LeaderWorkerSet group (group_status.group_entries); None for a StatefulSet."""
    claim_history: tuple[str, ...] = ()
    """Earlier cache namespaces the cache volume claims record, newest first (see claim_history)."""


