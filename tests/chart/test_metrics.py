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
    assert _value("qwen_hicache_reconciles_total", namespace=ns, server="") == 2
    assert _value("qwen_hicache_reconcile_errors_total", namespace=ns, server="", error="RuntimeError") == 1
    assert _value("qwen_hicache_reconcile_duration_seconds_count", namespace=ns) == 2


def test_metrics_server_serves_the_registry() -> None:
    registry = CollectorRegistry()
    from prometheus_client import Counter

    Counter("probe_total", "a probe", registry=registry).inc()
    (port,) = free_ports(1)
    metrics.start_metrics_server(port, addr="127.0.0.1", registry=registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert "probe_total 1.0" in resp.read().decode()


def test_restart_status_changes_count_pods_and_rollouts_once() -> None:
    ns, server = "metrics-rollout", "qwen"
    rolling = {"id": "r1", "phase": "Rolling", "started": "2026-01-01T00:00:00Z", "done": [], "results": []}
    one = {**rolling, "done": ["qwen-1"],
           "results": [{"pod": "qwen-1", "warm": True, "storageTokens": 4032, "timeToReadySeconds": 70}]}
    done = {**one, "phase": "Complete", "finished": "2026-01-01T00:05:00Z", "done": ["qwen-1", "qwen-0"],
            "results": [*one["results"],
                        {"pod": "qwen-0", "warm": False, "storageTokens": 0, "timeToReadySeconds": 50}]}
    from qwen_hicache.status_model import Restart

    def typed(rs: dict | None) -> Restart | None:
        return Restart.model_validate(rs) if rs else None

    for old, new in ((None, rolling), (rolling, one), (one, one), (one, done), (done, done)):
        metrics.observe_restart_status(ns, server, typed(old), typed(new), "2026-01-01T00:06:00Z")
    assert _value("qwen_hicache_pod_restarts_total", namespace=ns, server=server, result="warm") == 1
    assert _value("qwen_hicache_pod_restarts_total", namespace=ns, server=server, result="cold") == 1
    assert _value("qwen_hicache_rollouts_total", namespace=ns, server=server, outcome="complete") == 1
    assert _value("qwen_hicache_rollout_duration_seconds_sum", namespace=ns, server=server, outcome="complete") == 300
    assert _value("qwen_hicache_rollout_phase", namespace=ns, server=server, phase="Complete") == 1
    assert _value("qwen_hicache_last_restart_restored_tokens", namespace=ns, server=server) == 0
    metrics.forget_server(ns, server)
    assert metrics.REGISTRY.get_sample_value("qwen_hicache_rollout_phase",
                                             {"namespace": ns, "server": server, "phase": "Complete"}) is None
