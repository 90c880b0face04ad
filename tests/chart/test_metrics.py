"""The operator's reconcile metrics and their HTTP endpoint (what the chart's ServiceMonitor scrapes)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from qwen_hicache import metrics

from harness.devcluster import free_ports


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_track_reconcile_counts_successes_errors_and_duration() -> None:
    ns = "metrics-test"
    with metrics.track_reconcile(ns):
        pass
    with pytest.raises(RuntimeError), metrics.track_reconcile(ns):
        raise RuntimeError("apply failed")
    assert _value("qwen_hicache_reconciles_total", namespace=ns) == 2
    assert _value("qwen_hicache_reconcile_errors_total", namespace=ns, error="RuntimeError") == 1
    assert _value("qwen_hicache_reconcile_duration_seconds_count", namespace=ns) == 2


def test_metrics_server_serves_the_registry() -> None:
    registry = CollectorRegistry()
    from prometheus_client import Counter

    Counter("probe_total", "a probe", registry=registry).inc()
    (port,) = free_ports(1)
    metrics.start_metrics_server(port, addr="127.0.0.1", registry=registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert "probe_total 1.0" in resp.read().decode()
