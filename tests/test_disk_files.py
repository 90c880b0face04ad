"""Page files per rank implied by the disk cap, and the warning near the one-directory limit."""

from __future__ import annotations

from qwen_hicache.disk_files import PAGE_HEADER_BYTES, REPORTED_LIMIT_FILES, WARN_FILES, disk_files


def test_one_file_per_pool_per_stored_page_with_the_header() -> None:
    page = {"kv": 1_000_000 - PAGE_HEADER_BYTES, "indexer": 0, "mamba": 1_000_000 - PAGE_HEADER_BYTES}
    out = disk_files(10_000_000, page)
    assert out.pages == 5 and out.files_by_pool == {"kv": 5, "mamba": 5} and out.files == 10
    assert out.warning is None


def test_warns_well_below_the_reported_limit() -> None:
    small_pages = {"kv": 100_000, "indexer": 4_000, "mamba": 50_000}
    cap = (WARN_FILES // 3 + 1) * sum(v + PAGE_HEADER_BYTES for v in small_pages.values())
    out = disk_files(cap, small_pages)
    assert WARN_FILES <= out.files < REPORTED_LIMIT_FILES
    assert out.warning and "one directory" in out.warning and "kv" in out.warning


def test_no_cap_or_no_pools_means_no_files() -> None:
    assert disk_files(0, {"kv": 10}).files == 0
    assert disk_files(10**9, {}).pages == 0
