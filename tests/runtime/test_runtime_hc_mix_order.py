"""Patch 0013: a decode step's hyper-connection mix sums in a fixed order unless SGLANG_HC_MIX_ATOMIC=1.

hc_mix_order_probe.py loads each tree's own ``hc_mix.py`` per value of the switch and asks
``fused_hc_mix_supported`` about decode-sized rows. What the order buys on a GPU (two cache hits of one prefix give
the same tokens and log-probs) is measured by the engine run (tests/gpu, bench/gpu_engine.md, 2026-12-07).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json

DECODE_ROWS = ("1", "2", "4", "16")  # the atomic kernel's range; 17 rows and more always took the ordered chain


@pytest.fixture(scope="module")
def patched(patched_tree: Path) -> dict:
    return run_json("hc_mix_order_probe.py", patched_tree)


@pytest.fixture(scope="module")
def parent(parent_tree: Path) -> dict:
    return run_json("hc_mix_order_probe.py", parent_tree)


def _case(out: dict, name: str) -> dict:
    assert "error" not in out[name], out[name]["error"]
    return out[name]


@pytest.mark.parametrize("switch", ["unset", "0"])
def test_patched_decode_takes_the_ordered_mix(patched: dict, switch: str):
    assert not any(_case(patched, switch).values())


def test_patched_switch_restores_the_atomic_kernel_for_decode_rows_only(patched: dict):
    got = _case(patched, "1")
    assert all(got[r] for r in DECODE_ROWS) and not got["17"]


@pytest.mark.parametrize("switch", ["unset", "1", "0"])
def test_parent_decode_takes_the_atomic_kernel_whatever_the_switch(parent: dict, switch: str):
    got = _case(parent, switch)
    assert all(got[r] for r in DECODE_ROWS) and not got["17"]
