"""Prometheus metrics for the operator's reconciles and rollouts, served on their own port.

Why a separate port from Kopf's health endpoint: the probe must stay cheap and unauthenticated,
while metrics are scraped by Prometheus (optionally through the chart's ServiceMonitor); keeping them
apart lets a NetworkPolicy or a scrape config treat them differently.

Labels are bounded on purpose. `server` (the resource's name) is on every counter and on the
rollout-phase gauge: a cluster has a handful of servers, and `forget_server` drops a deleted one's
series so nothing stale lingers. Histograms keep `namespace` only where they run per reconcile (each
bucket is a series), and take `server` only for rollouts, which are rare. Pod names never become
labels (they are the server's name plus an ordinal, so the per-pod signal lives in status and in the
runtime's own metrics, labelled by the scrape).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .status_model import Restart

RECONCILES = Counter(
    "qwen_hicache_reconciles_total", "Reconciles of QwenHiCacheServer resources.", ["namespace", "server"]
)
RECONCILE_ERRORS = Counter(
    "qwen_hicache_reconcile_errors_total",
    "Reconciles that raised (including kopf.TemporaryError retries), by exception type.",
    ["namespace", "server", "error"],
)
RECONCILE_SECONDS = Histogram(
    "qwen_hicache_reconcile_duration_seconds",
    "Wall time of one reconcile, successful or not.",
    ["namespace"],
    # A no-op reconcile is a few GETs (~10 ms); an apply of a StatefulSet plus status is ~100 ms;
    # anything near 10 s means the API server is struggling.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
ROLLOUTS = Counter(
    "qwen_hicache_rollouts_total",
    "Rollouts (cache-aware rolling restarts) that ended, by outcome: complete or paused.",
    ["namespace", "server", "outcome"],
)
ROLLOUT_SECONDS = Histogram(
    "qwen_hicache_rollout_duration_seconds",
    "From a rollout's start to its last pod verified (complete) or to its pause.",
    ["namespace", "server", "outcome"],
    # One pod restart of a large model is minutes (weights load, CUDA graphs); a fleet is hours.
    buckets=(30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800),
)
POD_RESTARTS = Counter(
    "qwen_hicache_pod_restarts_total",
    "Pods restarted by a rollout and checked with the canary, by result: warm (served from disk), partial "
    "(some of the canary's pages from disk, not all), cold (no disk hit on the same cache namespace) or "
    "new_namespace (a configuration change: cold by design).",
    ["namespace", "server", "result"],
)
POD_READY_SECONDS = Histogram(
    "qwen_hicache_pod_restart_ready_seconds",
    "From deleting a pod to its replacement being Ready, per restarted pod.",
    ["namespace", "server"],
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
ROLLOUT_PHASE = Gauge(
    "qwen_hicache_rollout_phase",
    "1 for the current phase of the server's last rollout (Rolling, Paused, Complete), 0 for the others.",
    ["namespace", "server", "phase"],
)
RESTORED_TOKENS = Gauge(
    "qwen_hicache_last_restart_restored_tokens",
    "Canary tokens the last restarted pod of the server served from disk (0: it came back cold).",
    ["namespace", "server"],
)
PHASES = ("Rolling", "Paused", "Complete")
_SERVER_METRICS = (RECONCILES, RECONCILE_ERRORS, ROLLOUTS, ROLLOUT_SECONDS, POD_RESTARTS, POD_READY_SECONDS,
                   ROLLOUT_PHASE, RESTORED_TOKENS)  # fmt: skip


@contextlib.contextmanager
def track_reconcile(namespace: str, server: str = "") -> Iterator[None]:
    """Count one reconcile of a resource, its duration, and whether it raised.

    Exceptions propagate unchanged (Kopf needs them to schedule retries); they are only counted.
    """
    started = time.perf_counter()
    RECONCILES.labels(namespace, server).inc()
    try:
        yield
    except BaseException as err:
        RECONCILE_ERRORS.labels(namespace, server, type(err).__name__).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(namespace).observe(time.perf_counter() - started)


def observe_rollout(namespace: str, server: str, duration_seconds: float, outcome: str) -> None:
    """A rollout ended: `outcome` is "complete" or "paused"."""
    ROLLOUTS.labels(namespace, server, outcome).inc()
    ROLLOUT_SECONDS.labels(namespace, server, outcome).observe(max(duration_seconds, 0.0))


def observe_pod_restart(namespace: str, server: str, result: str, ready_seconds: float | None,
                        restored_tokens: int) -> None:  # fmt: skip
    """A restarted pod was checked: `result` is "warm", "partial", "cold" or "new_namespace"."""
    POD_RESTARTS.labels(namespace, server, result).inc()
    if ready_seconds is not None:
        POD_READY_SECONDS.labels(namespace, server).observe(max(ready_seconds, 0.0))
    RESTORED_TOKENS.labels(namespace, server).set(restored_tokens)


def _precreate(namespace: str, server: str) -> None:
    """Create the server's counters at 0 before their first increment.

    A series that appears already at 1 has no `increase()` in Prometheus, so the first cold restart
    would never alert; creating them when a rollout starts (minutes before any pod result) avoids it.
    """
    for result in ("warm", "partial", "cold", "new_namespace"):
        POD_RESTARTS.labels(namespace, server, result)
    for outcome in ("complete", "paused"):
        ROLLOUTS.labels(namespace, server, outcome)


def set_rollout_phase(namespace: str, server: str, phase: str | None) -> None:
    for p in PHASES:
        ROLLOUT_PHASE.labels(namespace, server, p).set(1 if p == phase else 0)


def _seconds(a: str | None, b: str | None) -> float:
    if not a or not b:
        return 0.0
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(b, fmt) - datetime.strptime(a, fmt)).total_seconds()


def observe_restart_status(namespace: str, server: str, old: Restart | None, new: Restart | None,
                           now: str) -> None:  # fmt: skip
    """Count what changed between two `status.restart` values (idempotent for an unchanged status).

    Works on the status alone, so it needs no hook inside the rollout state machine: new entries in
    `results` are restarted pods, a phase that turns Complete or Paused ends a rollout.
    """
    if not new:
        return
    _precreate(namespace, server)
    same = old is not None and old.id == new.id
    seen = len(old.results) if same else 0
    for r in new.results[seen:]:
        result = "new_namespace" if r.new_cache_namespace else _warmth_label(r)
        observe_pod_restart(namespace, server, result, r.time_to_ready_seconds, r.storage_tokens)
    phase, was = new.phase, old.phase if same else None
    if phase != was and phase in ("Complete", "Paused") and (new.results or new.done):
        observe_rollout(namespace, server, _seconds(new.started, new.finished or now), phase.lower())
    set_rollout_phase(namespace, server, phase)


def _warmth_label(r) -> str:
    if r.warmth == "Partial":
        return "partial"
    return "warm" if r.warm else "cold"


def forget_server(namespace: str, server: str) -> None:
    """Drop a deleted server's series (call from the delete handler)."""
    for metric in _SERVER_METRICS:
        for labels in [s.labels for m in metric.collect() for s in m.samples]:
            if labels.get("namespace") == namespace and labels.get("server") == server:
                names = metric._labelnames  # noqa: SLF001 - prometheus_client keeps them here
                with contextlib.suppress(KeyError):
                    metric.remove(*(labels[n] for n in names))


def start_metrics_server(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    """Serve /metrics on `addr:port` from a daemon thread (it dies with the operator process)."""
    start_http_server(port, addr=addr, registry=registry)
