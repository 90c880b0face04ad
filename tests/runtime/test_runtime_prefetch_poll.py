"""Patch 0010: while a storage prefetch is read, the scheduler's pass with nothing to run sleeps a poll interval
(default 1 ms) instead of ``sleep(0)``, leaving the GIL to the prefetch threads.

prefetch_poll_probe.py calls each tree's own ``Scheduler.on_idle`` with ``time.sleep`` recorded. What the sleep buys
is a speed, measured by ``bench/restore_path.py --scheduler`` (the prefetch path beside the tree's own idle loop),
not here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json


@pytest.fixture(scope="module")
def patched(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_json("prefetch_poll_probe.py", patched_tree, tmp_path_factory.mktemp("poll-patched"))


@pytest.fixture(scope="module")
def parent(parent_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_json("prefetch_poll_probe.py", parent_tree, tmp_path_factory.mktemp("poll-parent"))


def _sleeps(out: dict, case: str) -> list[float]:
    assert "error" not in out[case], out[case]["error"]
    return out[case]["sleeps"]


def test_patched_sleeps_the_poll_interval_while_a_prefetch_is_in_flight(patched: dict):
    assert _sleeps(patched, "prefetch") == [0.001]
    assert _sleeps(patched, "interval_5ms") == [0.005]


def test_patched_keeps_sleep_0_without_a_prefetch_or_when_the_interval_is_0(patched: dict):
    assert _sleeps(patched, "no_prefetch") == [0]
    assert _sleeps(patched, "interval_0") == [0]
    assert _sleeps(patched, "storage_off") == [0]  # a disaggregation transfer's poll: unchanged


def test_parent_hands_the_gil_straight_back_in_every_case(parent: dict):
    for case in ("prefetch", "no_prefetch", "interval_0", "interval_5ms", "storage_off"):
        assert _sleeps(parent, case) == [0]
