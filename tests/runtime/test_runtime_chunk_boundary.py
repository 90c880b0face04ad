"""Hybrid backup gap (b), upstream sglang #30882 / PR #21350 (vLLM #50409): a prompt of exactly k * grid tokens tracks
its Mamba checkpoint at its end, where an identical prompt's lookup (input_len - 1 at most) cannot reach it. Patch 0005
tracks the previous grid boundary in the final extend. chunk_boundary_probe.py drives each tree's own track decision,
backend track plan, radix tree insert and match on CPU (grid = page = state chunk = 64). The patched-tree assertions
fail on the parent's report (single, 4-grid and chunked cases); the controls hold on both."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json

G = 64


def probe(tree: Path) -> dict:
    return run_json("chunk_boundary_probe.py", tree)


@pytest.fixture(scope="module")
def reports(parent_tree: Path, patched_tree: Path) -> dict:
    return {"parent": probe(parent_tree), "patched": probe(patched_tree)}


def tracks(case: dict) -> list[tuple]:
    return [(e["extend"], e["tracked_depth"], e.get("snapshot"), e.get("snapshot_depth")) for e in case["extends"]]


@pytest.mark.parametrize("name, k", [("exact_2grid_single", 2), ("exact_4grid_single", 4)])
def test_single_extend_exact_multiple_is_matched_to_the_previous_boundary(reports, name, k):
    parent, patched = reports["parent"][name], reports["patched"][name]
    assert parent["max_prefix_len"] == patched["max_prefix_len"] == k * G - 1
    # Parent: the only state is the final one at k*G, beyond the lookup: nothing is matched.
    assert tracks(parent) == [([0, k * G], k * G, "final_state", k * G)]
    assert parent["matched"] == 0
    # (the match reports a branching point there, so only a third identical request would hit it)
    assert parent["mamba_branching_seqlen"] == (k - 1) * G
    # Patched: the previous boundary, snapshotted from the intermediate h state at its chunk.
    assert tracks(patched) == [([0, k * G], (k - 1) * G, "h", (k - 1) * G)]
    assert patched["extends"][0]["track_seqlen"] == (k - 1) * G + 1  # _force_track_h
    assert patched["extends"][0]["h_src"] == (k - 1) * G // G
    assert patched["matched"] == (k - 1) * G
    assert patched["mamba_branching_seqlen"] is None


def test_chunked_exact_multiple_final_chunk_tracks_the_previous_boundary_non_final_unchanged(reports):
    parent, patched = reports["parent"]["exact_4grid_chunked_2grid"], reports["patched"]["exact_4grid_chunked_2grid"]
    # The non-final chunk [0, 128) keeps its full-boundary track (final state) on both trees.
    assert tracks(parent)[0] == tracks(patched)[0] == ([0, 2 * G], 2 * G, "final_state", 2 * G)
    assert parent["extends"][0]["inserted_len"] == patched["extends"][0]["inserted_len"] == 2 * G
    # Final chunk [128, 256): parent at 256 (unreachable: the hit falls back to the first chunk's 128), patched 192.
    assert tracks(parent)[1] == ([2 * G, 4 * G], 4 * G, "final_state", 4 * G)
    assert parent["matched"] == 2 * G
    assert tracks(patched)[1] == ([2 * G, 4 * G], 3 * G, "h", 3 * G)
    assert patched["matched"] == 3 * G


@pytest.mark.parametrize("name", ["control_2grid_plus_2", "control_4grid_plus_2_chunked", "exact_1grid_single"])
def test_controls_unchanged(reports, name):
    """A non-multiple prompt (single or chunked, whose 128-token middle chunk ends on the grid and is not final)
    and a one-grid prompt (no earlier boundary) track and match the same on both trees."""
    parent, patched = reports["parent"][name], reports["patched"][name]
    assert parent == patched
    expected = {"control_2grid_plus_2": 2 * G, "control_4grid_plus_2_chunked": 4 * G, "exact_1grid_single": 0}
    assert parent["matched"] == expected[name]
    if name == "control_2grid_plus_2":
        # The unaligned control's state comes from the same h path the patched exact-multiple case now takes.
        assert tracks(parent) == [([0, 2 * G + 2], 2 * G, "h", 2 * G)]
    if name == "control_4grid_plus_2_chunked":
        assert [t[1] for t in tracks(parent)] == [2 * G, 4 * G, None]


@pytest.mark.parametrize("name", ["grid_chunked_5grid_plus_10", "grid_chunked_5grid_plus_1",
                                  "grid_chunked_exact_5grid"])
def test_grid_chunks_end_the_hit_where_the_last_chunk_starts(reports, name):
    """With --chunked-prefill-size at the grid (tests/gpu/README, the token call), an identical prompt's hit resumes
    exactly where the cold run's last chunk began: the restored state is extended by the same computation the cold
    run made, so a restart's answer can be held against the cold one bit for bit."""
    case = reports["patched"][name]
    last_start = case["extends"][-1]["extend"][0]
    assert last_start == (case["prompt"] - 1) // G * G
    assert case["matched"] == last_start
