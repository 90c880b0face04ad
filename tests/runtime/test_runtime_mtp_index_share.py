"""Patch 0011: the MTP draft's shared QSA row keeps its valid entries first, so the packed gather reads the draft's
own positions, never stale scratch.

mtp_index_share_probe.py runs each tree's own ``QSAMTPSharedSparseIndices.lookup`` and the two Triton kernels of the
packed attention path (Triton's CPU interpreter) into a NaN-poisoned scratch. What the fix buys on a GPU (greedy
tokens that no longer depend on earlier requests) is measured by the engine run (tests/gpu, bench/gpu_engine.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json


@pytest.fixture(scope="module")
def patched(patched_tree: Path) -> dict:
    return run_json("mtp_index_share_probe.py", patched_tree, timeout=600)


@pytest.fixture(scope="module")
def parent(parent_tree: Path) -> dict:
    return run_json("mtp_index_share_probe.py", parent_tree, timeout=600)


def _case(out: dict, name: str) -> dict:
    assert "error" not in out[name], out[name]["error"]
    return out[name]


@pytest.mark.parametrize("name", ["short_selection", "no_draft_yet", "full_selection"])
def test_patched_draft_reads_exactly_its_visible_positions(patched: dict, name: str):
    got = _case(patched, name)
    assert got["rows_are_the_visible_positions"] and got["stale_rows"] == 0
    assert got["drafted_positions_packed"] == got["visible"] - (16 if name == "full_selection" else 10)
    valid = [p for p in got["row"] if p >= 0]
    assert got["row"][: len(valid)] == list(range(len(valid)))  # valid first, in order


def test_parent_draft_reads_stale_scratch_where_the_selection_is_not_full(parent: dict):
    for name, stale in (("short_selection", 2), ("no_draft_yet", 1)):
        got = _case(parent, name)
        assert got["stale_rows"] == stale and got["drafted_positions_packed"] == 0
        assert not got["rows_are_the_visible_positions"]
    assert _case(parent, "full_selection")["rows_are_the_visible_positions"]  # a full selection was never hit
