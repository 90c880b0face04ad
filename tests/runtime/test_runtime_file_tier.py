"""Patch 0001: HiCacheFile page-file integrity, checked on both trees.

Each scenario runs in runtime_probe.py against the patched tree (must behave) and
the pinned parent (must show the bug), so these tests fail without the series.
"""

from __future__ import annotations

import pytest

BAD_PAGES = ["truncated", "short", "oversized", "unreadable", "vanished"]


@pytest.mark.parametrize("scenario", BAD_PAGES)
def test_bad_page_is_a_miss_and_is_removed(probes: dict, scenario: str):
    out = probes["patched"][scenario]
    assert out.get("raised") is None, out
    assert out["exists_before"] is True
    assert out["results"] == [True, False, True]  # the batch survives; only the bad page misses
    assert out["bad_path_left"] is False and out["exists_after"] is False


@pytest.mark.parametrize("scenario", ["truncated", "short", "oversized", "unreadable"])
def test_parent_exhibits_the_bad_page_bug(probes: dict, scenario: str):
    out = probes["parent"][scenario]
    # Either the exception kills the prefetch batch, or the wrong-size page is
    # used silently; in every case the bad file stays to be hit again.
    assert out["raised"] is not None or out["results"] == [True, True, True], out
    assert out["bad_path_left"] is True


def test_crash_leftovers_are_swept_at_startup(probes: dict):
    assert probes["patched"]["crash_leftovers"]["left"] == ["keep.bin"]
    assert probes["parent"]["crash_leftovers"]["left"] != ["keep.bin"]


def test_page_and_directory_are_fsynced(probes: dict):
    assert probes["patched"]["durability"]["fsyncs"] >= 2  # the page before rename, then the directory
    assert probes["parent"]["durability"]["fsyncs"] == 0


@pytest.mark.parametrize("tree", ["patched", "parent"])
def test_restart_reads_kv_mamba_ple_and_qsa_pages_byte_for_byte(probes: dict, tree: str):
    out = probes[tree]["restart_round_trip"]
    assert "error" not in out, out.get("error")
    assert out["same"] == {"kv": True, "mamba": True, "indexer": True}
    assert all(all(r) for r in out["results"].values())
    assert out["kv_hit_pages"] == 2
