"""The HiCache Grafana dashboard as data; `python -m harness.prometheus.dashboard` regenerates the chart's JSON.

Why generated: every panel's PromQL is also what the observability test runs against a real Prometheus
(and what the picture in docs/ is drawn from), so the queries live in one list, `PANELS`. A test fails
while the committed JSON differs from what this module produces.

Labels: the runtime's series carry `model_name` (tokenizer and scheduler metrics) or `tp_rank` and the
storage backend (storage metrics), never the server or the pod; those come from the scrape (`namespace`,
`pod`, and `server` from the pod's `app.kubernetes.io/instance` label, as the chart's PodMonitor relabels
it). Storage counters come once per TP rank with the same token counts, so throughput uses `tp_rank="0"`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts/qwen-hicache-operator/dashboards/qwen-hicache.json"
UID = "qwen-hicache"
SEL = 'namespace=~"$namespace",server=~"$server"'


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"
    stack: bool = False
    width: int = 12
    extra: dict = field(default_factory=dict)


def _share(by: str, window: str = "rate(%s[$__rate_interval])") -> str:
    """Cached tokens by source over all prompt tokens (1 - their sum is what was computed)."""
    cached, prompt = (window % f"{m}{{{SEL}}}" for m in ("sglang:cached_tokens_total", "sglang:prompt_tokens_total"))
    return (f'sum by ({by}, cache_source) ({cached})\n/ ignoring(cache_source) group_left\n'
            f'sum by ({by}) ({prompt})')


PANELS: tuple[Panel, ...] = (
    Panel("Prompt tokens served from cache, by source (per server)",
          "Share of prompt tokens whose KV came from GPU (device), host RAM (host) or the disk tier (storage); "
          "the rest was computed. From the runtime's sglang:cached_tokens_total{cache_source} over "
          "sglang:prompt_tokens_total.",
          ((_share("namespace, server"), "{{server}} {{cache_source}}"),), "percentunit", stack=True),
    Panel("Prompt tokens served from cache, by source (per replica, over the range)",
          "The same share per pod over the dashboard's time range: a replica whose storage share lags the others "
          "is cold or has a smaller cache.",
          ((_share("pod", "increase(%s[$__range])"), "{{pod}} {{cache_source}}"),), "percentunit", kind="bargauge",
          extra={"max": 1}),
    Panel("Disk-tier prefetch and backup (tokens/s)",
          "Tokens read from the disk tier into host RAM (prefetch) and written from host RAM to disk (backup). "
          "Storage counters are per TP rank with equal counts: rank 0 stands for the pod.",
          ((f'sum by (pod) (rate(sglang:prefetched_tokens_total{{{SEL},tp_rank="0"}}[$__rate_interval]))',
            "{{pod}} prefetch"),
           (f'sum by (pod) (rate(sglang:backuped_tokens_total{{{SEL},tp_rank="0"}}[$__rate_interval]))',
            "{{pod}} backup")), "short"),
    Panel("Host pool use (KV tokens and Mamba states)",
          "The pinned host pools (the HiCache L2) over their capacity: KV tokens, and for hybrid models the Mamba "
          "state slots (conv + SSM + side state, often the larger share of the host bytes: 13.8 of the example's "
          "29.9 GB per rank). Either pool full evicts host prefixes.",
          ((f'max by (pod) (sglang:hicache_host_used_tokens{{{SEL}}})\n/\n'
            f'max by (pod) (sglang:hicache_host_total_tokens{{{SEL}}})', "{{pod}} KV"),
           (f'max by (pod) (sglang:hicache_host_mamba_used_states{{{SEL}}})\n/\n'
            f'max by (pod) (sglang:hicache_host_mamba_total_states{{{SEL}}})', "{{pod}} Mamba")), "percentunit",
          extra={"max": 1}),
    Panel("Disk tier use vs cap (per replica and TP rank)",
          "Bytes of the current cache namespace over the runtime's per-rank cap, from the pod's cache-usage "
          "sidecar. At the cap the runtime's LRU evictor evicts down to 90%: a saw-tooth between 90 and 100% means "
          "the working set is larger than the cap.",
          ((f'qwen_hicache_disk_used_bytes{{{SEL}}}\n/\n'
            f'qwen_hicache_disk_cap_bytes{{{SEL}}}', "{{pod}} rank {{tp_rank}}"),), "percentunit",
          extra={"max": 1}),
    Panel("Disk tier bytes and page files",
          "Current namespace bytes per pod (all ranks), earlier namespaces still kept, and the runtime's compiled "
          "kernels kept on the volume.",
          ((f'sum by (pod) (qwen_hicache_disk_used_bytes{{{SEL}}})', "{{pod}} bytes"),
           (f'sum by (pod) (qwen_hicache_disk_old_namespaces_bytes{{{SEL}}})', "{{pod}} old namespaces"),
           (f'sum by (pod) (qwen_hicache_disk_compiled_kernels_bytes{{{SEL}}})', "{{pod}} compiled kernels")),
          "bytes"),
    Panel("Restarted pods: warm or cold",
          "Pods restarted by the operator's rollouts whose canary came back from disk (warm), without a disk "
          "hit on the same cache (cold), or on a new cache namespace (new_namespace, cold by design). Rounded: "
          "increase() extrapolates to the window's edges.",
          ((f'round(sum by (server, result) (increase(qwen_hicache_pod_restarts_total{{{SEL}}}[$__range])))',
            "{{server}} {{result}}"),), "short", kind="bargauge"),
    Panel("Rollouts and their duration",
          "Rollouts that ended (complete or paused) and how long they took.",
          ((f'round(sum by (server, outcome) (increase(qwen_hicache_rollouts_total{{{SEL}}}[$__range])))',
            "{{server}} {{outcome}}"),
           (f'max by (server, outcome) (qwen_hicache_rollout_duration_seconds_sum{{{SEL}}}\n/\n'
            f'qwen_hicache_rollout_duration_seconds_count{{{SEL}}})', "{{server}} {{outcome}} mean seconds")),
          "short", kind="bargauge"),
    Panel("Rollout phase",
          "1 while the server's last rollout is in that phase. Paused needs the admin: see status.restart.",
          ((f'max by (server, phase) (qwen_hicache_rollout_phase{{{SEL}}})', "{{server}} {{phase}}"),),
          "short", stack=True),
    Panel("Prefetch shortfall and dropped backups (tokens/s)",
          "Storage hits that did not become a usable prefetch, by reason, and backups the runtime dropped.",
          ((f'sum by (reason) (rate(sglang:storage_prefetch_unfulfilled_tokens_total{{{SEL},tp_rank="0"}}'
            f'[$__rate_interval]))', "{{reason}}"),
           (f'sum by (pod) (rate(sglang:hicache_backup_dropped_tokens_total{{{SEL},tp_rank="0"}}'
            f'[$__rate_interval]))', "{{pod}} backup dropped")), "short"),
    Panel("Disk tier integrity and eviction (pages/s)",
          "Page files the runtime removed because they can never be the page asked for (by reason: size, header, "
          "tag, key, checksum, not_regular), page reads that failed with an I/O error (the file is kept), and "
          "pages its LRU evictor removed at the cap. All TP ranks (each handles its own files).",
          ((f'sum by (pod, reason) (rate(sglang:hicache_storage_page_discards_total{{{SEL}}}[$__rate_interval]))',
            "{{pod}} discarded {{reason}}"),
           (f'sum by (pod, error) (rate(sglang:hicache_storage_read_errors_total{{{SEL}}}[$__rate_interval]))',
            "{{pod}} read error {{error}}"),
           (f'sum by (pod) (rate(sglang:hicache_storage_evicted_pages_total{{{SEL}}}[$__rate_interval]))',
            "{{pod}} evicted")), "short"),
    Panel("Operator reconcile errors (per s)",
          "Reconciles that raised, by server and exception type (retried by Kopf).",
          ((f'sum by (server, error) (rate(qwen_hicache_reconcile_errors_total{{{SEL}}}[$__rate_interval]))',
            "{{server}} {{error}}"),), "short"),
    Panel("Operator reconcile duration (p95)",
          "95th percentile wall time of a reconcile, per namespace.",
          (('histogram_quantile(0.95, sum by (namespace, le) '
            '(rate(qwen_hicache_reconcile_duration_seconds_bucket{namespace=~"$namespace"}[$__rate_interval])))',
            "{{namespace}}"),), "s"),
)


def _variable(name: str, query: str) -> dict:
    return {"name": name, "label": name, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "includeAll": True,
            "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "sort": 1}


def _panel(i: int, p: Panel) -> dict:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    custom = {"stacking": {"mode": "normal" if p.stack else "none"}, "fillOpacity": 30 if p.stack else 10}
    return {
        "id": i + 1, "type": p.kind, "title": p.title, "description": p.description, "datasource": ds,
        "gridPos": {"h": 8, "w": p.width, "x": (i % 2) * 12, "y": (i // 2) * 8},
        "fieldConfig": {"defaults": {"unit": p.unit, "min": 0, **p.extra,
                                     **({"custom": custom} if p.kind == "timeseries" else {})}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if p.kind == "timeseries" else
                   {"displayMode": "gradient", "orientation": "horizontal"},
        "targets": [{"refId": chr(65 + j), "datasource": ds, "expr": q, "legendFormat": legend}
                    for j, (q, legend) in enumerate(p.targets)],
    }  # fmt: skip


def dashboard() -> dict:
    """The dashboard model (Grafana schema 39), datasource chosen by a variable."""
    return {
        "uid": UID, "title": "Qwen HiCache", "tags": ["qwen-hicache", "sglang", "hicache"],
        "description": "Where prompt KV comes from (GPU, host, disk), whether restarts stay warm, how full the "
                       "disk tier is, and the operator's health. Built on SGLang 0.5.23's --enable-metrics "
                       "names and the operator's own metrics.",
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}},
            _variable("namespace", "label_values(sglang:prompt_tokens_total, namespace)"),
            _variable("server", 'label_values(sglang:prompt_tokens_total{namespace=~"$namespace"}, server)'),
        ]},
        "panels": [_panel(i, p) for i, p in enumerate(PANELS)],
    }  # fmt: skip


def render_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    return [(p.title, q) for p in PANELS for q, _ in p.targets]


if __name__ == "__main__":
    DASHBOARD.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD.write_text(render_json())
    sys.stdout.write(f"wrote {DASHBOARD.relative_to(REPO)}\n")
