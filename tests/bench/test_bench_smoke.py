"""Each benchmark in a tiny smoke mode, so none can rot (their figures live in bench/README.md, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_reconcile_benchmark_smoke() -> None:
    argv = [sys.executable, str(REPO / "bench" / "reconcile.py"), "--resources", "3", "--namespaces", "1",
            "--resync", "2", "--timeout", "240"]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "writes / no-op resync (must be 0)" in res.stdout


@pytest.mark.integration
def test_rollouts_benchmark_smoke() -> None:
    argv = [sys.executable, str(REPO / "bench" / "rollouts.py"), "--smoke", "--timeout", "300"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "new resource -> STS, median (s)" in res.stdout


def test_images_benchmark_smoke() -> None:
    argv = [sys.executable, str(REPO / "bench" / "images.py"), "--smoke"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "engine stand-in start -> /ready 200" in res.stdout
