"""Patch 0001: HiCacheFile page-file integrity, checked on both trees.

Each scenario runs in runtime_probe.py against the patched tree (must behave) and
the pinned parent (must show the bug), so these tests fail without the series.
"""

from __future__ import annotations

import pytest

WRONG_SIZE = ["truncated", "short", "oversized"]
RIGHT_SIZE_WRONG_BYTES = ["zeroed", "zeroed_tail", "sparse_hole", "bit_flip", "foreign_tag"]
BAD_PAGES = [*WRONG_SIZE, *RIGHT_SIZE_WRONG_BYTES, "unreadable", "vanished", "old_format"]
REASON = {
    "truncated": "size", "short": "size", "oversized": "size", "old_format": "size",
    "zeroed": "header", "zeroed_tail": "checksum", "sparse_hole": "checksum", "bit_flip": "checksum",
    "foreign_tag": "tag", "unreadable": "not_regular",
}  # fmt: skip


@pytest.mark.parametrize("scenario", BAD_PAGES)
def test_bad_page_is_a_miss_and_is_removed(probes: dict, scenario: str):
    out = probes["patched"][scenario]
    assert out.get("raised") is None, out
    assert out["exists_before"] is True
    assert out["results"] == [True, False, True]  # the batch survives; only the bad page misses
    assert out["bad_path_left"] is False and out["exists_after"] is False
    assert out["discards"] == ({REASON[scenario]: 1} if scenario in REASON else {})  # the counter goes up


@pytest.mark.parametrize("scenario", [*WRONG_SIZE, "unreadable"])
def test_parent_exhibits_the_bad_page_bug(probes: dict, scenario: str):
    out = probes["parent"][scenario]
    # Either the exception kills the prefetch batch, or the wrong-size page is
    # used silently; in every case the bad file stays to be hit again.
    assert out["raised"] is not None or out["results"] == [True, True, True], out
    assert out["bad_path_left"] is True


@pytest.mark.parametrize("scenario", ["zeroed", "zeroed_tail", "sparse_hole", "bit_flip"])
def test_parent_serves_right_size_wrong_bytes_as_a_hit(probes: dict, scenario: str):
    out = probes["parent"][scenario]
    assert out["raised"] is None and out["results"] == [True, True, True] and out["bad_path_left"] is True, out


def test_quarantined_directory_is_swept_at_the_next_start(probes: dict):
    assert probes["patched"]["unreadable"]["left_after_restart"] == []


def test_crash_leftovers_are_swept_at_startup(probes: dict):
    assert probes["patched"]["crash_leftovers"]["left"] == ["keep.bin"]  # files and quarantined directories
    assert probes["parent"]["crash_leftovers"]["left"] != ["keep.bin"]


def test_one_sync_per_batch_and_no_per_page_fsync(probes: dict):
    out = probes["patched"]["durability"]
    assert out["one_page"] == {"fsyncs": 0, "syncs": 1}
    assert out["batch_of_3"] == {"fsyncs": 0, "syncs": 1}
    assert out["batch_already_stored"] == {"fsyncs": 0, "syncs": 0}  # nothing written, nothing to sync
    assert probes["parent"]["durability"]["batch_of_3"] == {"fsyncs": 0, "syncs": 0}


@pytest.mark.parametrize("tree", ["patched", "parent"])
def test_restart_reads_kv_mamba_ple_and_qsa_pages_byte_for_byte(probes: dict, tree: str):
    out = probes[tree]["restart_round_trip"]
    assert "error" not in out, out.get("error")
    assert out["same"] == {"kv": True, "mamba": True, "indexer": True}
    assert all(all(r) for r in out["results"].values())
    assert out["kv_hit_pages"] == 2
