"""Hybrid backup gap (a), upstream #33714 (a prompt longer than the chunked-prefill size is never backed up): not in
0.5.23, pinned here. chunk_backup_probe.py runs the tree's own UnifiedTreeCore on CPU for each chunk insert of a
384-token prompt in 128-token chunks; no patch touches this code, so parent and patched must agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json

NODES = [[0, 128], [128, 256], [256, 384]]


def chunk_backups(tree: Path) -> dict:
    return run_json("chunk_backup_probe.py", tree)


@pytest.fixture(scope="module")
def reports(parent_tree: Path, patched_tree: Path) -> dict:
    return {"parent": chunk_backups(parent_tree), "patched": chunk_backups(patched_tree)}


def test_trees_agree(reports: dict):
    assert reports["parent"] == reports["patched"]


def test_write_through_backs_up_each_chunk_at_its_own_insert(reports: dict):
    """Threshold 1: every chunk's insert emits a BackupKV ending in the node that chunk added (the chain also names
    the earlier chunks' nodes only because the probe never applies the backups)."""
    chunks = reports["patched"]["write_through"][:3]
    assert [c["chunk_end"] for c in chunks] == [128, 256, 384]
    for i, chunk in enumerate(chunks):
        assert chunk["backups"] == [NODES[: i + 1]], chunk


def test_selective_write_through_counts_chunk_nodes_like_any_other(reports: dict):
    """Threshold 2: one pass backs up nothing (each node hit once, chunked or not); the next request with the same
    prompt hits every chunk's node a second time and backs each up."""
    runs = reports["patched"]["write_through_selective"]
    assert all(c["backups"] == [] for c in runs[:3])
    assert runs[3]["second_request"] is True
    assert [chain[-1] for chain in runs[3]["backups"]] == NODES
