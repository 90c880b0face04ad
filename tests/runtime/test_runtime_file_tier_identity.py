"""Patch 0006: a page is bound to its key, I/O errors keep the page, discards are exported, one sync per backup.

file_tier_identity_probe.py runs each tree's own code on CPU (HiCacheFile, the HybridCacheController backup
thread, StorageMetricsCollector fed by UnifiedRadixCache.check_hicache_events); the patched tree must behave and
the pinned parent shows each gap. The group commit also runs on a doctored copy of the patched tree whose backup
thread opens no commit scope, to show the one sync per operation comes from that scope.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from probe_run import run_json

PROBE = "file_tier_identity_probe.py"
DISCARD_REASONS = {"size", "header", "tag", "key", "checksum", "not_regular"}
READ_ERRORS = {"EIO", "EACCES", "EMFILE", "ENOMEM", "other"}


def _probe(tree: Path, work: Path, only: str | None = None) -> dict:
    report = run_json(PROBE, tree, work, *([only] if only else []))
    for name, out in report.items():
        assert "error" not in out, (name, out["error"])
    return report


@pytest.fixture(scope="module")
def reports(parent_tree: Path, patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {
        "patched": _probe(patched_tree, tmp_path_factory.mktemp("identity-patched")),
        "parent": _probe(parent_tree, tmp_path_factory.mktemp("identity-parent")),
    }


def test_a_page_copied_under_another_key_is_a_miss_and_is_removed(reports: dict):
    out = reports["patched"]["copied_page"]
    assert (out["hit"], out["served_other_keys_bytes"], out["file_left"], out["exists_after"]) == (
        False, False, False, False)  # fmt: skip
    assert out["discards"] == {"key": 1} and out["original_still_reads"] is True


def test_parent_serves_a_copied_page_as_that_keys_page(reports: dict):
    out = reports["parent"]["copied_page"]
    assert out["hit"] is True and out["served_other_keys_bytes"] is True and out["file_left"] is True


@pytest.mark.parametrize("error", ["EMFILE", "EIO", "EACCES"])
def test_an_io_error_is_a_counted_miss_that_keeps_the_page(reports: dict, error: str):
    out = reports["patched"]["io_errors"][error]
    assert out["raised"] is None and out["hit"] is False  # a miss, the batch goes on
    assert out["file_left"] is True and out["exists_after"] is True and out["reads_after_the_error"] is True
    assert out["read_errors"] == {error: 1} and out["discards"] == {}


@pytest.mark.parametrize("error", ["EMFILE", "EIO", "EACCES"])
def test_parent_lets_an_io_error_kill_the_batch(reports: dict, error: str):
    assert reports["parent"]["io_errors"][error]["raised"] is not None


def _samples(lines: list[str]) -> dict[tuple[str, str], float]:
    out = {}
    for line in lines:
        name = line.split("{", 1)[0]
        found = re.search(r'(?:reason|error)="([^"]+)"', line)
        label = found.group(1) if found else ""
        assert 'storage_backend="file"' in line and 'tp_rank="0"' in line, line
        out[(name, label)] = float(line.rsplit(" ", 1)[1])
    return out


def test_discards_and_read_errors_are_exported_from_the_first_one(reports: dict):
    """Every reason and error class exists at 0 with the collector (increase() sees the first), then counts."""
    out = reports["patched"]["exported"]
    discards, errors = "sglang:hicache_storage_page_discards_total", "sglang:hicache_storage_read_errors_total"
    evicted = "sglang:hicache_storage_evicted_pages_total"
    writes = {"sglang:hicache_storage_written_bytes_total", "sglang:hicache_storage_write_seconds_total"}
    before, after = (
        {k: v for k, v in _samples(out[when]).items() if k[0] not in writes} for when in ("before", "after"))
    assert before == {**{(discards, r): 0.0 for r in DISCARD_REASONS}, **{(errors, e): 0.0 for e in READ_ERRORS},
                      (evicted, ""): 0.0}  # fmt: skip
    assert after == {**before, (discards, "key"): 1.0, (discards, "checksum"): 1.0, (errors, "EIO"): 1.0}


def test_the_durable_write_rate_is_exported(reports: dict):
    """Bytes each commit made durable and the commit's time: 3 pages in one batch, then 5 single-page sets."""
    out = reports["patched"]["exported"]
    before, last = _samples(out["before"]), _samples(out["writes"])
    name, seconds = "sglang:hicache_storage_written_bytes_total", "sglang:hicache_storage_write_seconds_total"
    assert before[(name, "")] == 3 * out["page_file_bytes"] and before[(seconds, "")] > 0
    assert last[(name, "")] == 8 * out["page_file_bytes"] and last[(seconds, "")] > before[(seconds, "")]


def test_the_lru_evictors_work_is_exported(reports: dict):
    """Five pages into a three-page cap: the runtime's evictor removes down to 0.9 of it; each removal counts."""
    out = reports["patched"]["exported"]
    (line,) = out["after_eviction"]
    assert float(line.rsplit(" ", 1)[1]) == 5 - out["files_left"] > 0


def test_parent_exports_no_integrity_counter(reports: dict):
    out = reports["parent"]["exported"]
    assert (out["before"], out["after"], out["after_eviction"], out["writes"]) == ([], [], [], [])


def test_one_sync_per_backup_operation_before_its_ack(reports: dict):
    """A 200-page hybrid backup (two KV chunks, one sidecar group) and a 4-page one: one sync each, then the ack."""
    out = reports["patched"]["group_commit"]
    assert out["events"] == ["sync", "ack 200", "sync", "ack 4"]
    assert out["kv_pages_stored"] == 204 and out["mamba_states_stored"] == 2


def test_parent_never_syncs_a_backup(reports: dict):
    assert reports["parent"]["group_commit"]["events"] == ["ack 200", "ack 4"]


def test_without_the_backup_threads_commit_scope_each_chunk_and_group_syncs(patched_tree: Path, tmp_path: Path):
    site = tmp_path / "site"
    shutil.copytree(patched_tree, site)
    path = site / "sglang/srt/managers/cache_controller.py"
    text = path.read_text()
    assert text.count("        with commit():\n") == 1
    path.write_text(text.replace("        with commit():\n", "        with contextlib.nullcontext():\n"))
    out = _probe(site, tmp_path / "work", "group_commit")["group_commit"]
    assert out["events"] == ["sync", "sync", "sync", "ack 200", "sync", "sync", "ack 4"]


def test_a_batch_read_asks_for_all_its_files_first(reports: dict):
    out = reports["patched"]["readahead"]
    assert out["asked"] == out["files"] and out["hits"] == [True, True, True]
    assert reports["parent"]["readahead"]["asked"] == []
