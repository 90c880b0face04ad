"""A tree's own ``Scheduler.on_idle`` on a scheduler that is not fully idle (a request waits), for patch 0010's probe
and bench/restore_path.py's ``--scheduler`` loop.

The methods are compiled from the tree's ``scheduler.py`` (the module itself imports the OpenAI protocol models,
which the CPU runner lacks) in a namespace holding what their bodies name; the scheduler is a namespace holding
only what on_idle's not-idle branch reads. Import after the tree is on ``sys.path``.
"""

from __future__ import annotations

import ast
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from sglang.srt.disaggregation.utils import DisaggregationMode


def methods(tree: Path, *names: str) -> dict:
    """The Scheduler's methods of these names that the tree has, by name."""
    source = tree / "sglang/srt/managers/scheduler.py"
    module = ast.parse(source.read_text())
    stall = next(n for n in module.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) ==
                 "LOAD_STALL_REFRESH_S")  # fmt: skip
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    fns = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for fn in fns:
        fn.returns, fn.decorator_list = None, []
    namespace = {"time": time, "os": os, "DisaggregationMode": DisaggregationMode}
    exec(compile(ast.Module([stall, *fns], []), str(source), "exec"), namespace)
    return {fn.name: namespace[fn.name] for fn in fns}


INTERVAL = "SGLANG_HICACHE_PREFETCH_POLL_INTERVAL"  # patch 0010's variable


@contextlib.contextmanager
def poll_interval(value: str | None) -> Iterator[None]:
    """Patch 0010's variable set to ``value`` (None: unset, the tree's default) while the block runs, unset after."""
    os.environ.pop(INTERVAL, None)
    if value is not None:
        os.environ[INTERVAL] = value
    try:
        yield
    finally:
        os.environ.pop(INTERVAL, None)


def waiting_scheduler(tree: Path, storage: bool, ongoing_prefetch: dict, disagg: bool = False):
    """The tree's own ``on_idle``, bound to a scheduler where a request waits; ``ongoing_prefetch`` is the tree
    cache's, shared (a caller may fill and empty it while the loop runs)."""
    found = methods(tree, "on_idle", "_storage_prefetch_poll_s")
    nothing = SimpleNamespace(drop_sync_wait_carry=lambda: None, record_scheduler_active=lambda ns: None)
    s = SimpleNamespace(
        dp_attn_adapter=nothing,
        metrics_reporter=nothing,
        maybe_send_health_check_signal=lambda: None,
        is_fully_idle=lambda *a, **k: False,
        _last_stall_publish_ts=time.monotonic() + 1e9,  # no load publish (it needs the real scheduler)
        enable_hicache_storage=storage,
        enable_lmcache=False,
        disaggregation_mode=DisaggregationMode.PREFILL if disagg else DisaggregationMode.NULL,
        tree_cache=SimpleNamespace(ongoing_prefetch=ongoing_prefetch),
    )
    if "_storage_prefetch_poll_s" in found:
        s._storage_prefetch_poll_s = found["_storage_prefetch_poll_s"].__get__(s)
    return found["on_idle"].__get__(s)
