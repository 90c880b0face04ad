"""Patch 0008: the file tier reads a disk hit into reused, unpinned staging buffers, not into a pinned, zero-filled
dummy page per page read.

file_tier_identity_probe.py's ``staging`` scenario backs up a 130-page hybrid operation through each tree's own
backup thread, then reads it back twice through the hybrid controller's own ``_page_transfer`` (KV in batches of
128 and 2 with each page's QSA index sidecar, then the Mamba state into another slot), the host pools cleared before
each read. Pinning itself needs CUDA; on CPU the probe counts the dummy pages each host pool makes (each one is
allocated pinned on a GPU server, ``pin_memory=True``) and the distinct buffers the file tier reads into.

Since patch 0012 the page-first pools here are read in place (test_runtime_file_tier_direct_read.py); this staging
path is what its switch at 0 (SGLANG_HICACHE_FILE_DIRECT_READ=0) and layer_first pools still take, so the probe runs
with the switch at 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_scenario

PAGES = 130  # two KV batches: 128 + 2


def _staging(tree: Path, work: Path) -> dict:
    # Patch 0012 reads page-first pools in place; its switch at 0 keeps this path (and layer_first pools take it).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_HICACHE_FILE_DIRECT_READ", "0")
        return run_scenario("file_tier_identity_probe.py", tree, work, "staging")


@pytest.fixture(scope="module")
def patched(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _staging(patched_tree, tmp_path_factory.mktemp("staging-patched"))


@pytest.fixture(scope="module")
def parent(parent_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _staging(parent_tree, tmp_path_factory.mktemp("staging-parent"))


def test_every_read_restores_every_page_and_state_exactly_on_both_trees(patched: dict, parent: dict):
    for out in (patched, parent):
        for read in out["reads"]:
            assert (read["kv_tokens"], read["mamba_states"], read["same"]) == (PAGES * 64, 1, [True, True, True])
            assert read["gets"] == 2 * PAGES + 1  # KV pages, their index sidecars, one Mamba state


def test_patched_pools_make_one_dummy_page_each_once_and_reads_reuse_one_arena(patched: dict):
    first, second = patched["reads"]
    assert patched["has_staging"]
    assert first["dummies"] == {"kv": 1, "indexer": 1, "mamba": 1}  # the arena's shape and dtype, once per pool
    assert second["dummies"] == {"kv": 0, "indexer": 0, "mamba": 0}
    assert patched["buffers_both_reads"] == 128 + 1 + 1  # a 128-page KV arena, one index and one Mamba buffer


def test_parent_makes_a_dummy_page_for_every_page_it_reads(parent: dict):
    for read in parent["reads"]:
        assert read["dummies"] == {"kv": PAGES, "indexer": PAGES, "mamba": 1}
    assert not parent["has_staging"]
