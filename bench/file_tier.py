"""File-tier benchmark: HiCacheFile durable writes, disk reads and startup, parent vs patched, in one run.

Each tree (the pinned ``sglang==0.5.23`` parent and the same wheel patched by ``runtime_patches``) runs in
its own interpreter against the same directory's disk:

- durable write: ``batch_set`` of ``--pages`` pages; for the parent plus the one ``syncfs`` it needs to be
  durable at all (it never syncs), for the patched tree as is (it ends every batch with one sync);
- disk read: every page file is dropped from the page cache (``posix_fadvise(DONTNEED)`` after the sync),
  then ``get`` each page (the patched tree also verifies the header and xxh3-64 checksum);
- warm read: the same ``get`` again, from the page cache (memory speed: the checksum pass shows here);
- startup: the ``HiCacheFile`` constructor with ``--startup-files`` page files (+1% stale temporaries) in the
  directory, with the size cap on (``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``, as the operator deploys it).

    python bench/file_tier.py [--pages 512] [--startup-files 100000] [--dir /var/tmp] [--repeat 3]
    python bench/file_tier.py --smoke     # seconds; what the test runs so the bench cannot break unnoticed

Prints the rates, the patched/parent ratio beside each target, and exits 1 when a target is missed
(not in ``--smoke``, whose sizes are too small to measure anything).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness.sim.sglang_tree import PATCHES, fetch_wheel  # noqa: E402

PAGE_TOKENS = 64
PAGE_BYTES = PAGE_TOKENS * 2 * 8 * 128 * 2 * 4  # 64 tokens x K+V x 8 heads x 128 dim x bf16 x 4 layers
TARGETS = {"durable_write": 0.90, "disk_read": 0.95}  # patched / parent, same run
STARTUP_LIMIT_S = 2.0  # patched constructor with --startup-files files

WORKER = r"""
import ctypes, json, logging, os, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[6]); logging.disable(logging.CRITICAL)
from harness.sim.sglang_tree import import_hicache_storage
hs = import_hicache_storage(sys.argv[1])
import torch
work, pages, page_bytes, startup_files = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def store(path):
    cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True, model_name="bench")
    return hs.HiCacheFile(cfg, file_path=path)
def syncfs(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
def drop_cache(path):
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
pages_dir = os.path.join(work, "pages")
s = store(pages_dir)
patched = hasattr(s, "sync")
keys = [f"{i:064x}" for i in range(pages)]
value = torch.randint(0, 256, (page_bytes,), dtype=torch.uint8)
syncfs(work)
t = time.perf_counter()
ok = s.batch_set(keys, [value] * pages)
if not patched:
    syncfs(pages_dir)  # the parent's pages are durable only after a sync it never makes
write_s = time.perf_counter() - t
syncfs(pages_dir); drop_cache(pages_dir)
target = torch.empty(page_bytes, dtype=torch.uint8)
t = time.perf_counter(); got = [s.get(k, target) is not None for k in keys]; disk_read_s = time.perf_counter() - t
t = time.perf_counter(); got += [s.get(k, target) is not None for k in keys]; warm_read_s = time.perf_counter() - t
same = torch.equal(target, value)
crowd = os.path.join(work, "crowd"); os.makedirs(crowd)
for i in range(startup_files):
    open(os.path.join(crowd, f"{i:064x}_bench_0_1.bin"), "wb").close()
for i in range(startup_files // 100):
    open(os.path.join(crowd, f".{i:032x}.tmp"), "wb").close()
os.environ["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] = "500G"
t = time.perf_counter(); store(crowd); startup_s = time.perf_counter() - t
left_tmp = sum(n.endswith(".tmp") for n in os.listdir(crowd))
print(json.dumps({"ok": bool(ok and all(got) and same), "write_s": write_s, "disk_read_s": disk_read_s,
                  "warm_read_s": warm_read_s, "startup_s": startup_s, "tmp_left": left_tmp}))
"""


def trees(work: Path) -> dict[str, Path]:
    """The pinned wheel (pip-fetched once, sha256-checked) unpacked, and a copy patched by verify.py --apply."""
    parent = work / "parent"
    with zipfile.ZipFile(fetch_wheel()) as zf:
        zf.extractall(parent, [n for n in zf.namelist() if n.startswith("sglang/")])
    patched = work / "patched"
    shutil.copytree(parent, patched)
    subprocess.run([sys.executable, str(PATCHES / "verify.py"), "--tree", str(patched), "--apply"],
                   check=True, capture_output=True)  # fmt: skip
    return {"parent": parent, "patched": patched}


def measure(tree: Path, work: Path, pages: int, startup_files: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(tree), str(work), str(pages), str(PAGE_BYTES), str(startup_files),
         str(REPO)],
        capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise SystemExit(f"{tree.name}: pages did not read back: {result}")
    return result


def best_of(runs: list[dict]) -> dict:
    """Per metric, the fastest of the interleaved repeats (the machine is shared; noise only slows things)."""
    return {k: min(r[k] for r in runs) for k in ("write_s", "disk_read_s", "warm_read_s", "startup_s")} | {
        "tmp_left": max(r["tmp_left"] for r in runs)
    }


def report(results: dict[str, dict], pages: int, startup_files: int) -> tuple[list[str], list[str]]:
    """Printable lines and the list of missed targets."""
    total = pages * PAGE_BYTES
    par, pat = results["parent"], results["patched"]
    rows = [
        ("durable write MB/s", "write_s", TARGETS["durable_write"]),
        ("disk read MB/s", "disk_read_s", TARGETS["disk_read"]),
        ("warm read MB/s (page cache)", "warm_read_s", None),
    ]
    lines = [f"page {PAGE_BYTES} B ({PAGE_TOKENS} tokens), {pages} pages, {startup_files} files at startup",
             f"{'metric':30} {'parent':>9} {'patched':>9} {'ratio':>7} {'target':>8}"]  # fmt: skip
    missed = []
    for label, key, target in rows:
        a, b = total / par[key] / 1e6, total / pat[key] / 1e6
        ratio = b / a
        shown = f">= {target:.2f}x" if target else "-"
        lines.append(f"{label:30} {a:9.0f} {b:9.0f} {ratio:6.2f}x {shown:>8}")
        if target and ratio < target:
            missed.append(f"{label}: {ratio:.2f}x < {target:.2f}x")
    lines.append(f"{'startup s (cap on)':30} {par['startup_s']:9.3f} {pat['startup_s']:9.3f} {'':>7} "
                 f"{f'< {STARTUP_LIMIT_S:.1f} s':>8}")  # fmt: skip
    lines.append(f"{'stale .tmp left after startup':30} {par['tmp_left']:9d} {pat['tmp_left']:9d}")
    if pat["startup_s"] >= STARTUP_LIMIT_S:
        missed.append(f"startup: {pat['startup_s']:.2f} s >= {STARTUP_LIMIT_S} s")
    if pat["tmp_left"]:
        missed.append(f"startup left {pat['tmp_left']} stale temporaries")
    return lines, missed


def run(pages: int, startup_files: int, directory: str | None, repeat: int) -> tuple[dict, list[str], list[str]]:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        work = Path(tmp)
        sources = trees(work)
        runs: dict[str, list[dict]] = {name: [] for name in sources}
        for i in range(repeat):  # interleaved, so drift in the machine's load hits both trees alike
            for name, tree in sources.items():
                runs[name].append(measure(tree, work / f"run-{name}-{i}", pages, startup_files))
        results = {name: best_of(r) for name, r in runs.items()}
    lines, missed = report(results, pages, startup_files)
    return results, lines, missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--startup-files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat; checks the bench runs")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    args = ap.parse_args(argv)
    if args.smoke:
        args.pages, args.startup_files, args.repeat = 4, 200, 1
    results, lines, missed = run(args.pages, args.startup_files, args.dir, args.repeat)
    print("\n".join(lines))
    if args.json:
        print(json.dumps(results, sort_keys=True))
    if args.smoke:
        return 0
    for m in missed:
        print(f"TARGET MISSED: {m}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
