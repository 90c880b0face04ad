"""Patches 0007 and 0009: a page file of 128 KiB or more (KV pages, Mamba states) starts its writeback as soon as
it is written; smaller ones (QSA index sidecars) are left to the operation's one sync, which merges neighbouring
files into one I/O; durability still comes from that sync, before the ack.

file_tier_identity_probe.py's ``writeback`` scenario runs each tree's own HybridCacheController backup thread over
its own HiCacheFile on CPU, with the tree's ``sync_file_range`` call recorded (the file it was given, found through
/proc/self/fd, and that file's size at the call) and the size floor lowered to fall between the probe's small files
and its KV pages. The pinned parent has no such call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_scenario

SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


def _writeback(tree: Path, work: Path) -> dict:
    return run_scenario("file_tier_identity_probe.py", tree, work, "writeback")


@pytest.fixture(scope="module")
def patched(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _writeback(patched_tree, tmp_path_factory.mktemp("writeback-patched"))


def test_large_page_files_start_writeback_whole_before_their_rename_and_the_sync(patched: dict):
    """A 4-page hybrid backup writes 9 files (4 KV pages, 4 QSA index sidecars, 1 Mamba state): each file at or
    above the floor (here the 4 KV pages) is handed to the kernel whole while it still has its temporary name, the
    smaller ones are not; then the one sync, then the ack."""
    events, files = patched["events"], patched["recorded"]["files"]
    writebacks = [e.split() for e in events if e.startswith("writeback ")]
    floor = patched["probe_min_bytes"]
    sizes = patched["recorded"]["sizes"]
    assert len(files) == 9 and len(writebacks) == 4
    assert all(name.startswith(".") and name.endswith(".tmp") for _, name, *_ in writebacks)
    assert all((offset, length, flags) == ("0", "0", str(SYNC_FILE_RANGE_WRITE))
               for *_, offset, length, flags in writebacks)  # fmt: skip
    assert events[len(writebacks) :] == ["sync", "ack 4"]
    # the whole file (every byte written before the call), and exactly the files at or above the floor
    assert sorted(int(size) for _, _, size, *_ in writebacks) == [s for s in sizes if s >= floor]
    assert min(sizes) < floor  # the small files are there, and left to the sync
    assert patched["recorded"]["kv_pages_stored"] == 4 and patched["recorded"]["mamba_states_stored"] == 1


def test_the_floor_is_128_kib(patched: dict) -> None:
    """Between Flash-Next's QSA index page (53 KB a rank at TP 2) and its KV page (426 KB), as bench/file_tier.py
    measured it; the probe lowers it only to fit its own small geometry."""
    assert patched["min_bytes"] == 128 << 10


@pytest.mark.parametrize("case", ["absent", "failing"])
def test_without_sync_file_range_or_when_it_fails_the_backup_still_writes_every_page(patched: dict, case: str):
    out = patched[case]
    assert (out["kv_pages_stored"], out["mamba_states_stored"], len(out["files"])) == (4, 1, 9)


def test_parent_starts_no_writeback(parent_tree: Path, tmp_path: Path):
    out = _writeback(parent_tree, tmp_path)
    assert out["has_writeback"] is False and not any(e.startswith("writeback ") for e in out["events"])
    assert out["events"] == ["ack 4"]  # and never syncs (0006's test shows it)
    assert out["min_bytes"] is None
