"""SIMULATION ONLY: Prometheus text in the shape SGLang 0.5.23 exposes with ``--enable-metrics``.

Names are the runtime's; labels are ``model_name`` and ``engine_type`` (plus ``cache_source`` on
``sglang:cached_tokens_total``) as its tokenizer collector sets them. Counters are created on
first increment, like prometheus_client's labelled counters, so a scraper sees them appear.
Counter keys: ``name`` or ``name/cache_source``; a name with a ``:`` already has its namespace.
"""

from __future__ import annotations

COUNTER_HELP = {
    "cached_tokens_total": "Number of cached prompt tokens by source (device/host/storage).",
    "prefetched_tokens_total": "Prompt tokens successfully transferred from L3 storage into host memory.",
    "backuped_tokens_total": "Number of backuped tokens.",
}


def _name(key: str) -> str:
    return key if ":" in key else f"sglang:{key}"


def _labels(base: dict[str, str], **extra: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in {**base, **extra}.items())


def render(model: str, counters: dict[str, int], gauges: dict[str, int]) -> str:
    base = {"model_name": model, "engine_type": "unified"}
    lines: list[str] = []
    for key, value in sorted(gauges.items()):
        lines += [f"# TYPE {_name(key)} gauge", f"{_name(key)}{{{_labels(base)}}} {float(value)}"]
    typed: set[str] = set()
    for key, value in sorted(counters.items()):
        if value <= 0:
            continue
        name, _, source = key.partition("/")
        if name not in typed:
            typed.add(name)
            lines += [f"# HELP {_name(name)} {COUNTER_HELP.get(name, name)}", f"# TYPE {_name(name)} counter"]
        labels = _labels(base, cache_source=source) if source else _labels(base)
        lines.append(f"{_name(name)}{{{labels}}} {float(value)}")
    return "\n".join(lines) + "\n"
