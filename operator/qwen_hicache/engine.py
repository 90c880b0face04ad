"""The operator's only calls to the runtime itself: the warm-start canary and the cache metrics.

Plain HTTP to the pod IP on the runtime port (the operator runs in-cluster). Short timeouts: a slow pod is
retried on the next reconcile instead of blocking a worker.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

TIMEOUT_SECONDS = 30.0
_METRIC = re.compile(r'^(sglang:[a-z_]+)(?:\{([^}]*)\})? ([0-9.eE+-]+)$', re.M)


@dataclass(frozen=True)
class CanaryResult:
    """What one canary request reported (None when the pod did not answer)."""

    prompt_tokens: int | None
    storage_tokens: int | None
    error: str | None = None


def generate(ip: str, port: int, text: str, timeout: float = TIMEOUT_SECONDS) -> CanaryResult:
    """One greedy, one-token completion; `cached_tokens_details` says where the prefix came from."""
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).encode()
    req = urllib.request.Request(f"http://{ip}:{port}/generate", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            meta = json.loads(resp.read()).get("meta_info") or {}
    except (OSError, urllib.error.URLError, ValueError) as err:
        return CanaryResult(None, None, f"{type(err).__name__}: {err}")
    details = meta.get("cached_tokens_details") or {}
    return CanaryResult(meta.get("prompt_tokens"), int(details.get("storage") or 0))


def cache_metrics(ip: str, port: int, timeout: float = 10.0) -> dict[str, float]:
    """Storage-related counters from `/metrics`, summed over labels (`name{cache_source=...}` kept apart).

    Storage counters come once per TP rank with the same token counts (each rank moves its shard of the
    same pages), so only rank 0 is counted: a sum would multiply them by the TP size.
    """
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    out: dict[str, float] = {}
    for name, labels, value in _METRIC.findall(text):
        if re.search(r'\btp_rank="(?!0")', labels or ""):
            continue
        source = re.search(r'cache_source="([a-z]+)"', labels or "")
        key = f"{name}{{{source.group(1)}}}" if source else name
        out[key] = out.get(key, 0.0) + float(value)
    return out
