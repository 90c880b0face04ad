"""How a serving pod starts and stops without losing or misusing its disk cache. Pure builders.

- `cache-guard` init container: creates `<mount>/<fingerprint>/` with a marker file, refuses (exit 3) a
  directory whose marker names another configuration, and removes old namespaces beyond the spec's keep
  count. It runs before the runtime starts, so nothing can be reading what it removes.
- preStop hook: waits (bounded) for running requests (an unreadable `/metrics` counts as busy), then
  calls `/flush_cache?timeout=N` with the admin key so queued host-to-disk writes land before SIGTERM. The
  runtime defers that flush until its tree cache has no write-through, load-back, prefetch or storage
  backup in flight (`Scheduler.is_fully_idle`, pinned by tests/runtime). What is still queued at SIGTERM is
  drained by runtime patch 0003 within the same budget (`SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT`). A deleted
  pod is already out of its Service's ready endpoints, so no new requests arrive while it drains.
- `terminationGracePeriodSeconds` covers the drain, the flush of a full host pool at the assumed disk
  write rate, and the runtime's own shutdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .spec import QwenHiCacheServerSpec

MARKER = ".qwen-hicache-fingerprint"
SHUTDOWN_SECONDS = 30
"""The runtime stops its schedulers 15 s after SIGTERM; the rest is process teardown."""

GUARD_SCRIPT = f"""set -eu
root="$QWEN_HICACHE_CACHE_ROOT"; fp="$QWEN_HICACHE_FINGERPRINT"; keep="$QWEN_HICACHE_KEEP_OLD"
dir="$root/$fp"; marker="$dir/{MARKER}"
mkdir -p "$dir"
if [ -e "$marker" ]; then
  have="$(cat "$marker")"
  if [ "$have" != "$fp" ]; then
    echo "refusing cache directory $dir: its marker names configuration $have, this pod is $fp" >&2
    exit 3
  fi
else
  printf '%s\\n' "$fp" > "$marker.tmp" && mv "$marker.tmp" "$marker"
fi
touch "$marker"
n=0
for m in $(ls -1t "$root"/*/{MARKER} 2>/dev/null); do
  d="${{m%/{MARKER}}}"
  [ "$d" = "$dir" ] && continue
  n=$((n + 1))
  if [ "$n" -gt "$keep" ]; then echo "removing old cache namespace $d"; rm -rf "$d"; else echo "keeping $d"; fi
done
echo "cache namespace $dir ready"
"""

PRESTOP_SCRIPT = """import os, re, time, urllib.request
env = os.environ
base = "http://%s:%s" % (env.get("QWEN_HICACHE_POD_HOST", "127.0.0.1"), env["QWEN_HICACHE_PORT"])
deadline = time.time() + float(env["QWEN_HICACHE_DRAIN_SECONDS"])
def running():
    try:
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    except Exception:
        return None  # unknown is not idle: keep waiting (bounded by the deadline)
    found = re.findall(r"^sglang:num_running_reqs(?:[{][^}]*[}])? (\\S+)$", text, re.M)
    return sum(float(v) for v in found) if found else None
while time.time() < deadline:
    n = running()
    if n == 0:
        break
    print("waiting: running requests", "unknown" if n is None else n, flush=True)
    time.sleep(1)
flush = env["QWEN_HICACHE_FLUSH_SECONDS"]
req = urllib.request.Request(base + "/flush_cache?timeout=" + flush, method="POST",
                             headers={"Authorization": "Bearer " + env.get("QWEN_HICACHE_ADMIN_API_KEY", "")})
try:
    print("flush:", urllib.request.urlopen(req, timeout=float(flush) + 10).status, flush=True)
except Exception as err:
    print("flush failed:", err, flush=True)
"""


@dataclass(frozen=True)
class DrainPlan:
    """Seconds a stopping pod needs, term by term (shown in status)."""

    drain_seconds: int
    flush_seconds: int
    grace_seconds: int


def drain_plan(spec: QwenHiCacheServerSpec, host_bytes_per_rank: int, write_bytes_per_second: int) -> DrainPlan:
    """Grace = longest request + flushing every rank's full host pool at the assumed rate + shutdown (a pod's
    ranks: across nodes every node writes its own ranks' pages to its own volume, at the same time)."""
    drain = spec.runtime.max_request_seconds
    flush = 0
    if spec.hicache.disk.enabled:
        total = host_bytes_per_rank * (spec.runtime.tensor_parallel_size // spec.nodes)  # this pod's ranks
        flush = max(10, math.ceil(total / max(1, write_bytes_per_second)))
    return DrainPlan(drain, flush, drain + flush + SHUTDOWN_SECONDS)
