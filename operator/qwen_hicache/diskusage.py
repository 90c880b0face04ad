"""How full each replica's disk tier is: a tiny exporter beside the runtime, and the operator's reader.

The runtime exports no disk-usage metric (its file backend keeps byte counts inside its LRU evictor and
logs them). The pod's cache volume is its own, so the pod itself is the only place that can measure it:
`cache-usage` is a sidecar container in the runtime image (stdlib Python only, `python3 -c SCRIPT`, the file
`pod_scripts/disk_usage.py`) with
the cache volume mounted. Every `QWEN_HICACHE_USAGE_INTERVAL` seconds (30) it walks the current
namespace with `os.scandir` (one `stat` per page file: about a second per million files, on a thread,
never on the request path) and reads `statvfs` of the volume; `/metrics` serves the last snapshot:

- `qwen_hicache_disk_used_bytes{tp_rank}` / `qwen_hicache_disk_page_files{tp_rank}`: bytes (file sizes,
  what the runtime's evictor counts against its cap) and `.bin` files of the current namespace per TP
  rank (the runtime's cap, `SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`, is enforced per rank on the files
  carrying that rank's key suffix `_<rank>_<tp size>.bin`),
- `qwen_hicache_disk_cap_bytes{tp_rank}`: that cap, as the operator sized it,
- `qwen_hicache_disk_old_namespaces_bytes`, `qwen_hicache_disk_volume_{used,size}_bytes`,
- `qwen_hicache_disk_compiled_kernels_bytes`: the runtime's compile caches under `.jit/` (`launch.JIT_CACHE_ENV`),
- `qwen_hicache_cache_namespace_created_timestamp_seconds` (written once into the namespace as
  `.qwen-hicache-created`, since the guard's marker is touched at every start) and
  `qwen_hicache_cache_namespace_info{fingerprint}`,
- `qwen_hicache_disk_scan_timestamp_seconds` and `..._scan_duration_seconds`,
- `qwen_hicache_prestop_info{pod,pod_uid,outcome,message}` with `..._prestop_{timestamp,duration}_seconds`: the
  last preStop's record left on the volume (podlifecycle: the previous pod's final flush), absent until one is.

Prometheus scrapes it (the chart's PodMonitor); the operator reads the same endpoint per pod for
`status.replicaCache` (`engine.read_usage`), so the status and the dashboard show the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from .constants import pod_script

PORT = 9400
PORT_NAME = "cache-usage"
CREATED_FILE = ".qwen-hicache-created"

SCRIPT = pod_script("disk_usage.py")
"""The sidecar's `python3 -c` script (it names CREATED_FILE and PORT literally; a test checks)."""


@dataclass(frozen=True)
class PreStopRecord:
    """The last preStop's outcome as it left it on the volume (podlifecycle.PRESTOP_RECORD)."""

    pod_uid: str
    outcome: str
    """ok | failed | timeout (status_model.OUTCOMES)."""
    message: str = ""
    pod: str = ""
    finished_at: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class DiskUsage:
    """One replica's disk tier as its sidecar reports it (bytes and files summed over the TP ranks)."""

    used_bytes: int
    page_files: int
    cap_bytes: int | None = None
    used_ratio: float | None = None
    namespace_created_at: int | None = None
    """Unix time the current namespace was first used."""
    old_namespaces_bytes: int | None = None
    fingerprint: str | None = None
    prestop: PreStopRecord | None = None
    """The outcome of the preStop of the pod that used this volume last (maybe this pod's predecessor)."""


def parse(text: str) -> DiskUsage:
    """The exporter's text as one replica's numbers (ValueError when it is not Prometheus text)."""
    values: dict[str, float] = {}
    per_rank: dict[str, dict[str, float]] = {}
    fingerprint, prestop = None, None
    for sample in samples(text):
        rank = sample.labels.get("tp_rank")
        if rank is not None:
            per_rank.setdefault(sample.name, {})[rank] = sample.value
        else:
            values[sample.name] = sample.value
        if sample.name == "qwen_hicache_cache_namespace_info":
            fingerprint = sample.labels.get("fingerprint")
        if sample.name == "qwen_hicache_prestop_info":
            prestop = sample.labels
    used = int(sum(per_rank.get("qwen_hicache_disk_used_bytes", {}).values()))
    caps = per_rank.get("qwen_hicache_disk_cap_bytes", {})
    cap = int(sum(caps.values())) if caps else None
    created = values.get("qwen_hicache_cache_namespace_created_timestamp_seconds")
    old = values.get("qwen_hicache_disk_old_namespaces_bytes")
    return DiskUsage(
        used_bytes=used,
        page_files=int(sum(per_rank.get("qwen_hicache_disk_page_files", {}).values())),
        cap_bytes=cap,
        used_ratio=(round(used / cap, 4) if cap else 0.0) if caps else None,
        namespace_created_at=int(created) if created is not None else None,
        old_namespaces_bytes=int(old) if old is not None else None,
        fingerprint=fingerprint or None,
        prestop=_prestop(prestop, values),
    )


def _prestop(labels: dict[str, str] | None, values: dict[str, float]) -> PreStopRecord | None:
    if not labels or not labels.get("outcome"):
        return None
    finished = values.get("qwen_hicache_prestop_timestamp_seconds")
    return PreStopRecord(pod_uid=labels.get("pod_uid", ""), outcome=labels["outcome"],
                         message=labels.get("message", ""), pod=labels.get("pod", ""),
                         finished_at=int(finished) if finished else None,
                         seconds=values.get("qwen_hicache_prestop_duration_seconds"))


def samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text exposition, by `prometheus_client`'s own parser."""
    for family in text_string_to_metric_families(text):
        yield from family.samples
