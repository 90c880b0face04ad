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
- The preStop's outcome (`ok`, `failed`: the runtime refused or did not answer, `timeout`: the flush ran out its
  budget, or the hook was stopped before it answered) is written atomically to `<mount>/PRESTOP_RECORD` with the
  pod's name and uid (downward API), so the successor's `cache-usage` sidecar can report it and the rollout puts
  it into that pod's `status.restart.results[].preStop` (keyed by the predecessor's uid: never read twice). With a
  disk tier a failed flush also exits 1, the kubelet's own signal: it posts a `FailedPreStopHook` Warning on the
  pod and then sends SIGTERM as it would after a success (kubelet `executePreStopHook` only logs and records the
  error; the grace period left is unchanged), so the runtime's SIGTERM storage drain still writes what it can.
  Without a disk tier nothing queued can be lost, so the hook exits 0.
- `terminationGracePeriodSeconds` covers the worst case as the runtime spends it (`drain_plan`): the preStop's
  request wait and flush, then, after SIGTERM, the runtime's own request check, its storage drain (handed the
  same flush budget: it writes what the flush could not) and the schedulers' exit, plus a stated margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .constants import PRESTOP_RECORD, pod_script  # noqa: F401 - re-exported
from .spec import QwenHiCacheServerSpec

MARKER = ".qwen-hicache-fingerprint"

# The stop timeline, term by term (tests/runtime pins the runtime's constants against the wheel's own code).
PRESTOP_POLL_SECONDS = 6
"""The preStop's request wait overruns its deadline by at most one poll: a 5 s `/metrics` read and a 1 s sleep."""
FLUSH_REPLY_SECONDS = 10
"""The preStop waits this long past the flush timeout for the runtime's answer."""
RUNTIME_SIGTERM_POLL_SECONDS = 5
"""`TokenizerManager.sigterm_watchdog` checks for SIGTERM, then for running requests, every 5 s."""
RUNTIME_EXIT_FLOOR_SECONDS = 15
RUNTIME_EXIT_SLACK_SECONDS = 7
"""After ShutdownReq the tokenizer SIGKILLs the schedulers after max(15, drain timeout + 7) s (patch 0003)."""
MARGIN_SECONDS = 10
"""Process teardown after the schedulers exit (the tokenizer kills the process tree, the HTTP server stops)."""

GUARD_SCRIPT = pod_script("cache_guard.sh")
"""The `cache-guard` init container's `sh -c` script (it names MARKER literally; a test checks)."""
PRESTOP_SCRIPT = pod_script("prestop.py")
"""The preStop hook's `python3 -c` script (stdlib only: it runs in the runtime's own Python)."""


@dataclass(frozen=True)
class DrainPlan:
    """Seconds a stopping pod needs, term by term (shown in status)."""

    drain_seconds: int
    """D: the preStop waits this long for running requests."""
    flush_seconds: int
    """F: the preStop's `/flush_cache?timeout=F`, and the runtime's SIGTERM storage drain (patch 0003), each."""
    grace_seconds: int

    @property
    def margin_seconds(self) -> int:
        return MARGIN_SECONDS


def worst_case_stop_seconds(drain: int, flush: int) -> int:
    """The longest a pod takes to stop as the runtime spends the budget, without the margin.

    preStop: the request wait (D and one poll), the flush (F and the reply). SIGTERM: the runtime notices within
    one watchdog poll, then ShutdownReq: the schedulers drain what the flush did not write (up to F) and are
    SIGKILLed after max(15, F + 7) s. Both F's are spent only when the disk is slower than the budget assumed; the
    drain then writes what the flush could not.
    """
    prestop = drain + PRESTOP_POLL_SECONDS + (flush + FLUSH_REPLY_SECONDS if flush else 0)
    exit_deadline = max(RUNTIME_EXIT_FLOOR_SECONDS, flush + RUNTIME_EXIT_SLACK_SECONDS)
    return prestop + RUNTIME_SIGTERM_POLL_SECONDS + exit_deadline


def drain_plan(spec: QwenHiCacheServerSpec, host_bytes_per_rank: int, write_bytes_per_second: int) -> DrainPlan:
    """D = longest request; F = this pod's ranks' full host pools at the write rate (across nodes every node writes
    its own ranks' pages to its own volume, at the same time); grace = the worst case as the runtime spends them
    (`worst_case_stop_seconds`) + a margin."""
    drain = spec.runtime.max_request_seconds
    flush = 0
    if spec.hicache.disk.enabled:
        total = host_bytes_per_rank * (spec.runtime.tensor_parallel_size // spec.nodes)  # this pod's ranks
        flush = max(10, math.ceil(total / max(1, write_bytes_per_second)))
    return DrainPlan(drain, flush, worst_case_stop_seconds(drain, flush) + MARGIN_SECONDS)
