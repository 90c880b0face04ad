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


class _FakeRank:
    """A rank that answers every command at once and logs it: the order of a pattern's turns, without a tree."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.last = name, log, None

    def send(self, **command) -> None:
        self.log.append((self.name, command["do"], *command.get("args", [])))
        self.last = command["do"]

    def reply(self) -> dict:
        if self.last == "write":
            return {"pages": 4, "written_pages": 4, "start": 0.0, "end": 1.0, "cpu_s": 0.1, "kv_bytes": 100}
        return {"read_pages": 4, "pages": 4, "same": True, "read_s": 0.5, "kv_bytes": 100}


def test_each_tree_reads_once_unmeasured_after_the_writes_then_the_measured_turns():
    """The first read after a pattern's writes meets the disk's post-write state (bench/README.md): every tree reads
    once before the measured turns, and that turn is kept apart (`warmup_read_s`), not in the read rate."""
    sys.path.insert(0, str(REPO / "bench"))
    from file_tier import WARMUP_READS, measure_pattern

    log: list = []
    got = measure_pattern({"a": [_FakeRank("a", log)], "b": [_FakeRank("b", log)]}, "p", 1, 2, 0.0)
    reads = [e for e in log if e[1] == "read"]
    assert WARMUP_READS == 1
    assert reads == [("a", "read", 0), ("b", "read", 0), ("a", "read", 0), ("b", "read", 0), ("b", "read", 1),
                     ("a", "read", 1)]  # fmt: skip
    assert log.index(("a", "read", 0)) > max(i for i, e in enumerate(log) if e[1] == "write")
    assert got["a"]["turns"]["warmup_read_s"] == [0.5] and got["a"]["turns"]["read_s"] == [0.5, 0.5]
    assert got["a"]["read_Bps"] == 200 / 1.0  # the two measured turns only
