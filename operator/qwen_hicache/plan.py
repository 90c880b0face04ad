"""The pure core: resource body -> validated spec -> sizing -> policy -> desired objects and launch status.

The Kopf handlers and the CLI both call `plan()`; nothing here touches the network or the clock.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from . import policies, render
from .derive import derive
from .geometry import GeometryError, resolve_geometry
from .plan_model import Plan
from .sizing import SizingError
from .spec import QwenHiCacheServerSpec, name_problem

Obj = dict[str, Any]


def objects(p: Plan) -> list[Obj]:
    """Every object the operator would apply, the router's manifest with no pod drained (`qwen-hicache
    render`); empty when blocked."""
    return render.render_all(p.meta, p.derived) if p.children and p.derived else []


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


def _sizing_problem(message: str) -> policies.Problem:
    return policies.Problem("SizingInvalid", message, condition="SizingValid")


def plan(meta: Obj, raw_spec: Obj, node_allocatable_bytes: int | None = None, node_gpus: int | None = None,
         measured_write_rate: int | None = None) -> Plan:
    """Everything the operator derives from one resource. Invalid input yields problems, not objects.

    `node_allocatable_bytes`: the smallest allocatable memory among the nodes the pods may land on, when the
    operator could read them (checked together with the spec's `runtime.nodeMemory` hint); `node_gpus`: the most
    allocatable GPUs any of those nodes has (a multi-node server's pods must each fit one);
    `measured_write_rate`: the disk tier's write rate the last rollout measured (status.cache), bytes/s: the
    flush budget assumes it when it is below hicache.disk.writeBytesPerSecond."""
    try:
        spec = parse_spec(raw_spec)
    except ValidationError as err:
        return Plan(None, problems=[policies.Problem("InvalidSpec", format_validation_error(err))])
    if message := name_problem(str(meta.get("name", ""))):
        return Plan(spec, problems=[policies.Problem("InvalidName", message)])
    try:
        return _plan_valid(meta, spec, node_allocatable_bytes, node_gpus, measured_write_rate)
    except Exception as err:  # noqa: BLE001 - no input may crash the operator: report it as a condition instead
        return Plan(spec, problems=[policies.Problem(
            "PlanFailed", f"the operator cannot evaluate this spec ({type(err).__name__}: {err}); please report it")])


def _plan_valid(meta: Obj, spec: QwenHiCacheServerSpec, node_allocatable_bytes: int | None,
                node_gpus: int | None, measured_write_rate: int | None = None) -> Plan:  # fmt: skip
    try:
        geometry = resolve_geometry(spec.model)
    except GeometryError as err:
        return Plan(spec, problems=[_sizing_problem(str(err))])
    if early := policies.geometry_problems(spec, geometry):
        return Plan(spec, problems=early)
    try:
        d = derive(spec, geometry, node_allocatable_bytes, node_gpus, measured_write_rate, str(meta.get("name", "")))
    except (SizingError, GeometryError) as err:
        return Plan(spec, problems=[_sizing_problem(str(err))])
    except (ArithmeticError, ValueError) as err:  # e.g. an extreme size that overflows a float
        return Plan(spec, problems=[_sizing_problem(f"these sizes cannot be computed ({err}); check the host memory, "
                                                    "GPU memory and geometry values for extreme numbers")])
    problems = [_sizing_problem(m) for m in d.problems] + policies.evaluate(d)
    problems.sort(key=lambda p: not p.blocking)
    children = [] if any(p.blocking for p in problems) else render.render_all(meta, d, manifest=False)
    return Plan(spec, children, problems, d, meta)
