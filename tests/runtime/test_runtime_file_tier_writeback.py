"""Patch 0007: each page file's writeback starts as soon as its bytes are written; durability still comes from the
operation's one sync, before its ack.

file_tier_identity_probe.py's ``writeback`` scenario runs each tree's own HybridCacheController backup thread over
its own HiCacheFile on CPU, with the tree's ``sync_file_range`` call recorded (the file it was given, found through
/proc/self/fd, and that file's size at the call). The pinned parent has no such call.
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


def test_every_page_file_of_a_backup_starts_writeback_whole_before_its_rename_and_the_sync(patched: dict):
    """A 4-page hybrid backup writes 9 files (4 KV pages, 4 QSA index sidecars, 1 Mamba state): each one's whole
    file is handed to the kernel while it still has its temporary name, then the one sync, then the ack."""
    events, files = patched["events"], patched["recorded"]["files"]
    writebacks = [e.split() for e in events if e.startswith("writeback ")]
    assert len(files) == len(writebacks) == 9
    assert all(name.startswith(".") and name.endswith(".tmp") for _, name, *_ in writebacks)
    assert all((offset, length, flags) == ("0", "0", str(SYNC_FILE_RANGE_WRITE))
               for *_, offset, length, flags in writebacks)  # fmt: skip
    assert events[len(writebacks) :] == ["sync", "ack 4"]
    sizes = sorted(int(size) for _, _, size, *_ in writebacks)
    assert sizes == patched["recorded"]["sizes"]  # the whole file: every byte written before the call
    assert patched["recorded"]["kv_pages_stored"] == 4 and patched["recorded"]["mamba_states_stored"] == 1


@pytest.mark.parametrize("case", ["absent", "failing"])
def test_without_sync_file_range_or_when_it_fails_the_backup_still_writes_every_page(patched: dict, case: str):
    out = patched[case]
    assert (out["kv_pages_stored"], out["mamba_states_stored"], len(out["files"])) == (4, 1, 9)


def test_parent_starts_no_writeback(parent_tree: Path, tmp_path: Path):
    out = _writeback(parent_tree, tmp_path)
    assert out["has_writeback"] is False and not any(e.startswith("writeback ") for e in out["events"])
    assert out["events"] == ["ack 4"]  # and never syncs (0006's test shows it)
