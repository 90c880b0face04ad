"""Restore-path benchmark: one deep-model disk hit read by the runtime's own prefetch-path code vs a plain read.

The GPU run (bench/gpu_engine.md, 2026-12-05 17:38) restored at 0.33-0.51 GB/s where the volume read 1.0 GB/s. This
bench asks how much of that gap the storage code itself makes, on CPU, with the patched tree (the pinned
``sglang==0.5.23`` wheel + ``runtime_patches``, built once per machine by harness.sim.sglang_tree) in its own
interpreter (bench/file_tier_worker.py, ``restore``): one request's disk hit as Flash-Next's geometry makes it
(``--pages`` KV pages of 12 full-attention layers x 256-wide K and V (768 KiB), their QSA index sidecars, the
Mamba state of the last page: 36 layers x 32 heads x 128 x 128 fp32, 75 MiB), written by the tree's backup thread,
then read with the page cache dropped before each read: by ``_generic_page_get`` (128-page batches, verified,
copied into the host pool) plus the sidecars through ``HiCacheFile.batch_get_v2``, and by a plain ``readinto`` of
every file (the baseline, in the same run, alternating which goes first).

What it leaves out, and the GPU run has: pinned host memory (each page's temporary is a pinned allocation there),
the scheduler thread holding the GIL beside the prefetch thread, the L3 query and the queueing before the read.

    python bench/restore_path.py [--pages 136] [--repeat 5] [--dir /var/tmp]
    python bench/restore_path.py --smoke    # tiny geometry, one read each: checks the bench runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness.sim.sglang_tree import patched_sglang_tree, tree_info  # noqa: E402

WORKER = Path(__file__).resolve().parent / "file_tier_worker.py"
TARGET = 0.8  # issue 23: restore >= 0.8x of the disk's own read
DEEP = {"layers": 12, "heads": 1, "dim": 256, "mamba_layers": 36, "mamba_heads": 32, "mamba_dim": 128,
        "index_layers": 12, "index_width": 128}  # fmt: skip
SMOKE = {"layers": 1, "heads": 1, "dim": 16, "mamba_layers": 1, "mamba_heads": 1, "mamba_dim": 8,
         "index_layers": 1, "index_width": 16}  # fmt: skip


def measure(directory: str | None, pages: int, repeat: int, geometry: dict) -> dict:
    tree = patched_sglang_tree(patched=True)
    if not tree_info(tree)["patched"]:
        raise SystemExit(f"the series does not apply: {tree_info(tree)['why_unpatched']}")
    with tempfile.TemporaryDirectory(dir=directory, prefix="qhc-restore-") as tmp:
        spec = {"geometry": geometry, "restore": {"pages": pages, "repeat": repeat}}
        r = subprocess.run([sys.executable, str(WORKER), str(tree), tmp, json.dumps(spec)], capture_output=True,
                           text=True, timeout=1800)  # fmt: skip
    if r.returncode:
        raise SystemExit(f"worker failed\n{r.stderr[-3000:]}")
    return next(json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))


def report(out: dict) -> list[str]:
    ratios = [b / a for a, b in zip(out["plain_gbps"], out["prefetch_gbps"], strict=True)]

    def spread(values: list[float]) -> str:
        return "/".join(f"{v:.2f}" for v in (min(values), statistics.median(values), max(values)))

    return [f"one disk hit: {out['files']} files, {out['bytes'] / 1e6:.1f} MB; {len(ratios)} reads each, "
            "GB/s min/median/max",
            f"plain readinto      {spread(out['plain_gbps']):>20}",
            f"prefetch path       {spread(out['prefetch_gbps']):>20}",
            f"ratio (paired)      {spread(ratios):>20}   target >= {TARGET:.2f}x"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=136, help="KV pages of the hit (136: an 8.7k-token prompt)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp)")
    ap.add_argument("--smoke", action="store_true", help="tiny geometry, one read each")
    args = ap.parse_args(argv)
    pages, repeat, geometry = (3, 1, SMOKE) if args.smoke else (args.pages, args.repeat, DEEP)
    out = measure(args.dir, pages, repeat, geometry)
    print("\n".join(report(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
