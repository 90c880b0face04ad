"""Prometheus metrics for the operator's reconciles, served on their own port.

Why a separate port from Kopf's health endpoint: the probe must stay cheap and unauthenticated,
while metrics are scraped by Prometheus (optionally through the chart's ServiceMonitor); keeping them
apart lets a NetworkPolicy or a scrape config treat them differently.

Labels are bounded on purpose: the namespace (not the object name, which would leave a stale series
behind every deleted resource) and the outcome.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server

RECONCILES = Counter(
    "qwen_hicache_reconciles_total", "Reconciles of QwenHiCacheServer resources, by namespace.", ["namespace"]
)
RECONCILE_ERRORS = Counter(
    "qwen_hicache_reconcile_errors_total",
    "Reconciles that raised (including kopf.TemporaryError retries), by namespace and exception type.",
    ["namespace", "error"],
)
RECONCILE_SECONDS = Histogram(
    "qwen_hicache_reconcile_duration_seconds",
    "Wall time of one reconcile, successful or not.",
    ["namespace"],
    # A no-op reconcile is a few GETs (~10 ms); an apply of a StatefulSet plus status is ~100 ms;
    # anything near 10 s means the API server is struggling.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


@contextlib.contextmanager
def track_reconcile(namespace: str) -> Iterator[None]:
    """Count one reconcile of a resource in `namespace`, its duration, and whether it raised.

    Exceptions propagate unchanged (Kopf needs them to schedule retries); they are only counted.
    """
    started = time.perf_counter()
    RECONCILES.labels(namespace).inc()
    try:
        yield
    except BaseException as err:
        RECONCILE_ERRORS.labels(namespace, type(err).__name__).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(namespace).observe(time.perf_counter() - started)


def start_metrics_server(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    """Serve /metrics on `addr:port` from a daemon thread (it dies with the operator process)."""
    start_http_server(port, addr=addr, registry=registry)
