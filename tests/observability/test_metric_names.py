"""Every metric the dashboard and the rules read exists where they say, with the labels they use.

`sglang:*` names and their label names come from the pinned, patched wheel's own declarations
(harness.sim.metrics parses them); `qwen_hicache_*` from the operator's registry and the cache-usage
sidecar's script. A renamed runtime metric, a label the runtime does not set, or a dashboard edited by
hand fail here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY
from qwen_hicache import diskusage, metrics  # noqa: F401 - registers the operator's metrics

from harness.prometheus import dashboard
from harness.sim.metrics import wheel_metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts/qwen-hicache-operator/files/prometheus-rules.yaml"
SCRAPE_LABELS = {"namespace", "pod", "server", "job", "instance"}
_SELECTOR = re.compile(r"\b((?:sglang|qwen_hicache):?[a-zA-Z0-9_:]*)(\{[^}]*\})?")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|on|ignoring)\s*\(([^)]*)\)")
_SUFFIXES = ("_bucket", "_sum", "_count")


def _expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [(r.get("alert") or r["record"], r["expr"]) for g in groups for r in g["rules"]]
    return dashboard.queries() + rules


def _recorded() -> set[str]:
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}


def _operator_metrics() -> dict[str, set[str]]:
    """Sample names of the operator's metrics -> their label names (plus the sidecar's)."""
    out: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        if family.name.startswith("qwen_hicache"):
            labels = set(getattr(REGISTRY._names_to_collectors.get(family.name), "_labelnames", ()))  # noqa: SLF001
            kinds = {"counter": ("_total",), "histogram": _SUFFIXES}.get(family.type, ("",))
            for suffix in kinds:
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out | _sidecar_metrics()


def _sidecar_metrics() -> dict[str, set[str]]:
    """The sidecar script's `put(name, value, help, **labels)` calls: name -> label names (multi-line ones too)."""
    calls = [n for n in ast.walk(ast.parse(diskusage.SCRIPT)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "put" and isinstance(n.args[0], ast.Constant)]  # fmt: skip
    return {c.args[0].value: {k.arg for k in c.keywords if k.arg != "kind"} for c in calls}


def _wheel_labels(name: str) -> set[str] | None:
    spec = wheel_metrics()
    for suffix in ("", *_SUFFIXES):
        base = name.removesuffix(suffix) if suffix else name
        if base in spec.metrics:
            return set(spec.labelnames(base)) | ({"le"} if suffix == "_bucket" else set())
    return None


def test_dashboard_json_is_generated() -> None:
    assert dashboard.DASHBOARD.read_text() == dashboard.render_json(), "run: python -m harness.prometheus.dashboard"


def test_every_metric_and_label_exists() -> None:
    operator, recorded, problems = _operator_metrics(), _recorded(), []
    for where, expr in _expressions():
        names = set()
        for name, matchers in _SELECTOR.findall(expr):
            if name in recorded:
                continue
            known = _wheel_labels(name) if name.startswith("sglang:") else operator.get(name)
            if known is None:
                problems.append(f"{where}: {name} is not defined")
                continue
            names.add(name)
            for label in _MATCHER.findall(matchers or ""):
                if label not in known | SCRAPE_LABELS:
                    problems.append(f"{where}: {name} has no label {label} (it has {sorted(known)})")
        usable = set().union(*(((_wheel_labels(n) if n.startswith("sglang:") else operator[n]) or set())
                               for n in names)) | SCRAPE_LABELS  # fmt: skip
        for group in _GROUPING.findall(expr):
            for label in filter(None, (s.strip() for s in group.split(","))):
                if label not in usable:
                    problems.append(f"{where}: groups by {label}, which none of {sorted(names)} has")
    assert not problems, "\n".join(problems)


def test_the_check_catches_an_unknown_metric() -> None:
    assert _wheel_labels("sglang:cached_tokens_total") >= {"cache_source", "model_name"}
    assert _wheel_labels("sglang:hicache_storage_used_bytes") is None  # the runtime has no such metric
    assert "tp_rank" not in _wheel_labels("sglang:cached_tokens_total")


def test_the_runtime_series_the_operators_engine_client_reads_are_the_wheels() -> None:
    """engine.cache_metrics keys (`name{source}`) name series of the pinned, patched wheel; the disk write counters
    are per TP rank (the client sums the ranks' bytes and takes the longest rank's seconds)."""
    from qwen_hicache import engine, rollout

    for key in (rollout.STORAGE_COUNTER, engine.WRITTEN_BYTES, engine.WRITE_SECONDS):
        assert _wheel_labels(key.split("{")[0]) is not None, key
    for key in (engine.WRITTEN_BYTES, engine.WRITE_SECONDS):
        assert "tp_rank" in _wheel_labels(key.split("{")[0])
    assert "cache_source" in _wheel_labels(rollout.STORAGE_COUNTER.split("{")[0])
