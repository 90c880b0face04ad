"""Patch 0010 on one sglang tree's own code, on CPU: how long the scheduler's idle pass sleeps.

    python prefetch_poll_probe.py TREE WORKDIR

Calls the tree's own ``Scheduler.on_idle`` (scheduler_idle.py) on a scheduler that is not fully idle (a request
waits), with ``time.sleep`` recorded, in each case below, and prints the sleeps per case (the tests decide):

* ``prefetch``: HiCache storage on, a storage prefetch in flight (``tree_cache.ongoing_prefetch``);
* ``no_prefetch``: storage on, nothing in flight (the request waits for memory, say);
* ``interval_0`` / ``interval_5ms``: a prefetch in flight, ``SGLANG_HICACHE_PREFETCH_POLL_INTERVAL`` 0 / 0.005;
* ``storage_off``: no HiCache storage, disaggregation on (the transfer workers' poll).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path

import cpu_stub

TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

from scheduler_idle import poll_interval, waiting_scheduler  # noqa: E402


def sleeps(storage: bool, in_flight: bool, interval: str | None = None, disagg: bool = False) -> list[float]:
    """The sleeps of one on_idle pass."""
    on_idle = waiting_scheduler(TREE, storage, {"rid": object()} if in_flight else {}, disagg)
    recorded: list[float] = []
    real = time.sleep
    with poll_interval(interval):
        time.sleep = recorded.append
        try:
            on_idle()
        finally:
            time.sleep = real
    return recorded


CASES = {
    "prefetch": lambda: sleeps(True, True),
    "no_prefetch": lambda: sleeps(True, False),
    "interval_0": lambda: sleeps(True, True, "0"),
    "interval_5ms": lambda: sleeps(True, True, "0.005"),
    "storage_off": lambda: sleeps(False, True, disagg=True),
}

if __name__ == "__main__":
    out: dict = {}
    for name, case in CASES.items():
        try:
            out[name] = {"sleeps": case()}
        except Exception:  # noqa: BLE001 (reported, the test fails on it)
            out[name] = {"error": traceback.format_exc()}
    print(json.dumps(out))
