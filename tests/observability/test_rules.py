"""The chart's alerts fire for the right reasons, on series shaped exactly as the runtime emits them.

`promtool test rules` runs every alert on a firing case and on look-alikes where nothing may fire. The runtime's
series are not written here: series_probe.py runs, minute by minute, the pinned patched wheel's own code (the
tokenizer and storage metrics collectors, HiCacheFile with its LRU evictor at the cap), the preStop hook's
script and the cache-usage sidecar's script, and scrapes what they expose -- counters that appear on their first
increment, a restarted pod as a new series after a gap, a preStop's record exported by the next pod, the
evictor's saw-tooth between 0.9 and 1.0 of the cap, idle hours. The
operator's own series (restarts, rollout phase, reconcile errors) are written here as its metrics module creates
them (at zero when a rollout starts). The rules as they were before issue 24 run on the same series and must
stay silent where the runtime's shapes defeated them. promtool is built from the Go module sources pinned in
harness/prometheus/ (once per machine).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.prometheus import build
from harness.sim import sglang_tree

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts/qwen-hicache-operator/files/prometheus-rules.yaml"
RUNBOOKS = ROOT / "docs/runbooks.md"
SRV = 'namespace="ml",server="qwen"'
POD_LABELS = {"namespace": "ml", "server": "qwen", "pod": "qwen-0"}

# Scenarios the runtime's own code plays (series_probe.py); one minute per step.
TRAFFIC = {"prompts": 20000, "storage": 0.6, "host": 0.1, "device": 0.1}
LOW = {**TRAFFIC, "storage": 0.04}
COLD = {**TRAFFIC, "storage": 0.0}
SCENARIOS: dict[str, dict] = {
    # 8 h of traffic with 60% from disk, a restart into a new cache namespace: nothing more from disk.
    "collapse_after_restart": {"segments": [{"minutes": 480, **TRAFFIC}, {"minutes": 3, "down": True},
                                            {"minutes": 90, **COLD}]},
    # 4 h at 60%, 2 h idle (the 10-minute share is 0/0 there), then 5%.
    "collapse_after_idle": {"segments": [{"minutes": 240, **TRAFFIC}, {"minutes": 120},
                                         {"minutes": 90, **TRAFFIC, "storage": 0.05}]},
    # Healthy: 60% from disk with idle hours, a warm restart, disk writes below the cap.
    "healthy": {"cap_pages": 4000, "segments": [
        {"minutes": 180, **TRAFFIC, "disk_pages": 4}, {"minutes": 600},
        {"minutes": 120, **TRAFFIC, "disk_pages": 4}, {"minutes": 3, "down": True, "prestop": "ok"},
        {"minutes": 60, **TRAFFIC, "disk_pages": 4}, {"minutes": 60}, {"minutes": 60, **TRAFFIC}]},
    "always_low": {"segments": [{"minutes": 480, **LOW}]},
    # The working set exceeds the cap: the evictor evicts every few minutes, across a restart.
    "evicting": {"cap_pages": 100, "segments": [{"minutes": 120, "disk_pages": 5}, {"minutes": 3, "down": True},
                                                {"minutes": 120, "disk_pages": 5}]},
    # One burst over the cap, then the tier stays full and quiet.
    "evicted_once": {"cap_pages": 100, "segments": [{"minutes": 25, "disk_pages": 5}, {"minutes": 240}]},
    "below_cap": {"cap_pages": 1000, "segments": [{"minutes": 300, "disk_pages": 2}]},
    "discard": {"segments": [{"minutes": 30, "disk_pages": 4}, {"minutes": 1, "disk_pages": 4, "damage": 1},
                             {"minutes": 10, "disk_pages": 4}]},
    "read_errors": {"segments": [{"minutes": 10, "disk_pages": 4}, {"minutes": 30, "disk_pages": 4, "eio": True}]},
    "read_error_once": {"segments": [{"minutes": 10, "disk_pages": 4}, {"minutes": 1, "disk_pages": 4, "eio": True},
                                     {"minutes": 40, "disk_pages": 4}]},
    # Buffer mode (extraArgs): 30 min without a drop (no series at all), then the first drop.
    "dropped": {"segments": [{"minutes": 30, "disk_pages": 1}, {"minutes": 1, "dropped": 640},
                             {"minutes": 5, "disk_pages": 1}]},
    # Restarts whose preStop (the pod's own hook script) ended as named; the record shows with the next pod.
    # Disk hits found by the storage query, then a restart whose host pool refuses half of them (host_capacity);
    # and a pod that refuses 2% now and then (a burst of long prompts filling the host pool).
    "host_full": {"segments": [{"minutes": 30, "l3_hits": 20000}, {"minutes": 3, "down": True},
                               {"minutes": 60, "l3_hits": 20000, "host_refused": 0.5}]},
    "host_tight": {"segments": [{"minutes": 90, "l3_hits": 20000, "host_refused": 0.02}]},
    "prestop_failed": {"segments": [{"minutes": 30}, {"minutes": 3, "down": True, "prestop": "failed"},
                                    {"minutes": 60}]},
    "prestop_timeout": {"segments": [{"minutes": 30}, {"minutes": 3, "down": True, "prestop": "timeout"},
                                     {"minutes": 60}]},
    "prestop_ok_then_failed": {"segments": [{"minutes": 30}, {"minutes": 3, "down": True, "prestop": "ok"},
                                            {"minutes": 60}, {"minutes": 3, "down": True, "prestop": "failed"},
                                            {"minutes": 60}]},
    "prestop_failed_then_ok": {"segments": [{"minutes": 30}, {"minutes": 3, "down": True, "prestop": "failed"},
                                            {"minutes": 60}, {"minutes": 3, "down": True, "prestop": "ok"},
                                            {"minutes": 60}]},
    "prestop_failed_twice": {"segments": [{"minutes": 30}, {"minutes": 3, "down": True, "prestop": "failed"},
                                          {"minutes": 60}, {"minutes": 3, "down": True, "prestop": "failed"},
                                          {"minutes": 60}]},
}  # fmt: skip

# The operator's own series, as qwen_hicache.metrics creates them (restart and phase series at 0 when a rollout
# starts), and the sidecar's volume gauges.
OPERATOR = {
    "cold_restart": {f'qwen_hicache_pod_restarts_total{{{SRV},result="cold"}}': "0 0 1 1 1"},
    "warm_restarts": {f'qwen_hicache_pod_restarts_total{{{SRV},result="warm"}}': "0 1 2 2 2",
                      f'qwen_hicache_pod_restarts_total{{{SRV},result="new_namespace"}}': "0 1 1",
                      f'qwen_hicache_pod_restarts_total{{{SRV},result="cold"}}': "0 0 0 0 0"},
    "paused": {f'qwen_hicache_rollout_phase{{{SRV},phase="Paused"}}': "1x10"},
    "rolling": {f'qwen_hicache_rollout_phase{{{SRV},phase="Paused"}}': "0x10",
                f'qwen_hicache_rollout_phase{{{SRV},phase="Rolling"}}': "1x10"},
    "volume_full": {f'qwen_hicache_disk_volume_used_bytes{{{SRV},pod="qwen-0"}}': "97x20",
                    f'qwen_hicache_disk_volume_size_bytes{{{SRV},pod="qwen-0"}}': "100x20"},
    "volume_dip": {f'qwen_hicache_disk_volume_used_bytes{{{SRV},pod="qwen-0"}}': "97x5 90x15",
                   f'qwen_hicache_disk_volume_size_bytes{{{SRV},pod="qwen-0"}}': "100x20"},
    "reconcile_errors": {f'qwen_hicache_reconcile_errors_total{{{SRV},error="ApiException"}}': "0+1x40"},
    "reconcile_error_once": {f'qwen_hicache_reconcile_errors_total{{{SRV},error="ApiException"}}': "0 1x40"},
}  # fmt: skip

SERVER = {"namespace": "ml", "server": "qwen"}


def _prestop(uid: str, outcome: str) -> dict[str, str]:
    """The alert's labels for the preStop of probe pod `uid` (series_probe names incarnation N `uid-N`)."""
    return {**POD_LABELS, "pod_uid": uid, "outcome": outcome}


# (alert, series, eval time, labels of the firing alert or None for "must not fire", $value for annotations)
CASES: list[tuple[str, str, str, dict[str, str] | None, float]] = [
    ("QwenHiCacheRestartCameBackCold", "cold_restart", "4m", SERVER, 1),
    ("QwenHiCacheRestartCameBackCold", "warm_restarts", "4m", None, 0),
    ("QwenHiCacheRolloutPaused", "paused", "6m", SERVER, 1),
    ("QwenHiCacheRolloutPaused", "rolling", "10m", None, 0),
    ("QwenHiCacheVolumeAlmostFull", "volume_full", "15m", POD_LABELS, 0.97),
    ("QwenHiCacheVolumeAlmostFull", "volume_dip", "15m", None, 0),
    ("QwenHiCacheReconcileErrors", "reconcile_errors", "30m", SERVER, 1 / 60),
    ("QwenHiCacheReconcileErrors", "reconcile_error_once", "30m", None, 0),  # one transient error pages no one
    ("QwenHiCacheStorageHitShareCollapsed", "collapse_after_restart", "550m", SERVER, 0),
    ("QwenHiCacheStorageHitShareCollapsed", "collapse_after_idle", "420m", SERVER, 0),
    ("QwenHiCacheStorageHitShareCollapsed", "always_low", "470m", None, 0),
    ("QwenHiCacheDiskTierEvicting", "evicting", "240m", POD_LABELS, 0),
    ("QwenHiCacheDiskTierEvicting", "evicted_once", "260m", None, 0),
    ("QwenHiCacheDiskTierEvicting", "below_cap", "299m", None, 0),
    ("QwenHiCacheDiskPagesDiscarded", "discard", "35m", {**POD_LABELS, "reason": "checksum"}, 0),
    ("QwenHiCacheDiskPagesDiscarded", "read_errors", "39m", None, 0),  # I/O errors keep the page: no discard
    ("QwenHiCacheDiskReadErrors", "read_errors", "39m", {**POD_LABELS, "error": "EIO"}, 0),
    ("QwenHiCacheDiskReadErrors", "read_error_once", "50m", None, 0),
    ("QwenHiCacheDiskHitsRefusedHostFull", "host_full", "80m", POD_LABELS, 0),
    ("QwenHiCacheDiskHitsRefusedHostFull", "host_full", "30m", None, 0),  # before the restart: every hit loaded
    ("QwenHiCacheDiskHitsRefusedHostFull", "host_tight", "85m", None, 0),
    ("QwenHiCacheBackupsDropped", "dropped", "33m", POD_LABELS, 640),
    ("QwenHiCacheBackupsDropped", "healthy", "1000m", None, 0),  # the deployed mode: the series never exists
    ("QwenHiCachePreStopFlushFailed", "prestop_failed", "45m", _prestop("uid-0", "failed"), 1),
    ("QwenHiCachePreStopFlushFailed", "prestop_failed", "20m", None, 0),  # before the first stop: no series
    ("QwenHiCachePreStopFlushFailed", "prestop_failed", "36m", None, 0),  # first exported at 33m: pending
    ("QwenHiCachePreStopFlushFailed", "prestop_timeout", "45m", _prestop("uid-0", "timeout"), 1),
    ("QwenHiCachePreStopFlushFailed", "prestop_ok_then_failed", "80m", None, 0),
    ("QwenHiCachePreStopFlushFailed", "prestop_ok_then_failed", "110m", _prestop("uid-1", "failed"), 1),
    ("QwenHiCachePreStopFlushFailed", "prestop_failed_then_ok", "80m", _prestop("uid-0", "failed"), 1),
    ("QwenHiCachePreStopFlushFailed", "prestop_failed_then_ok", "94m", None, 0),  # the restart's gap
    ("QwenHiCachePreStopFlushFailed", "prestop_failed_then_ok", "150m", None, 0),  # the next stop flushed
    ("QwenHiCachePreStopFlushFailed", "prestop_failed_twice", "94m", None, 0),
    ("QwenHiCachePreStopFlushFailed", "prestop_failed_twice", "110m", _prestop("uid-1", "failed"), 1),
    ("QwenHiCachePreStopFlushFailed", "healthy", "1000m", None, 0),  # a stop that flushed
]
# Healthy traffic with idle hours and a warm restart: no alert may fire at any of these times.
HEALTHY_TIMES = ["170m", "300m", "790m", "800m", "830m", "905m", "960m", "1020m", "1080m"]

# The expressions as they were before issue 24, on the same runtime-shaped series: silent where they should fire.
OLD = {
    "StorageHitShareCollapsed": (
        "(sum by (namespace, server) (rate(sglang:cached_tokens_total{cache_source=\"storage\"}[10m]))"
        " / sum by (namespace, server) (rate(sglang:prompt_tokens_total[10m])))"
        " < 0.5 * avg_over_time(old:share[6h] offset 30m)"
        " and avg_over_time(old:share[6h] offset 30m) > 0.05"
        " and sum by (namespace, server) (rate(sglang:prompt_tokens_total[10m])) > 0", "15m"),
    "DiskNearCap": ("qwen_hicache_disk_used_bytes / qwen_hicache_disk_cap_bytes > 0.95", "30m"),
    "BackupsDropped": ("sum by (namespace, server, pod) (increase(sglang:hicache_backup_dropped_tokens_total"
                       "{tp_rank=\"0\"}[15m])) > 0", "0m"),
}
OLD_SHARE = ("sum by (namespace, server) (rate(sglang:cached_tokens_total{cache_source=\"storage\"}[10m]))"
             " / sum by (namespace, server) (rate(sglang:prompt_tokens_total[10m]))")
OLD_SILENT = [("StorageHitShareCollapsed", "collapse_after_restart", "550m"),
              ("StorageHitShareCollapsed", "collapse_after_idle", "420m"),
              ("DiskNearCap", "evicting", "240m"), ("BackupsDropped", "dropped", "33m")]  # fmt: skip


def _alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _humanize_percentage(v: float) -> str:
    return f"{v * 100:.4g}%"


def _annotations(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, str]:
    """The rule's annotation templates expanded as Prometheus does for the few forms they use."""

    def expand(text: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
        text = text.replace("{{ $value | humanizePercentage }}", _humanize_percentage(value))
        return text.replace("{{ $value }}", f"{value:g}")

    return {k: expand(v) for k, v in rule.get("annotations", {}).items()}


def _promtool_values(values: list[float | None]) -> str:
    """A scraped series in promtool notation: '_' where it was not scraped, 'stale' where a target went away."""
    out, seen = [], False
    for i, v in enumerate(values):
        if v is None:
            out.append("stale" if seen and values[i - 1] is not None else "_")
        else:
            seen = True
            out.append(repr(float(v)))
    return " ".join(out)


@pytest.fixture(scope="module")
def runtime_series() -> dict[str, dict[str, str]]:
    """Every scenario played by the patched wheel's own code: {scenario: {series: promtool values}}."""
    tree = sglang_tree.patched_sglang_tree()
    assert sglang_tree.tree_info(tree)["patched"], sglang_tree.tree_info(tree)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("series_probe.py")), str(tree),
                           json.dumps(SCENARIOS)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    played = json.loads(proc.stdout)
    return {name: {s: _promtool_values(v) for s, v in out["series"].items()} for name, out in played.items()}


def _series(runtime_series: dict, name: str) -> dict[str, str]:
    return OPERATOR[name] if name in OPERATOR else runtime_series[name]


def _test_group(runtime_series: dict, name: str, checks: list[dict]) -> dict:
    return {"name": name, "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in _series(runtime_series, name).items()],
            "alert_rule_test": checks}  # fmt: skip


def _promtool_test(promtool: Path, tmp: Path, rules: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    path = tmp / f"{rules.stem}-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "30s", "tests": tests},
                                   sort_keys=False))  # fmt: skip
    return subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def promtool() -> Path:
    return build.ensure()["promtool"]


def test_rules_file_is_valid(promtool: Path) -> None:
    res = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    fired = {a for a, _, _, labels, _ in CASES if labels is not None}
    quiet = {a for a, _, _, labels, _ in CASES if labels is None}
    assert fired == quiet == set(_alerts())


def test_every_alert_has_a_runbook_section() -> None:
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), re.M)}  # fmt: skip
    for name, rule in _alerts().items():
        url = rule["annotations"].get("runbook_url", "")
        assert url.endswith(f"docs/runbooks.md#{name.lower()}"), (name, url)
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name}"


def test_the_probe_plays_the_runtimes_shapes(runtime_series: dict) -> None:
    """The properties the rules rely on, as the runtime's code produced them (not as this file assumes)."""
    restart = runtime_series["collapse_after_restart"]
    storage = [s for s in restart if 'cache_source="storage"' in s]
    assert len(storage) == 1 and "10.0.0.10:" in storage[0]  # the restarted pod never creates it
    assert restart[storage[0]].split()[480] == "stale"
    dropped = [v for s, v in runtime_series["dropped"].items() if "backup_dropped" in s]
    assert len(dropped) == 1 and dropped[0].split()[:31] == ["_"] * 30 + ["640.0"]  # appears on its first drop
    assert not any("backup_dropped" in s for s in runtime_series["healthy"])
    used = next(v for s, v in runtime_series["evicting"].items() if s.startswith("qwen_hicache_disk_used_bytes"))
    cap = next(v for s, v in runtime_series["evicting"].items() if s.startswith("qwen_hicache_disk_cap_bytes"))
    ratios = [float(u) / float(c) for u, c in zip(used.split()[60:120], cap.split()[60:120], strict=True)]
    # The evictor's saw-tooth between 0.9 and 1.0 of the cap: no level above 0.95 holds for half an hour.
    assert 0.85 < min(ratios) <= 0.9 < max(ratios) <= 1.0
    assert max(len(run) for run in re.split(r"l+", "".join("h" if r > 0.95 else "l" for r in ratios))) < 30
    prestop = {s: v.split() for s, v in runtime_series["prestop_ok_then_failed"].items() if "prestop_info" in s}
    firsts = [(re.search(r'outcome="(\w+)"', s)[1], v.index("1.0")) for s, v in prestop.items()]
    assert firsts == [("ok", 33), ("failed", 96)]  # each on the next pod's first scrape, none before a stop
    assert all('exported_pod="qwen-0"' in s and v[:33] == ["_"] * 33 for s, v in prestop.items())
    assert all(v[93] == "stale" for s, v in prestop.items() if 'outcome="ok"' in s)  # replaced, after a gap
    discards = [s for s in runtime_series["discard"] if "page_discards" in s]
    assert len(discards) == 6 and all(v.split()[0] == "0.0" for s, v in runtime_series["discard"].items()
                                      if "page_discards" in s)  # fmt: skip  # created at zero


def test_alerts_fire_for_the_right_reasons(promtool: Path, runtime_series: dict, tmp_path: Path) -> None:
    alerts, tests = _alerts(), []
    for alert, name, at, labels, value in CASES:
        rule = alerts[alert]
        expected = []
        if labels is not None:
            full = {**labels, **rule.get("labels", {})}
            expected = [{"exp_labels": full, "exp_annotations": _annotations(rule, full, value)}]
        tests.append(_test_group(runtime_series, name, [{"alertname": alert, "eval_time": at, "exp_alerts": expected}]))
    res = _promtool_test(promtool, tmp_path, RULES, tests)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def test_healthy_traffic_with_idle_hours_fires_nothing(promtool: Path, runtime_series: dict, tmp_path: Path) -> None:
    checks = [{"alertname": a, "eval_time": t, "exp_alerts": []} for a in _alerts() for t in HEALTHY_TIMES]
    res = _promtool_test(promtool, tmp_path, RULES, [_test_group(runtime_series, "healthy", checks)])
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def test_the_old_rules_were_silent_on_the_runtimes_series(promtool: Path, runtime_series: dict,
                                                          tmp_path: Path) -> None:  # fmt: skip
    old = tmp_path / "old-rules.yaml"
    rules = [{"record": "old:share", "expr": OLD_SHARE}]
    rules += [{"alert": f"Old{a}", "expr": expr, "for": f} for a, (expr, f) in OLD.items()]
    old.write_text(yaml.safe_dump({"groups": [{"name": "old", "interval": "30s", "rules": rules}]}))
    tests = [_test_group(runtime_series, name, [{"alertname": f"Old{a}", "eval_time": at, "exp_alerts": []}])
             for a, name, at in OLD_SILENT]  # fmt: skip
    res = _promtool_test(promtool, tmp_path, old, tests)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def test_every_dashboard_query_parses(promtool: Path, tmp_path: Path) -> None:
    """promtool parses each panel's PromQL (Grafana's variables substituted) as a recording rule."""
    from harness.prometheus import dashboard
    from harness.prometheus.stand import grafana_expr

    rules = [{"record": f"dashboard:query{i}", "expr": grafana_expr(q)} for i, (_, q) in enumerate(dashboard.queries())]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
