"""Restore-path benchmark: one deep-model disk hit read by the runtime's own prefetch-path code vs a plain read.

The GPU run (bench/gpu_engine.md, 2026-12-05 17:38) restored at 0.33-0.51 GB/s where the volume read 1.0 GB/s. This
bench asks how much of that gap the storage code itself makes, on CPU, with the patched tree (the pinned
``sglang==0.5.23`` wheel + ``runtime_patches``, built once per machine by harness.sim.sglang_tree) in its own
interpreter (bench/file_tier_worker.py, ``restore``): one request's disk hit as Flash-Next's geometry makes it
(``--pages`` KV pages of 12 full-attention layers x 256-wide K and V (768 KiB), their QSA index sidecars, the
Mamba state of the last page: 36 layers x 32 heads x 128 x 128 fp32, 75 MiB), written by the tree's backup thread,
then read with the page cache dropped before each read: by ``_generic_page_get`` (128-page batches, verified)
plus the sidecars through ``HiCacheFile.batch_get_v2``, read straight into the host pools (patch 0012); the same
with ``SGLANG_HICACHE_FILE_DIRECT_READ=0`` (each page read into a staging page, then copied into the pool, as series
qhc.11 read); and by a plain ``readinto`` of every file (the baseline), in the same run, rotating which goes first.

What it leaves out, and the GPU run has: pinned host memory, the L3 query and the queueing before the read, and
(unless ``--scheduler``) the scheduler thread beside the prefetch thread. With ``--scheduler PASS_MS`` the prefetch
path is also read beside a thread running a waiting scheduler's loop: PASS_MS of Python (a stand-in for the rest of
a pass) then the tree's own ``Scheduler.on_idle`` with a prefetch in flight, once with the parent's ``sleep(0)``
(``SGLANG_HICACHE_PREFETCH_POLL_INTERVAL=0``) and once with patch 0010's poll interval.

    python bench/restore_path.py [--pages 136] [--repeat 5] [--dir /var/tmp] [--scheduler [PASS_MS]]
    python bench/restore_path.py --smoke    # tiny geometry, one read each (with the loop): checks the bench runs
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
READS = {"prefetch_gbps": "prefetch path",
         "prefetch_staging_gbps": "  staging read (0012 off, as qhc.11)",
         "beside_sleep0_gbps": "  beside the idle loop, sleep(0)",
         "beside_poll_gbps": "  beside the idle loop, poll (0010)"}  # fmt: skip
SMOKE = {"layers": 1, "heads": 1, "dim": 16, "mamba_layers": 1, "mamba_heads": 1, "mamba_dim": 8,
         "index_layers": 1, "index_width": 16}  # fmt: skip


def measure(directory: str | None, pages: int, repeat: int, geometry: dict, scheduler_pass_ms: float | None) -> dict:
    tree = patched_sglang_tree(patched=True)
    if not tree_info(tree)["patched"]:
        raise SystemExit(f"the series does not apply: {tree_info(tree)['why_unpatched']}")
    with tempfile.TemporaryDirectory(dir=directory, prefix="qhc-restore-") as tmp:
        spec = {"geometry": geometry,
                "restore": {"pages": pages, "repeat": repeat, "scheduler_pass_ms": scheduler_pass_ms}}  # fmt: skip
        r = subprocess.run([sys.executable, str(WORKER), str(tree), tmp, json.dumps(spec)], capture_output=True,
                           text=True, timeout=1800)  # fmt: skip
    if r.returncode:
        raise SystemExit(f"worker failed\n{r.stderr[-3000:]}")
    return next(json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))


def report(out: dict) -> list[str]:
    def spread(values: list[float]) -> str:
        return "/".join(f"{v:.2f}" for v in (min(values), statistics.median(values), max(values)))

    lines = [f"one disk hit: {out['files']} files, {out['bytes'] / 1e6:.1f} MB; {len(out['plain_gbps'])} reads each, "
             "GB/s min/median/max; ratio: paired with the plain read of the same round",
             f"{'':36} {'GB/s':>17} {'ratio':>17}",
             f"{'plain readinto':36} {spread(out['plain_gbps']):>17}"]  # fmt: skip
    for key, label in READS.items():
        if key in out:
            ratios = [b / a for a, b in zip(out["plain_gbps"], out[key], strict=True)]
            lines.append(f"{label:36} {spread(out[key]):>17} {spread(ratios):>17}")
    return lines + [f"target: the prefetch path >= {TARGET:.2f}x"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=136, help="KV pages of the hit (136: an 8.7k-token prompt)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp)")
    ap.add_argument("--scheduler", type=float, nargs="?", const=0.5, default=None, metavar="PASS_MS",
                    help="also read beside a waiting scheduler's loop (PASS_MS of Python, then the tree's own "
                         "on_idle), with sleep(0) and with patch 0010's poll interval")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="tiny geometry, one read each")
    args = ap.parse_args(argv)
    pages, repeat, geometry = (3, 1, SMOKE) if args.smoke else (args.pages, args.repeat, DEEP)
    out = measure(args.dir, pages, repeat, geometry, 0.5 if args.smoke else args.scheduler)
    print("\n".join(report(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
