"""Prometheus series as the runtime and the cache-usage sidecar really emit them, minute by minute, for a scenario.

    python series_probe.py TREE SCENARIOS_JSON     # {"name": {"cap_pages": N, "segments": [...]}, ...}

Nothing here states a metric name or when a series exists: each minute runs the runtime's own code and the
sidecar's own script, then scrapes what they expose, as Prometheus would (plus the scrape's own labels):

* prompts: the tree's ``TokenizerMetricsCollector.observe_one_finished_request`` (``cached_tokens_total`` by
  ``cache_source`` appears on a source's first non-zero increment, ``prompt_tokens_total`` on the first
  request);
* the disk tier: the tree's ``HiCacheFile`` with its size cap (the runtime's LRU evictor, which evicts down to
  0.9 of the cap) written ``disk_pages`` pages a minute; once a minute the scheduler step's
  ``StorageMetricsCollector.log_storage_metrics(storage_backend.get_stats())`` and ``log_backuped_tokens``;
  ``damage`` pages flipped and read back (checksum discards), ``eio`` reads that fail with EIO (injected),
  ``dropped`` buffer-mode backup tokens (``log_backup_dropped_tokens``, a series created on its first drop);
  ``l3_hits`` tokens the storage query found (``log_storage_prefetch_hit_tokens``, created on the first) of which
  ``host_refused`` (a share) were refused for host capacity (``log_storage_prefetch_unfulfilled_tokens``, every
  reason created at zero);
* the sidecar: ``qwen_hicache.diskusage.SCRIPT``'s own ``scan()`` over the namespace directory;
* a ``down`` segment's ``prestop``: the pod's own preStop hook (``podlifecycle.PRESTOP_SCRIPT``) run to its end
  before the pod goes, writing its record on the volume for the next pod's sidecar.

A ``down`` segment is a pod restart: nothing is scraped (the old series end with a staleness marker), then a
new process (fresh collectors, a new ``instance``, the same cache volume) starts. Labels the target sets win
over exported ones, which are kept as ``exported_<name>`` (a PodMonitor without honorLabels). Two stand-ins:
the runtime's config context is not published on CPU, so ``get_observability()`` answers the two bucket
settings the tokenizer collector reads (None: the runtime's default buckets); the preStop's runtime is a tiny
HTTP server answering as ``http_server.flush_cache`` does (200, or 400 with its failure text; ``timeout``: the
refusal comes after the flush's own timeout, as when the runtime's deferred flush waited out its budget).

Output per scenario: ``{"minutes": N, "series": {"name{labels}": [value or null per minute]}}`` (counters and
the sidecar's gauges; histogram buckets left out).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import errno
import functools
import http.server
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
TREE, SCENARIOS = Path(sys.argv[1]), json.loads(sys.argv[2])
sys.path.insert(0, str(REPO / "tests/runtime"))
import cpu_stub  # noqa: E402

cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")

import prometheus_client as pc  # noqa: E402
import torch  # noqa: E402
from qwen_hicache import diskusage, podlifecycle  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.observability import metrics_collector as mc  # noqa: E402

SCRAPE = {"namespace": "ml", "server": "qwen", "pod": "qwen-0", "job": "qwen-hicache"}
MODEL, PAGE_BYTES = "Qwen/probe", 4096
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
# The families the rules and the dashboard can read (the rest of the runtime's /metrics is left out).
KEEP = re.compile(r"^(sglang:(prompt_tokens|cached_tokens|backuped_tokens|hicache_|storage_prefetch_hit_tokens|"
                  r"storage_prefetch_unfulfilled_tokens)|qwen_hicache_(disk|prestop)_)")
FLUSH_SECONDS = 1
# /flush_cache's answers per outcome: (status, body as http_server.flush_cache sends it, delay in seconds).
FLUSH_ANSWERS = {"ok": (200, "Cache flushed.\n", 0.0), "failed": (400, "Flush cache failed.\n", 0.0),
                 "timeout": (400, "Flush cache failed.\n", FLUSH_SECONDS + 0.2)}  # fmt: skip


def _sidecar(root: str, fingerprint: str, cap: int):
    """The cache-usage script's definitions (its scan, not its HTTP server), run with the pod's environment."""
    os.environ.update({"QWEN_HICACHE_CACHE_ROOT": root, "QWEN_HICACHE_FINGERPRINT": fingerprint,
                       "QWEN_HICACHE_TP_SIZE": "1", "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(cap)})  # fmt: skip
    module = ast.parse(diskusage.SCRIPT)
    module.body = [n for n in module.body if not isinstance(n, ast.Expr) and
                   not (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "addr")]  # fmt: skip
    namespace: dict = {}
    exec(compile(module, "cache-usage", "exec"), namespace)
    return namespace


class Pod:
    """One runtime process: its collectors (on a private registry), its HiCacheFile on the shared volume."""

    def __init__(self, incarnation: int, directory: Path, cap: int) -> None:
        self.registry = pc.CollectorRegistry()
        bound = {f"_{k}_cls": functools.partial(getattr(pc, k.capitalize()), registry=self.registry)
                 for k in ("counter", "gauge", "histogram")}  # fmt: skip
        tokenizer = type("Tokenizer", (mc.TokenizerMetricsCollector,), bound)
        storage = type("Storage", (mc.StorageMetricsCollector,), bound)
        engine = mc.DisaggregationMode.to_engine_type(mc.DisaggregationMode.NULL)
        self.labels = {"model_name": MODEL, "engine_type": engine}
        self.tokenizer = tokenizer(labels=self.labels)
        cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                      is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
                                      model_name=MODEL, extra_config={"max_size": cap} if cap else None)  # fmt: skip
        self.store = hs.HiCacheFile(cfg, file_path=str(directory))
        # As StorageAttachment._resolve_metrics_collector labels it for the file backend.
        self.storage = storage(labels={"storage_backend": "file", "tp_rank": 0, "dp_rank": 0, "pp_rank": 0,
                                       "pp_size": 1, "attn_cp_rank": 0, "attn_cp_size": 1})  # fmt: skip
        self.instance = f"10.0.0.{10 + incarnation}:30000"
        self.uid = f"uid-{incarnation}"

    def scrape(self, sidecar: dict) -> dict[str, float]:
        """The runtime's /metrics and the sidecar's (its own port on the same pod IP)."""
        sidecar["scan"]()
        ip = self.instance.split(":")[0]
        return _parse(pc.generate_latest(self.registry).decode(), {**SCRAPE, "instance": self.instance}) | _parse(
            sidecar["snapshot"][0].decode(), {**SCRAPE, "instance": f"{ip}:{diskusage.PORT}"})


def _parse(text: str, extra: dict[str, str]) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#") or m.group(1).endswith(("_created", "_bucket", "_sum", "_count")):
            continue
        if not KEEP.match(m.group(1)):
            continue
        exported = re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")
        labels = {f"exported_{k}" if k in extra else k: v for k, v in exported} | extra
        out[m.group(1) + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"] = float(m.group(3))
    return out


@contextlib.contextmanager
def _eio(path: Path):
    real = os.open, builtins.open

    def guarded(fn):
        def opener(p, *a, **k):
            if os.fspath(p) == str(path):
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
            return fn(p, *a, **k)

        return opener

    os.open, builtins.open = guarded(real[0]), guarded(real[1])
    try:
        yield
    finally:
        os.open, builtins.open = real


def minute(pod: Pod, seg: dict, written: list[str]) -> None:
    """One minute of the runtime's work, as the segment describes it."""
    prompts = seg.get("prompts", 0)
    if prompts:
        details = {src: int(prompts * seg.get(src, 0)) for src in ("device", "host", "storage")}
        pod.tokenizer.observe_one_finished_request(
            pod.labels, prompt_tokens=prompts, generation_tokens=16, cached_tokens=sum(details.values()),
            e2e_latency=1.0, has_grammar=False, cached_tokens_details=details,
        )  # fmt: skip
    for _ in range(seg.get("disk_pages", 0) and 1):
        keys = [f"{len(written) + i:064x}" for i in range(seg["disk_pages"])]
        pod.store.batch_set(keys, [torch.zeros(PAGE_BYTES, dtype=torch.uint8)] * len(keys))
        written.extend(keys)
        pod.storage.log_backuped_tokens(64 * len(keys))
    target = torch.empty(PAGE_BYTES, dtype=torch.uint8)
    for _ in range(seg.get("damage", 0)):
        key = next(k for k in reversed(written) if pod.store.exists(k))
        path = Path(pod.store.file_path) / f"{pod.store._get_suffixed_key(key)}.bin"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        pod.store.get(key, target)
    if seg.get("eio"):
        key = next(k for k in reversed(written) if pod.store.exists(k))
        path = Path(pod.store.file_path) / f"{pod.store._get_suffixed_key(key)}.bin"
        with _eio(path), contextlib.suppress(OSError):  # the parent lets it escape
            pod.store.get(key, target)
    if seg.get("dropped"):
        pod.storage.log_backup_dropped_tokens(seg["dropped"])
    if seg.get("l3_hits"):  # the L3 query's hit tokens, and the share of them refused for a full host pool
        pod.storage.log_storage_prefetch_hit_tokens(seg["l3_hits"])
        refused = int(seg["l3_hits"] * seg.get("host_refused", 0))
        pod.storage.log_storage_prefetch_unfulfilled_tokens(refused, "host_capacity")
    stats = pod.store.get_stats() if hasattr(pod.store, "get_stats") else None
    pod.storage.log_storage_metrics(stats or mc.StorageMetrics())  # the scheduler step, once a minute


class _Runtime(http.server.BaseHTTPRequestHandler):
    """What the preStop asks the runtime: /metrics (no running request), /flush_cache (the `answer`)."""

    answer = FLUSH_ANSWERS["ok"]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200, "sglang:num_running_reqs 0.0\n")

    def do_POST(self) -> None:  # noqa: N802
        status, body, delay = self.answer
        time.sleep(delay)
        self._send(status, body)

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def prestop(root: Path, pod: Pod, outcome: str) -> None:
    """The pod's preStop hook, run to its end (as the kubelet does before SIGTERM) against a runtime answering
    `outcome`; it leaves its record at the volume's root."""
    handler = type("Runtime", (_Runtime,), {"answer": FLUSH_ANSWERS[outcome]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "QWEN_HICACHE_POD_HOST": "127.0.0.1", "QWEN_HICACHE_PORT": str(server.server_port),
           "QWEN_HICACHE_DRAIN_SECONDS": "5", "QWEN_HICACHE_FLUSH_SECONDS": str(FLUSH_SECONDS),
           "QWEN_HICACHE_PRESTOP_RECORD": str(root / podlifecycle.PRESTOP_RECORD),
           "QWEN_HICACHE_POD_NAME": SCRAPE["pod"], "QWEN_HICACHE_POD_UID": pod.uid}  # fmt: skip
    try:
        subprocess.run([sys.executable, "-c", podlifecycle.PRESTOP_SCRIPT], env=env, capture_output=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()


def run(scenario: dict) -> dict:
    mc.get_observability = lambda: SimpleNamespace(prompt_tokens_buckets=None, generation_tokens_buckets=None)
    root = Path(tempfile.mkdtemp(prefix="series-"))
    fingerprint, cap = "v1-probe", scenario.get("cap_pages", 0) * (PAGE_BYTES + 64)
    directory = root / fingerprint
    directory.mkdir()
    sidecar = _sidecar(str(root), fingerprint, cap)
    series: dict[str, list] = {}
    t, incarnation, pod, written = 0, 0, None, []
    total = sum(seg["minutes"] for seg in scenario["segments"])
    try:
        for seg in scenario["segments"]:
            for _ in range(seg["minutes"]):
                if seg.get("down"):
                    if pod is not None and seg.get("prestop"):
                        prestop(root, pod, seg["prestop"])
                    pod = None
                    t += 1
                    continue
                if pod is None:
                    pod = Pod(incarnation, directory, cap)
                    incarnation += 1
                minute(pod, seg, written)
                for key, value in pod.scrape(sidecar).items():
                    series.setdefault(key, [None] * total)[t] = value
                t += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"minutes": total, "series": series}


if __name__ == "__main__":
    print(json.dumps({name: run(scenario) for name, scenario in SCENARIOS.items()}))
