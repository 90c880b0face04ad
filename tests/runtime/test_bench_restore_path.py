"""bench/restore_path.py runs (tiny smoke mode), so its figures stay reproducible; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_restore_path_bench_smoke(wheel: Path, tmp_path: Path):
    proc = subprocess.run([sys.executable, str(REPO / "bench/restore_path.py"), "--smoke", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("one disk hit: 7 files"), proc.stdout  # 3 KV pages, 3 index sidecars, 1 Mamba state
    rows = [ln.strip().split("  ")[0] for ln in lines[2:-1]]
    assert rows == ["plain readinto", "prefetch path", "staging read (0012 off, as qhc.11)",
                    "beside the idle loop, sleep(0)", "beside the idle loop, poll (0010)"], proc.stdout  # fmt: skip
