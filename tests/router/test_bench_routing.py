"""The routing benchmark's smoke mode runs end to end (numbers are the benchmark's business, not a test's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.sim.nameshim import unshare_available

BENCH = Path(__file__).resolve().parents[2] / "bench" / "routing.py"


@pytest.mark.skipif(not unshare_available(), reason="needs root and `unshare -m`")
def test_routing_benchmark_smoke() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "router prefix_hash (chosen)" in out.stdout and "chosen / plain Service" in out.stdout
    assert "oracle (perfect affinity)" in out.stdout and "in flight 4: chosen / oracle" in out.stdout
