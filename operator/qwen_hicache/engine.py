"""The operator's one client of the pods it runs: the warm-start canary and the cache counters (runtime), the
worker lists (router), the disk usage (the `cache-usage` sidecar).

Plain HTTP to the pod IP (the operator runs in-cluster) through one pooled urllib3 client and one timeout
policy: connecting gets CONNECT_SECONDS and one retry (nothing was sent), reading gets the call's own budget
(READ_SECONDS) and no retry. A pod that does not answer is an answer (None, `{}` or an error result), never an
exception: it is asked again on the next reconcile instead of blocking a worker. Prometheus text is read with
`prometheus_client`'s parser.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import urllib3

from . import diskusage

CONNECT_SECONDS = 2.0
READ_SECONDS = {"generate": 30.0, "metrics": 10.0, "workers": 3.0, "usage": 2.0}
"""Per call: the canary may queue behind real requests; the router and the sidecar answer from memory."""
TIMEOUT_SECONDS = READ_SECONDS["generate"]
WRITTEN_BYTES = "sglang:hicache_storage_written_bytes_total{pod}"
"""Page-file bytes the pod's disk tier made durable, all ranks (patch 0006's counter, summed)."""
WRITE_SECONDS = "sglang:hicache_storage_write_seconds_total{pod}"
"""Wall time of those commits, the longest of the ranks (they write their shards at the same time)."""
_POD_WIDE = {"sglang:hicache_storage_written_bytes_total": (WRITTEN_BYTES, sum),
             "sglang:hicache_storage_write_seconds_total": (WRITE_SECONDS, max)}
DISCOVERY_ID_LABEL = "smg.ai/discovery-id"
_HTTP = urllib3.PoolManager(num_pools=64, maxsize=4,
                            retries=urllib3.Retry(total=1, connect=1, read=0, status=0, redirect=0, other=0))


class Unanswered(Exception):
    """The pod did not answer, or not with what the call expects."""


@dataclass(frozen=True)
class CanaryResult:
    """What one canary request reported (None when the pod did not answer)."""

    prompt_tokens: int | None
    storage_tokens: int | None
    error: str | None = None


def _call(ip: str, port: int, path: str, kind: str, timeout: float | None = None, body: Any = None) -> str:
    """One request under the policy; the body's text, or Unanswered (connection, timeout, non-2xx)."""
    read = READ_SECONDS[kind] if timeout is None else timeout
    try:
        resp = _HTTP.request("POST" if body is not None else "GET", f"http://{ip}:{port}{path}",
                             json=body, timeout=urllib3.Timeout(connect=min(CONNECT_SECONDS, read), read=read))
    except urllib3.exceptions.HTTPError as err:
        raise Unanswered(f"{type(err).__name__}: {err}") from err
    if resp.status >= 300:
        raise Unanswered(f"HTTP {resp.status} from {path}")
    return resp.data.decode()


def generate(ip: str, port: int, text: str, timeout: float | None = None) -> CanaryResult:
    """One greedy, one-token completion; `cached_tokens_details` says where the prefix came from."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    try:
        meta = json.loads(_call(ip, port, "/generate", "generate", timeout, body)).get("meta_info") or {}
    except (Unanswered, ValueError) as err:
        return CanaryResult(None, None, f"{type(err).__name__}: {err}")
    details = meta.get("cached_tokens_details") or {}
    return CanaryResult(meta.get("prompt_tokens"), int(details.get("storage") or 0))


def cache_metrics(ip: str, port: int, timeout: float | None = None) -> dict[str, float]:
    """Storage-related counters from `/metrics`, summed over labels (`name{cache_source=...}` kept apart).

    Storage counters come once per TP rank with the same token counts (each rank moves its shard of the
    same pages), so only rank 0 is counted: a sum would multiply them by the TP size. The disk tier's write
    counters are the exception: every rank writes its own bytes to the pod's volume, so the pod's are the sum
    of the ranks' bytes over the longest rank's commit time (WRITTEN_BYTES, WRITE_SECONDS).
    """
    try:
        samples = list(diskusage.samples(_call(ip, port, "/metrics", "metrics", timeout)))
    except (Unanswered, ValueError):
        return {}
    out: dict[str, float] = {}
    for s in samples:
        if not s.name.startswith("sglang:"):
            continue
        if s.name in _POD_WIDE:
            key, combine = _POD_WIDE[s.name]
            out[key] = combine((out.get(key, 0.0), s.value))
            continue
        if s.labels.get("tp_rank", "0") != "0":
            continue
        source = s.labels.get("cache_source", "")
        key = f"{s.name}{{{source}}}" if re.fullmatch("[a-z]+", source) else s.name
        out[key] = out.get(key, 0.0) + s.value
    return out


def write_rate(metrics: dict[str, float]) -> tuple[int, float] | None:
    """(bytes, seconds) the pod's disk tier wrote and took to make durable, from `cache_metrics`; None when the
    runtime does not export them (an older series) or has written nothing yet."""
    written, seconds = metrics.get(WRITTEN_BYTES), metrics.get(WRITE_SECONDS)
    if not written or not seconds:
        return None
    return int(written), float(seconds)


def router_workers(ip: str, port: int, timeout: float | None = None) -> dict[str, str] | None:
    """`{pod name: status}` from one router's `GET /workers` (None when it does not answer)."""
    try:
        body = json.loads(_call(ip, port, "/workers", "workers", timeout))
    except (Unanswered, ValueError):
        return None
    out = {}
    for w in body.get("workers") or []:
        pod = (w.get("labels") or {}).get(DISCOVERY_ID_LABEL) or w.get("url", "")
        out[pod] = "ready" if w.get("status") == "ready" and w.get("is_healthy") else str(w.get("status"))
    return out


def read_usage(ip: str, port: int = diskusage.PORT, timeout: float | None = None) -> diskusage.DiskUsage | None:
    """One pod's disk usage from its `cache-usage` sidecar, or None when it does not answer (yet)."""
    try:
        return diskusage.parse(_call(ip, port, "/metrics", "usage", timeout))
    except (Unanswered, ValueError):
        return None
