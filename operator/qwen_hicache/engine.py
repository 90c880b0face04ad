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
WRITTEN_BYTES = "sglang:hicache_storage_written_bytes_total{pod}"
"""Page-file bytes the pod's disk tier made durable, all ranks (patch 0006's counter, summed)."""
WRITE_SECONDS = "sglang:hicache_storage_write_seconds_total{pod}"
"""Wall time of those commits, the longest of the ranks (they write their shards at the same time)."""
_POD_WIDE = {"sglang:hicache_storage_written_bytes_total": (WRITTEN_BYTES, sum),
             "sglang:hicache_storage_write_seconds_total": (WRITE_SECONDS, max)}
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
    same pages), so only rank 0 is counted: a sum would multiply them by the TP size. The disk tier's write
    counters are the exception: every rank writes its own bytes to the pod's volume, so the pod's are the sum
    of the ranks' bytes over the longest rank's commit time (WRITTEN_BYTES, WRITE_SECONDS).
    """
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    out: dict[str, float] = {}
    for name, labels, value in _METRIC.findall(text):
        if name in _POD_WIDE:
            key, combine = _POD_WIDE[name]
            out[key] = combine((out.get(key, 0.0), float(value)))
            continue
        if re.search(r'\btp_rank="(?!0")', labels or ""):
            continue
        source = re.search(r'cache_source="([a-z]+)"', labels or "")
        key = f"{name}{{{source.group(1)}}}" if source else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def write_rate(metrics: dict[str, float]) -> tuple[int, float] | None:
    """(bytes, seconds) the pod's disk tier wrote and took to make durable, from `cache_metrics`; None when the
    runtime does not export them (an older series) or has written nothing yet."""
    written, seconds = metrics.get(WRITTEN_BYTES), metrics.get(WRITE_SECONDS)
    if not written or not seconds:
        return None
    return int(written), float(seconds)
