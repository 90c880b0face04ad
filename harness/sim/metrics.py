"""SIMULATION ONLY: Prometheus text exactly as SGLang 0.5.23 exposes it with ``--enable-metrics``.

The names, types and label names are not written here: ``wheel_metrics()`` reads them from the pinned,
patched wheel's own declarations (``observability/metrics_collector.py``: every ``Counter``/``Gauge``/
``Histogram`` call with its ``labelnames``; the base label dicts the three collectors are built with in
``tokenizer_metric_labels``, ``SchedulerMetricsCollector.init_new`` and the storage attachment; the series
the storage collector pre-creates at zero). ``render`` refuses a name the wheel does not define or a
label set that differs from the wheel's, so the stand-in cannot drift kinder than the runtime.

What the runtime does and the stand-in copies: tokenizer metrics (``cached_tokens_total`` by
``cache_source``, prompt tokens, requests) once per server; scheduler gauges (host pool) from the stats
rank only (``tp_rank="0"``); storage counters once per TP rank (each rank's controller backs up and
prefetches its own shard of the same token ranges, so every rank reports the same token counts); labelled
counters appear on first increment except those the storage collector pre-creates. Names under
``qwen_hicache_sim:`` are the harness's own (never read by the dashboard or the rules).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

COLLECTOR_FILE = "sglang/srt/observability/metrics_collector.py"
STORAGE_ATTACH_FILE = "sglang/srt/mem_cache/unified_cache/storage_attachment.py"
SIM_PREFIX = "qwen_hicache_sim:"
_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
          "GaugeHistogram": "gaugehistogram"}  # fmt: skip
ROLES = {"TokenizerMetricsCollector": "tokenizer", "SchedulerMetricsCollector": "scheduler",
         "StorageMetricsCollector": "storage", "RadixCacheMetricsCollector": "radix"}  # fmt: skip


@dataclass(frozen=True)
class WheelMetric:
    """One metric as the wheel declares it."""

    name: str
    kind: str
    role: str  # which collector: tokenizer, scheduler, storage, radix, or other
    extra_labels: tuple[str, ...]  # beyond the collector's base labels
    base: bool  # whether labelnames include the collector's base labels
    precreated: tuple[str, ...] = ()  # values of the one extra label created at zero


@dataclass(frozen=True)
class WheelSpec:
    metrics: dict[str, WheelMetric]
    base_labels: dict[str, tuple[str, ...]]  # role -> unconditional base label names

    def labelnames(self, name: str) -> tuple[str, ...]:
        m = self.metrics[name]
        return (*(self.base_labels.get(m.role, ()) if m.base else ()), *m.extra_labels)


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _labelnames(node: ast.AST | None) -> tuple[bool, tuple[str, ...]]:
    """(uses the base labels, extra constant label names) of a ``labelnames=`` expression."""
    if node is None:
        return False, ()
    text = ast.unparse(node)
    extras = tuple(s for n in ast.walk(node) if (s := _str(n)) is not None)
    return "labels.keys()" in text or text == "labels", extras


def _dict_keys(func: ast.AST) -> tuple[str, ...]:
    """Keys of the first ``labels = {...}`` (or returned) dict literal in a function."""
    for node in ast.walk(func):
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "labels" for t in node.targets)
        if (named or isinstance(node, ast.Return)) and isinstance(node.value, ast.Dict):
            return tuple(k for k in (_str(k) for k in node.value.keys if k) if k)
    raise LookupError(f"no labels dict in {getattr(func, 'name', func)}")


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _precreated(cls: ast.ClassDef, attrs: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """``for reason in (...): self.<attr>.labels(**self.labels, reason=reason)`` -> {metric: values}.

    A bare statement ``self.<attr>.labels(**self.labels)`` creates the one series of a metric without extra
    labels: {metric: ("",)}.
    """
    out: dict[str, tuple[str, ...]] = {}
    for stmt in (n for n in ast.walk(cls) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)):
        f, keywords = stmt.value.func, stmt.value.keywords
        bare = [k.arg for k in keywords] == [None] and not stmt.value.args
        labelled = isinstance(f, ast.Attribute) and f.attr == "labels" and isinstance(f.value, ast.Attribute)
        if bare and labelled and f.value.attr in attrs:
            out[attrs[f.value.attr]] = ("",)
    for loop in (n for n in ast.walk(cls) if isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple)):
        values = tuple(v for v in (_str(e) for e in loop.iter.elts) if v)
        for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
            f = call.func
            labelled = isinstance(f, ast.Attribute) and f.attr == "labels" and isinstance(f.value, ast.Attribute)
            if labelled and f.value.attr in attrs:
                out[attrs[f.value.attr]] = values
    return out


def parse_wheel_metrics(tree: Path) -> WheelSpec:
    """Every ``sglang:*`` metric the wheel's collectors declare, with its type and label names."""
    source = ast.parse((Path(tree) / COLLECTOR_FILE).read_text())
    metrics: dict[str, WheelMetric] = {}
    for cls in (n for n in source.body if isinstance(n, ast.ClassDef)):
        role, attrs = ROLES.get(cls.name, "other"), {}
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _KINDS):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = _str(kw.get("name")) if "name" in kw else None
            if not name or not name.startswith("sglang:"):
                continue
            base, extras = _labelnames(kw.get("labelnames"))
            metrics[name] = WheelMetric(name, _KINDS[node.func.id], role, extras, base)
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                kw = {k.arg: k.value for k in node.value.keywords}
                target = node.targets[0]
                if isinstance(target, ast.Attribute) and (name := _str(kw.get("name", ast.Constant(None)))):
                    attrs[target.attr] = name
        for name, values in _precreated(cls, attrs).items():
            metrics[name] = WheelMetric(**{**metrics[name].__dict__, "precreated": values})
    attach = ast.parse((Path(tree) / STORAGE_ATTACH_FILE).read_text())
    base_labels = {
        "tokenizer": _dict_keys(_function(source, "tokenizer_metric_labels")),
        "scheduler": _dict_keys(_function(source, "init_new")),
        "storage": _dict_keys(_function(attach, "_resolve_metrics_collector")),
        "radix": _dict_keys(_function(source, "radix_cache_metric_labels")),
    }
    return WheelSpec(metrics, base_labels)


@functools.cache
def wheel_metrics() -> WheelSpec:
    """The pinned, patched wheel's metrics (the tree is built once per machine)."""
    import os

    from harness.sim import sglang_tree

    return parse_wheel_metrics(Path(os.environ.get(sglang_tree.TREE_ENV) or sglang_tree.patched_sglang_tree()))


def _label_values(role: str, model: str, tp_rank: int) -> dict[str, str]:
    """The base label values of one collector, as the runtime fills them on a single-node TP deployment."""
    return {
        "tokenizer": {"model_name": model, "engine_type": "unified"},
        "scheduler": {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                      "moe_ep_rank": "0"},
        "storage": {"storage_backend": "file", "tp_rank": str(tp_rank), "dp_rank": "0", "pp_rank": "0",
                    "pp_size": "1", "attn_cp_rank": "0", "attn_cp_size": "1"},
    }[role]  # fmt: skip


def _fmt(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _series(spec: WheelSpec, name: str, model: str, tp_size: int, values: dict[str, float]) -> list[str]:
    """Sample lines of one metric; ``values`` maps the extra label's value ('' if none) to the value."""
    m = spec.metrics[name]
    if len(m.extra_labels) > 1:
        raise ValueError(f"{name}: the stand-in renders at most one extra label, the wheel has {m.extra_labels}")
    sample = name + "_total" if m.kind == "counter" and not name.endswith("_total") else name
    ranks = range(tp_size) if m.role == "storage" else range(1)
    lines = []
    for rank in ranks:
        for value_of_extra, value in sorted(values.items()):
            labels = _label_values(m.role, model, rank)
            if m.extra_labels:
                labels[m.extra_labels[0]] = value_of_extra
            if tuple(labels) != spec.labelnames(name):
                raise ValueError(f"{name}: labels {tuple(labels)} differ from the wheel's {spec.labelnames(name)}")
            lines.append(f"{sample}{{{_fmt(labels)}}} {float(value)}")
    return lines


def render(model: str, counters: dict[str, int], gauges: dict[str, int], tp_size: int = 1,
           storage: bool = False, spec: WheelSpec | None = None) -> str:
    """Exposition text. Keys: ``name`` or ``name/<value of its one extra label>``, without ``sglang:``.

    ``storage``: a storage backend is attached, so the storage collector exists (and its pre-created series).
    """
    spec = spec or wheel_metrics()
    grouped: dict[str, dict[str, float]] = {}
    own: list[str] = []
    for key, value in sorted({**gauges, **counters}.items()):
        if key.startswith(SIM_PREFIX):
            own += [f"# TYPE {key.removesuffix('_total')} counter", f"{key} {float(value)}"]
            continue
        name, _, extra = key.partition("/")
        full = "sglang:" + name
        if full not in spec.metrics:
            raise KeyError(f"{full} is not a metric of the pinned runtime")
        if key in counters and value <= 0:
            continue  # labelled counters appear on first increment
        grouped.setdefault(full, {})[extra] = value
    for name, metric in spec.metrics.items():
        if storage and metric.role == "storage":  # the collector creates these series at zero
            for v in metric.precreated:
                grouped.setdefault(name, {}).setdefault(v, 0)
    lines: list[str] = []
    for name, values in sorted(grouped.items()):
        m = spec.metrics[name]
        lines += [f"# HELP {name} {name}", f"# TYPE {name.removesuffix('_total')} {m.kind}"]
        lines += _series(spec, name, model, tp_size, values)
    return "\n".join(lines + own) + "\n"
