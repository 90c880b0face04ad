"""The plan of one resource as a value: what a pass applies, what it refuses, and what the status reports.

`plan.plan()` makes it (the pure core: parse, derive, check, render); the workload manager, the executor, the
status and the reconciler read it. Kept apart from `plan()` so that those readers do not sit above the
renderers and the policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import launch
from . import status_model as sm
from .conditions import Problem
from .constants import RENDER_VERSION
from .derive import Derived
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What the operator should do for one resource, and what it will report."""

    spec: QwenHiCacheServerSpec | None
    children: list[Obj] = field(default_factory=list)
    """What the reconciler applies, in order (the router's manifest is rendered by router.py, per pass)."""
    problems: list[Problem] = field(default_factory=list)
    derived: Derived | None = None
    """Everything derived from a spec that could be sized (None for an invalid or unsizable spec)."""
    meta: Obj = field(default_factory=dict)

    @property
    def blocked(self) -> bool:
        """True when nothing may be applied (a blocking problem, or an unparseable spec)."""
        return any(p.blocking for p in self.problems)

    @property
    def launch(self) -> sm.Launch | None:
        """`status.launch` of this plan (None when nothing could be derived)."""
        return launch_status(self.derived) if self.derived else None

    @property
    def sizing(self) -> sm.Sizing | None:
        """`status.sizing` of this plan."""
        return self.derived.sizing.as_status(self.derived.fit) if self.derived else None

    @property
    def cache(self) -> sm.Cache | None:
        """`status.cache` of this plan (None without a disk tier)."""
        return cache_status(self.derived) if self.derived and self.derived.spec.hicache.disk.enabled else None

    @property
    def target(self) -> str:
        """Rollout target every pod should run (see rollout.target)."""
        return self.derived.target if self.derived else ""


def launch_status(d: Derived) -> sm.Launch:
    """The derived launch configuration shown in status (what the pods actually run)."""
    tp = d.spec.runtime.tensor_parallel_size
    return sm.Launch(image=d.spec.runtime.image, tensor_parallel_size=tp, gpus_per_pod=tp // d.spec.nodes,
                     host_memory_per_rank_gb=d.launch.host_size_gb, args=d.args, render_version=RENDER_VERSION)


def cache_status(d: Derived) -> sm.Cache:
    """The disk cache's identity and stop budget, as reported in `status.cache`."""
    layout = d.layout
    return sm.Cache(fingerprint=layout.fingerprint, directory=launch.cache_dir(layout.fingerprint),
                    inputs=sm.FingerprintInputs.model_validate(layout.inputs),
                    drain_seconds=layout.drain.drain_seconds, flush_seconds=layout.drain.flush_seconds,
                    termination_grace_period_seconds=layout.drain.grace_seconds,
                    measured_write_bytes_per_second=d.measured_write_rate)
