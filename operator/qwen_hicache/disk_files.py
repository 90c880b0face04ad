"""How many page files the disk-tier cap implies in the runtime's one flat directory per rank. Pure.

SGLang 0.5.23's ``HiCacheFile`` keeps every page of every pool of a rank as one file in a single directory
(no sharding, upstream #28654). Upstream reports ENOSPC around 7.5 M files in one directory (ext4's directory
index fills up long before the disk does). The file count follows from the cap: each stored page writes one
KV file, one QSA indexer file (with QSA) and at most one Mamba state file (Mamba keeps trailing pages only,
so this is an upper bound), each with the series' 64-byte page header (runtime patch 0001).
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE_HEADER_BYTES = 64
"""The runtime page-file header (patch 0001; 0006 adds the key digest in the same 64 bytes)."""
REPORTED_LIMIT_FILES = 7_500_000
"""Files in one HiCacheFile directory at which upstream reports ENOSPC."""
WARN_FILES = 2_000_000
"""Warn well below the reported limit: directory growth, startup scans and metadata cost rise with it too."""


@dataclass(frozen=True)
class DiskFiles:
    """Page files per rank implied by the cap, per pool, and the warning if they come near the limit."""

    pages: int
    files_by_pool: dict[str, int]
    warning: str | None

    @property
    def files(self) -> int:
        return sum(self.files_by_pool.values())


def disk_files(cap_bytes_per_rank: int, page_bytes_by_pool: dict[str, int]) -> DiskFiles:
    """Files a full cap holds: every stored page writes one file per pool (pools with 0 bytes write none)."""
    pools = {name: size for name, size in page_bytes_by_pool.items() if size > 0}
    per_page = sum(size + PAGE_HEADER_BYTES for size in pools.values())
    pages = cap_bytes_per_rank // per_page if per_page else 0
    files = {name: pages for name in pools}
    total = sum(files.values())
    warning = None
    if total >= WARN_FILES:
        warning = (
            f"the disk cap implies {total:,} page files per rank in one directory "
            f"({', '.join(f'{n} {c:,}' for n, c in files.items())}); upstream reports ENOSPC near "
            f"{REPORTED_LIMIT_FILES:,} files in one HiCacheFile directory: lower capPerRank or raise pageSize"
        )
    return DiskFiles(pages, files, warning)
