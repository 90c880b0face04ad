"""The grace period covers a pod's stop as the runtime spends it: the preStop's wait and flush, then SIGTERM.

The runtime's terms come from the patched tree's own code: the tokenizer's SIGTERM watchdog poll (read from
`TokenizerManager.sigterm_watchdog`) and the ShutdownReq-to-SIGKILL deadline (`_scheduler_exit_timeout`, run by
runtime_probe.exit_grace with the operator's drain timeout); the preStop's own terms from its script.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from qwen_hicache import podlifecycle as pl
from qwen_hicache.plan import parse_spec
from resources import example


def _watchdog_sleeps(tree: Path) -> set[float]:
    module = ast.parse((tree / "sglang/srt/managers/tokenizer_manager.py").read_text())
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "TokenizerManager")
    fn = next(n for n in klass.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "sigterm_watchdog")
    return {call.args[0].value for call in ast.walk(fn) if isinstance(call, ast.Call)
            and ast.unparse(call.func) == "asyncio.sleep" and isinstance(call.args[0], ast.Constant)}  # fmt: skip


def test_the_runtimes_terms_are_the_wheels(patched_tree: Path, probes: dict) -> None:
    assert _watchdog_sleeps(patched_tree) == {pl.RUNTIME_SIGTERM_POLL_SECONDS}
    grace = probes["patched"]["exit_grace"]  # _scheduler_exit_timeout() per SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT
    for timeout in ("8", "120"):
        assert grace[timeout] == max(pl.RUNTIME_EXIT_FLOOR_SECONDS, float(timeout) + pl.RUNTIME_EXIT_SLACK_SECONDS)
    assert grace["used_for_the_kill_deadline"] is True


def test_the_prestops_terms_are_its_scripts() -> None:
    timeouts = [float(t) for t in re.findall(r"urlopen\(base \+ \"/metrics\", timeout=(\d+)\)", pl.PRESTOP_SCRIPT)]
    sleeps = [float(t) for t in re.findall(r"time\.sleep\((\d+)\)", pl.PRESTOP_SCRIPT)]
    assert timeouts and sleeps and max(timeouts) + max(sleeps) == pl.PRESTOP_POLL_SECONDS
    reply = re.search(r"timeout=float\(flush\) \+ (\d+)\)", pl.PRESTOP_SCRIPT)
    assert reply and float(reply.group(1)) == pl.FLUSH_REPLY_SECONDS


def test_the_example_keeps_its_whole_drain_before_sigkill() -> None:
    """D = 600, F = 114 (30 GB per rank x 2 at 500 MiB/s): the old D + F + 30 left 20 s of the drain's F."""
    spec = parse_spec(example()["spec"])
    plan = pl.drain_plan(spec, host_bytes_per_rank=29_871_127_856, write_bytes_per_second=500 << 20)
    d, f = plan.drain_seconds, plan.flush_seconds
    assert (d, f) == (600, 114)
    worst = d + 6 + (f + 10) + 5 + max(15, f + 7)  # preStop wait, flush and reply; SIGTERM poll; drain and exit
    assert plan.grace_seconds == worst + pl.MARGIN_SECONDS == 866
    assert d + f + 30 < worst  # the old budget: SIGKILL before the runtime's own drain deadline
