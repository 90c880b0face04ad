"""A real Prometheus against the stand-ins: every dashboard query and every rule returns data.

Two engine stand-ins (TP 2, real HiCacheFile disk tier with a cap), their cache-usage sidecars and the
operator's metrics endpoint are scraped every second; traffic overflows device and host so prompts come
back from disk; a rolling restart brings one pod back warm and one cold (its volume emptied), which
pauses the rollout; a few reconciles fail. Bounded: about a minute, everything stopped at the end.
"""

from __future__ import annotations

import time

import pytest

from harness.prometheus import dashboard
from harness.prometheus.stand import Stand, grafana_expr

# Series the runtime creates on first increment and this scenario never increments (buffer-mode only).
NO_DATA_BY_DESIGN = ("sglang:hicache_backup_dropped_tokens_total",)
# The measured part of each alert (what its threshold compares), which must have data here.
SIGNALS = {
    "QwenHiCacheRestartCameBackCold": 'increase(qwen_hicache_pod_restarts_total{result="cold"}[30m])',
    "QwenHiCacheRolloutPaused": 'qwen_hicache_rollout_phase{phase="Paused"}',
    "QwenHiCacheDiskTierEvicting": "increase(sglang:hicache_storage_evicted_pages_total[1h])",
    "QwenHiCacheVolumeAlmostFull": "qwen_hicache_disk_volume_used_bytes / qwen_hicache_disk_volume_size_bytes",
    "QwenHiCacheStorageHitShareCollapsed": "qwen_hicache:storage_hit_share:ratio1d",
    "QwenHiCacheDiskPagesDiscarded": "increase(sglang:hicache_storage_page_discards_total[30m])",
    "QwenHiCacheDiskReadErrors": "rate(sglang:hicache_storage_read_errors_total[10m])",
    "QwenHiCacheDiskHitsRefusedHostFull":
        'increase(sglang:storage_prefetch_unfulfilled_tokens_total{reason="host_capacity",tp_rank="0"}[30m])',
    "QwenHiCacheBackupsDropped": None,  # see NO_DATA_BY_DESIGN
    "QwenHiCacheReconcileErrors": "rate(qwen_hicache_reconcile_errors_total[10m])",
    "QwenHiCachePreStopFlushFailed": "qwen_hicache_prestop_info",  # the rollout's stops flushed: outcome ok
}
FIRING_HERE = ("QwenHiCacheRestartCameBackCold", "QwenHiCacheRolloutPaused", "QwenHiCacheReconcileErrors")


@pytest.fixture(scope="module")
def stand(tmp_path_factory: pytest.TempPathFactory):
    with Stand(tmp_path_factory.mktemp("stand")) as s:
        s.reconciles(20)
        s.traffic(12)
        s.rollout("r1", cold_pods=("qwen-0",))  # qwen-1 first (warm), then qwen-0 (cold: paused)
        for _ in range(3):  # errors on several scrapes (a counter's first sample has no increase)
            s.reconciles(4, errors=1)
            s.traffic(2.5)
        s.traffic(4)
        time.sleep(4)  # a few more scrapes and rule evaluations
        yield s


def _wait_for(stand: Stand, expr: str, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = stand.query(expr)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_every_target_is_scraped(stand: Stand) -> None:
    health = stand.targets_up()
    assert len(health) == 5 and set(health.values()) == {"up"}, health


def test_every_dashboard_query_returns_data(stand: Stand) -> None:
    empty = []
    for title, expr in dashboard.queries():
        if any(name in expr for name in NO_DATA_BY_DESIGN):
            continue
        if not _wait_for(stand, grafana_expr(expr, range_="5m"), timeout=5):
            empty.append(f"{title}: {expr}")
    assert not empty, "\n".join(empty)


def test_the_cache_shares_and_restarts_are_what_happened(stand: Stand) -> None:
    share = {r["metric"]["cache_source"]: float(r["value"][1]) for r in stand.query(
        'sum by (cache_source) (increase(sglang:cached_tokens_total[5m])) / ignoring(cache_source) group_left '
        'sum(increase(sglang:prompt_tokens_total[5m]))')}
    assert set(share) == {"device", "host", "storage"} and all(0 < v < 1 for v in share.values()), share
    restarts = {r["metric"]["result"]: float(r["value"][1]) for r in stand.query("qwen_hicache_pod_restarts_total")}
    assert restarts == {"warm": 1.0, "partial": 0.0, "cold": 1.0, "new_namespace": 0.0}
    ratio = {r["metric"]["pod"]: float(r["value"][1]) for r in stand.query('qwen_hicache:disk_used_ratio{tp_rank="0"}')}
    assert 0 < ratio["qwen-0"] < 1 and 0 < ratio["qwen-1"] <= 1.0, ratio  # the small cap is enforced by the runtime


def test_every_rule_evaluates_and_its_signal_has_data(stand: Stand) -> None:
    rules = {r.get("name"): r for r in stand.rules()}
    bad = {name: r.get("lastError") for name, r in rules.items() if r.get("health") != "ok"}
    assert not bad, bad
    assert set(SIGNALS) == {n for n, r in rules.items() if r["type"] == "alerting"}
    for name, signal in SIGNALS.items():
        if signal is None:
            continue
        assert _wait_for(stand, signal), f"{name}: {signal} has no data"
    for record in (n for n, r in rules.items() if r["type"] == "recording"):
        assert _wait_for(stand, record), f"recording rule {record} has no data"


def test_the_alerts_this_scenario_causes_are_active(stand: Stand) -> None:
    deadline = time.monotonic() + 20
    while True:
        states = {r["name"]: r["state"] for r in stand.rules() if r["type"] == "alerting"}
        if all(states[a] in ("pending", "firing") for a in FIRING_HERE) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(states[a] in ("pending", "firing") for a in FIRING_HERE), states
    assert states["QwenHiCacheBackupsDropped"] == "inactive", states
    assert states["QwenHiCachePreStopFlushFailed"] == "inactive", states

