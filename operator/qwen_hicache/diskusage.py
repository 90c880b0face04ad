"""How full each replica's disk tier is: a tiny exporter beside the runtime, and the operator's reader.

The runtime exports no disk-usage metric (its file backend keeps byte counts inside its LRU evictor and
logs them). The pod's cache volume is its own, so the pod itself is the only place that can measure it:
`cache-usage` is a sidecar container in the runtime image (stdlib Python only, `python3 -c SCRIPT`) with
the cache volume mounted. Every `QWEN_HICACHE_USAGE_INTERVAL` seconds (30) it walks the current
namespace with `os.scandir` (one `stat` per page file: about a second per million files, on a thread,
never on the request path) and reads `statvfs` of the volume; `/metrics` serves the last snapshot:

- `qwen_hicache_disk_used_bytes{tp_rank}` / `qwen_hicache_disk_page_files{tp_rank}`: bytes (file sizes,
  what the runtime's evictor counts against its cap) and `.bin` files of the current namespace per TP
  rank (the runtime's cap, `SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`, is enforced per rank on the files
  carrying that rank's key suffix `_<rank>_<tp size>.bin`),
- `qwen_hicache_disk_cap_bytes{tp_rank}`: that cap, as the operator sized it,
- `qwen_hicache_disk_old_namespaces_bytes`, `qwen_hicache_disk_volume_{used,size}_bytes`,
- `qwen_hicache_cache_namespace_created_timestamp_seconds` (written once into the namespace as
  `.qwen-hicache-created`, since the guard's marker is touched at every start) and
  `qwen_hicache_cache_namespace_info{fingerprint}`,
- `qwen_hicache_disk_scan_timestamp_seconds` and `..._scan_duration_seconds`.

Prometheus scrapes it (the chart's PodMonitor); the operator reads the same endpoint per pod for
`status.replicaCache` (`read_usage`), so the status and the dashboard show the same numbers.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass

PORT = 9400
PORT_NAME = "cache-usage"
CREATED_FILE = ".qwen-hicache-created"

SCRIPT = r'''import http.server, os, re, signal, sys, threading, time
# The container's PID 1: without a handler the kernel drops SIGTERM, and the pod's deletion waits out its
# whole grace period (the drain and flush budget) for this sidecar.
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
env = os.environ
root, fp = env["QWEN_HICACHE_CACHE_ROOT"], env["QWEN_HICACHE_FINGERPRINT"]
tp, cap = int(env.get("QWEN_HICACHE_TP_SIZE") or 1), int(env.get("SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE") or 0)
interval = float(env.get("QWEN_HICACHE_USAGE_INTERVAL") or 30)
rank_of = re.compile(r"_(\d+)_%d\.bin$" % tp)
ns = os.path.join(root, fp)
snapshot = [b""]

def du(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total

def created():
    path = os.path.join(ns, "CREATED_FILE")
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        now = time.time()
        try:
            with open(path + ".tmp", "w") as f:
                f.write("%d\n" % now)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
        return now

def scan():
    t0 = time.time()
    used, files = {str(r): 0 for r in range(tp)}, {str(r): 0 for r in range(tp)}
    try:
        entries = list(os.scandir(ns))
    except OSError:
        entries = []
    for e in entries:
        m = rank_of.search(e.name)
        if m and m.group(1) in used:
            try:
                used[m.group(1)] += e.stat(follow_symlinks=False).st_size
                files[m.group(1)] += 1
            except OSError:
                pass
    old = 0
    for e in os.scandir(root):
        if e.is_dir(follow_symlinks=False) and e.name != fp and not e.name.startswith("lost+found"):
            old += du(e.path)
    st = os.statvfs(root)
    lines, typed = [], set()
    def put(name, value, help_, kind="gauge", **labels):
        if name not in typed:
            typed.add(name)
            lines.extend(["# HELP %s %s" % (name, help_), "# TYPE %s %s" % (name, kind)])
        lab = ",".join('%s="%s"' % kv for kv in labels.items())
        lines.append("%s%s %s" % (name, "{%s}" % lab if lab else "", float(value)))
    for r in sorted(used, key=int):
        put("qwen_hicache_disk_used_bytes", used[r], "Page file bytes of the current namespace.", tp_rank=r)
    for r in sorted(files, key=int):
        put("qwen_hicache_disk_page_files", files[r], "Page files of the current namespace.", tp_rank=r)
    if cap:
        for r in sorted(used, key=int):
            put("qwen_hicache_disk_cap_bytes", cap, "The runtime's disk-tier cap per TP rank.", tp_rank=r)
    put("qwen_hicache_disk_old_namespaces_bytes", old, "Bytes of earlier cache namespaces kept on the volume.")
    put("qwen_hicache_disk_volume_used_bytes", (st.f_blocks - st.f_bfree) * st.f_frsize, "Used bytes of the volume.")
    put("qwen_hicache_disk_volume_size_bytes", st.f_blocks * st.f_frsize, "Size of the cache volume.")
    put("qwen_hicache_cache_namespace_created_timestamp_seconds", created(), "First use of the namespace.")
    put("qwen_hicache_cache_namespace_info", 1, "The current cache namespace.", fingerprint=fp)
    put("qwen_hicache_disk_scan_duration_seconds", time.time() - t0, "Wall time of the last scan.")
    put("qwen_hicache_disk_scan_timestamp_seconds", time.time(), "When the last scan finished.")
    snapshot[0] = ("\n".join(lines) + "\n").encode()

def loop():
    while True:
        try:
            scan()
        except Exception as exc:
            print("cache-usage scan failed: %r" % (exc,), file=sys.stderr, flush=True)
        time.sleep(interval)

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        ok = self.path.split("?")[0] == "/metrics" and snapshot[0]
        body = snapshot[0] if ok else b"not ready\n"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

scan()
threading.Thread(target=loop, daemon=True).start()
addr = (env.get("QWEN_HICACHE_USAGE_HOST") or "0.0.0.0", int(env.get("QWEN_HICACHE_USAGE_PORT") or PORT))
http.server.ThreadingHTTPServer(addr, H).serve_forever()
'''.replace("CREATED_FILE", CREATED_FILE).replace("PORT)", f"{PORT})")

_SAMPLE = re.compile(r'^(qwen_hicache_[a-z_]+)(?:\{([^}]*)\})? ([0-9.eE+-]+)$', re.M)


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


def parse(text: str) -> DiskUsage:
    """The exporter's text as one replica's numbers."""
    values: dict[str, float] = {}
    per_rank: dict[str, dict[str, float]] = {}
    fingerprint = None
    for name, labels, value in _SAMPLE.findall(text):
        rank = re.search(r'tp_rank="(\d+)"', labels or "")
        if rank:
            per_rank.setdefault(name, {})[rank.group(1)] = float(value)
        else:
            values[name] = float(value)
        if name == "qwen_hicache_cache_namespace_info":
            fingerprint = (re.search(r'fingerprint="([^"]*)"', labels) or [None, None])[1]
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
    )


def read_usage(ip: str, port: int = PORT, timeout: float = 5.0) -> DiskUsage | None:
    """One pod's disk usage from its `cache-usage` sidecar, or None when it does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as resp:
            return parse(resp.read().decode())
    except (OSError, urllib.error.URLError, ValueError):
        return None
