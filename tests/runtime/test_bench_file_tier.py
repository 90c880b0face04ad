"""bench/file_tier.py runs (tiny smoke mode), so its figures stay reproducible; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_file_tier_bench_smoke(wheel: Path, tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/file_tier.py"), "--smoke", "--turns", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {" ".join(line.split()[:-5]) for line in proc.stdout.splitlines()}  # pattern op | 3 spreads, target
    patterns = ("kv chunks", "hybrid", "small", "2 ranks")
    assert {f"{p} {op}" for p in patterns for op in ("write", "read")} <= rows, proc.stdout
    assert "startup s (cap on)" in proc.stdout
    # --turns: a line per run, pattern and op, one parent|patched pair per turn (smoke: 2 read turns a tree)
    assert sum(line.startswith("run 1 small        read") and line.count("|") == 2
               for line in proc.stdout.splitlines()) == 1, proc.stdout  # fmt: skip
    assert "stale .tmp left after startup          2         0" in proc.stdout  # the parent never sweeps


def test_the_trees_take_turns_a_b_b_a():
    sys.path.insert(0, str(REPO / "bench"))
    from file_tier import schedule

    assert schedule(["a", "b"], 4) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (3, "b"), (3, "a")]
    assert schedule(["b", "a"], 1) == [(0, "b"), (0, "a")]
