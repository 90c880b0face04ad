"""File-tier benchmark: HiCacheFile page write/read throughput with and without the series.

Rates are shown as a ratio to the raw disk rate measured in the same run (dd with
fdatasync for writes, a cold-ish sequential read for reads), plus startup time with
100,000 page files present. Not a timed test; run by hand:

    python bench/file_tier.py [--pages 512] [--startup-files 100000] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE_TOKENS = 64
PAGE_BYTES = PAGE_TOKENS * 2 * 8 * 128 * 2 * 4  # 64 tokens x K+V x 8 heads x 128 dim x bf16 x 4 layers

WORKER = r"""
import json, logging, os, sys, time
sys.path.insert(0, sys.argv[1]); logging.disable(logging.CRITICAL)
import torch
from sglang.srt.mem_cache import hicache_storage as hs
work, pages, page_bytes, startup_files = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def store(path):
    cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True, model_name="bench")
    return hs.HiCacheFile(cfg, file_path=path)
s = store(os.path.join(work, "pages"))
keys = [f"{i:064x}" for i in range(pages)]
value = torch.randint(0, 256, (page_bytes,), dtype=torch.uint8)
t = time.perf_counter(); ok = s.batch_set(keys, [value] * pages); write_s = time.perf_counter() - t
os.system("sync")
target = torch.empty(page_bytes, dtype=torch.uint8)
t = time.perf_counter(); got = [s.get(k, target) is not None for k in keys]; read_s = time.perf_counter() - t
crowd = os.path.join(work, "crowd"); os.makedirs(crowd)
for i in range(startup_files):
    open(os.path.join(crowd, f"{i:064x}_bench_0_1.bin"), "wb").close()
for i in range(startup_files // 100):
    open(os.path.join(crowd, f".{i:032x}.tmp"), "wb").close()
t = time.perf_counter(); store(crowd); startup_s = time.perf_counter() - t
print(json.dumps({"ok": ok and all(got), "write_s": write_s, "read_s": read_s, "startup_s": startup_s}))
"""


def raw_disk(work: Path, total: int) -> tuple[float, float]:
    """Sequential dd write with fdatasync, then read back: bytes/s."""
    path = work / "dd.bin"
    count = max(1, total // (1 << 20))
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fdatasync"],
                   check=True, capture_output=True)  # fmt: skip
    write = count * (1 << 20) / (time.perf_counter() - t)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    read = count * (1 << 20) / (time.perf_counter() - t)
    path.unlink()
    return write, read


def trees(work: Path) -> dict[str, Path]:
    """Unpack the pinned wheel (fetched by the test fixtures' cache) and a patched copy."""
    sys.path.insert(0, str(REPO / "tests/runtime"))
    from conftest import PATCHES, _fetch_wheel  # noqa: PLC0415

    parent = work / "parent"
    with zipfile.ZipFile(_fetch_wheel()) as zf:
        zf.extractall(parent, [n for n in zf.namelist() if n.startswith("sglang/")])
    patched = work / "patched"
    shutil.copytree(parent, patched)
    subprocess.run([sys.executable, str(PATCHES / "verify.py"), "--tree", str(patched), "--apply"],
                   check=True, capture_output=True)  # fmt: skip
    return {"parent": parent, "patched": patched}


def measure(tree: Path, work: Path, pages: int, startup_files: int) -> dict:
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(tree), str(work), str(pages), str(PAGE_BYTES), str(startup_files)],
        capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--startup-files", type=int, default=100_000)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        sources = trees(work)
        total = args.pages * PAGE_BYTES
        disk_w, disk_r = raw_disk(work, total)
        print(f"page: {PAGE_TOKENS} tokens, {PAGE_BYTES} bytes; {args.pages} pages; raw disk "
              f"write {disk_w / 1e6:.0f} MB/s, read {disk_r / 1e6:.0f} MB/s")  # fmt: skip
        print(f"{'tree':8} {'write MB/s':>10} {'w/disk':>7} {'read MB/s':>10} {'r/disk':>7} "
              f"{'startup s (' + str(args.startup_files) + ' files)':>28}")  # fmt: skip
        for name, tree in sources.items():
            r = measure(tree, work / f"run-{name}", args.pages, args.startup_files)
            w, rd = total / r["write_s"], total / r["read_s"]
            print(f"{name:8} {w / 1e6:10.0f} {w / disk_w:7.2f} {rd / 1e6:10.0f} {rd / disk_r:7.2f} "
                  f"{r['startup_s']:28.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
