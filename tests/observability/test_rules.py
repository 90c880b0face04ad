"""The chart's alerts fire for the right reasons: `promtool test rules` on synthetic series, case by case.

Each alert has a case that fires it and a look-alike that must not (a warm restart, a rollout that is
rolling, a disk at 80% of its cap, a storage share that was always low, ...). promtool is built from the
Go module sources pinned in harness/prometheus/ (once per machine).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.prometheus import build

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts/qwen-hicache-operator/files/prometheus-rules.yaml"
SRV = 'namespace="ml",server="qwen"'
POD = f'{SRV},pod="qwen-0"'
STORE = (f'{POD},tp_rank="0",storage_backend="file",dp_rank="0",pp_rank="0",pp_size="1",'
         'attn_cp_rank="0",attn_cp_size="1"')

# (alert, input series, eval time, labels of the firing alert or None for "must not fire", $value)
CASES: list[tuple[str, dict[str, str], str, dict[str, str] | None, float]] = [
    ("QwenHiCacheRestartCameBackCold", {f'qwen_hicache_pod_restarts_total{{{SRV},result="cold"}}': "0 0 1 1 1"},
     "4m", {"namespace": "ml", "server": "qwen"}, 1),
    ("QwenHiCacheRestartCameBackCold", {f'qwen_hicache_pod_restarts_total{{{SRV},result="warm"}}': "0 1 2 2 2",
                                        f'qwen_hicache_pod_restarts_total{{{SRV},result="new_namespace"}}': "0 1 1"},
     "4m", None, 0),
    ("QwenHiCacheRolloutPaused", {f'qwen_hicache_rollout_phase{{{SRV},phase="Paused"}}': "1x10"}, "6m",
     {"namespace": "ml", "server": "qwen"}, 1),
    ("QwenHiCacheRolloutPaused", {f'qwen_hicache_rollout_phase{{{SRV},phase="Paused"}}': "0x10",
                                  f'qwen_hicache_rollout_phase{{{SRV},phase="Rolling"}}': "1x10"}, "10m", None, 0),
    ("QwenHiCacheDiskNearCap", {f'qwen_hicache_disk_used_bytes{{{POD},tp_rank="0"}}': "96x40",
                                f'qwen_hicache_disk_cap_bytes{{{POD},tp_rank="0"}}': "100x40"}, "35m",
     {"namespace": "ml", "server": "qwen", "pod": "qwen-0", "tp_rank": "0"}, 0.96),
    ("QwenHiCacheDiskNearCap", {f'qwen_hicache_disk_used_bytes{{{POD},tp_rank="0"}}': "80x40",
                                f'qwen_hicache_disk_cap_bytes{{{POD},tp_rank="0"}}': "100x40"}, "35m", None, 0),
    ("QwenHiCacheVolumeAlmostFull", {f'qwen_hicache_disk_volume_used_bytes{{{POD}}}': "97x20",
                                     f'qwen_hicache_disk_volume_size_bytes{{{POD}}}': "100x20"}, "15m",
     {"namespace": "ml", "server": "qwen", "pod": "qwen-0"}, 0.97),
    ("QwenHiCacheVolumeAlmostFull", {f'qwen_hicache_disk_volume_used_bytes{{{POD}}}': "97x5 90x15",
                                     f'qwen_hicache_disk_volume_size_bytes{{{POD}}}': "100x20"}, "15m", None, 0),
    # 6.5 h at a 60% disk share, then 5%: fires; a server whose share was always 4% never does.
    ("QwenHiCacheStorageHitShareCollapsed",
     {f'sglang:prompt_tokens_total{{{POD},model_name="m",engine_type="unified",is_streaming="false"}}': "0+1000x480",
      f'sglang:cached_tokens_total{{{POD},model_name="m",engine_type="unified",cache_source="storage"}}':
          "0+600x390 234000+50x90"},
     "440m", {"namespace": "ml", "server": "qwen"}, 0.05),
    ("QwenHiCacheStorageHitShareCollapsed",
     {f'sglang:prompt_tokens_total{{{POD},model_name="m",engine_type="unified",is_streaming="false"}}': "0+1000x480",
      f'sglang:cached_tokens_total{{{POD},model_name="m",engine_type="unified",cache_source="storage"}}':
          "0+40x390 15600+20x90"},
     "440m", None, 0),
    ("QwenHiCacheBackupsDropped", {f"sglang:hicache_backup_dropped_tokens_total{{{STORE}}}": "0 0 640 640"}, "3m",
     {"namespace": "ml", "server": "qwen", "pod": "qwen-0"}, 640),
    ("QwenHiCacheBackupsDropped", {f"sglang:hicache_backup_dropped_tokens_total{{{STORE}}}": "640x20"}, "19m",
     None, 0),
    ("QwenHiCacheReconcileErrors",
     {f'qwen_hicache_reconcile_errors_total{{{SRV},error="ApiException"}}': "0+1x40"}, "30m",
     {"namespace": "ml", "server": "qwen"}, 1 / 60),
    ("QwenHiCacheReconcileErrors",  # one transient error does not page anyone
     {f'qwen_hicache_reconcile_errors_total{{{SRV},error="ApiException"}}': "0 1x40"}, "30m", None, 0),
]


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


def _test_file(tmp: Path) -> Path:
    alerts = _alerts()
    tests = []
    for alert, series, at, labels, value in CASES:
        rule = alerts[alert]
        expected = []
        if labels is not None:
            expected = [{"exp_labels": {**labels, **rule.get("labels", {})},
                         "exp_annotations": _annotations(rule, {**labels, **rule.get("labels", {})}, value)}]
        tests.append({"name": f"{alert} at {at}", "interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in series.items()],
                      "alert_rule_test": [{"alertname": alert, "eval_time": at, "exp_alerts": expected}]})
    path = tmp / "rules-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "30s", "tests": tests},
                                   sort_keys=False))
    return path


@pytest.fixture(scope="module")
def promtool() -> Path:
    return build.ensure()["promtool"]


def test_rules_file_is_valid(promtool: Path) -> None:
    res = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    fired = {a for a, *_, labels, _v in CASES if labels is not None}
    quiet = {a for a, *_, labels, _v in CASES if labels is None}
    assert fired == quiet == set(_alerts())


def test_alerts_fire_for_the_right_reasons(promtool: Path, tmp_path: Path) -> None:
    res = subprocess.run([str(promtool), "test", "rules", str(_test_file(tmp_path))], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
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
