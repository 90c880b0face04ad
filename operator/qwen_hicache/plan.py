"""The pure core: resource body -> validated spec -> sizing -> policy -> desired objects and launch status.

The Kopf handlers and the CLI both call `plan()`; nothing here touches the network or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from . import launch, policies, render, rollout
from .geometry import GeometryError
from .sizing import SizingError, check_fit, compute_sizing
from .spec import QwenHiCacheServerSpec, name_problem

Obj = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What the operator should do for one resource, and what it will report."""

    spec: QwenHiCacheServerSpec | None
    objects: list[Obj] = field(default_factory=list)
    problems: list[policies.Problem] = field(default_factory=list)
    launch: Obj = field(default_factory=dict)
    sizing: Obj = field(default_factory=dict)
    cache: Obj = field(default_factory=dict)
    target: str = ""
    """Rollout target every pod should run (see rollout.target_of)."""

    @property
    def blocked(self) -> bool:
        """True when nothing may be applied (a blocking problem, or an unparseable spec)."""
        return any(p.blocking for p in self.problems)


def format_validation_error(err: ValidationError) -> str:
    """One line per field error, with the camelCase path the user wrote."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "spec"
        parts.append(f"spec.{loc}: {e['msg']}")
    return "; ".join(parts)


def parse_spec(raw: Obj) -> QwenHiCacheServerSpec:
    """Validate a spec dict with exactly the rules the CRD carries."""
    return QwenHiCacheServerSpec.model_validate(raw)


def launch_status(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Obj:
    """The derived launch configuration shown in status (what the pods actually run)."""
    return {
        "image": spec.runtime.image,
        "tensorParallelSize": spec.runtime.tensor_parallel_size,
        "gpusPerPod": spec.runtime.tensor_parallel_size,
        "hostMemoryPerRankGB": sizing.host_size_gb,
        "args": launch.launch_args(spec, sizing),
        "renderVersion": render.RENDER_VERSION,
    }


def _sizing_problem(message: str) -> policies.Problem:
    return policies.Problem("SizingInvalid", message, condition="SizingValid")


def plan(meta: Obj, raw_spec: Obj, node_allocatable_bytes: int | None = None) -> Plan:
    """Everything the operator derives from one resource. Invalid input yields problems, not objects.

    `node_allocatable_bytes`: the smallest allocatable memory among the nodes the pods may land on, when the
    operator could read them (the spec's `runtime.nodeMemory` hint is checked by sizing itself)."""
    try:
        spec = parse_spec(raw_spec)
    except ValidationError as err:
        return Plan(None, problems=[policies.Problem("InvalidSpec", format_validation_error(err))])
    if message := name_problem(str(meta.get("name", ""))):
        return Plan(spec, problems=[policies.Problem("InvalidName", message)])
    try:
        return _plan_valid(meta, spec, node_allocatable_bytes)
    except Exception as err:  # noqa: BLE001 - no input may crash the operator: report it as a condition instead
        return Plan(spec, problems=[policies.Problem(
            "PlanFailed", f"the operator cannot evaluate this spec ({type(err).__name__}: {err}); please report it")])


def _plan_valid(meta: Obj, spec: QwenHiCacheServerSpec, node_allocatable_bytes: int | None) -> Plan:
    if early := policies.geometry_problems(spec):
        return Plan(spec, problems=early)
    try:
        sized = compute_sizing(spec)
    except (SizingError, GeometryError) as err:
        return Plan(spec, problems=[_sizing_problem(str(err))])
    except (ArithmeticError, ValueError) as err:  # e.g. an extreme size that overflows a float
        return Plan(spec, problems=[_sizing_problem(f"these sizes cannot be computed ({err}); check the host memory, "
                                                    "GPU memory and geometry values for extreme numbers")])
    sizing = sized.launch_sizing()
    fit = check_fit(sized, node_allocatable_bytes)
    problems = [_sizing_problem(m) for m in [*sized.problems, *fit]] + policies.evaluate(spec, sizing)
    problems.sort(key=lambda p: not p.blocking)
    layout = render.cache_layout(spec, sizing)
    objects = [] if any(p.blocking for p in problems) else render.render_all(meta, spec, sizing, layout)
    cache = cache_status(layout) if spec.hicache.disk.enabled else {}
    return Plan(spec, objects, problems, launch_status(spec, sizing), sized.as_status(), cache,
                rollout.target_of(spec))


def cache_status(layout: render.CacheLayout) -> Obj:
    """The disk cache's identity and stop budget, as reported in `status.cache`."""
    return {
        "fingerprint": layout.fingerprint,
        "directory": launch.cache_dir(layout.fingerprint),
        "inputs": layout.inputs,
        "drainSeconds": layout.drain.drain_seconds,
        "flushSeconds": layout.drain.flush_seconds,
        "terminationGracePeriodSeconds": layout.drain.grace_seconds,
    }
