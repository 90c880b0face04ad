"""Run one probe script in its own interpreter (the tree under test imported fresh) and read its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_json(script: str, *args: object, timeout: float = 300) -> dict:
    """`python HERE/script args...`; its stdout as JSON. A failed probe fails the test with its stderr tail."""
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def run_scenario(script: str, tree: Path, work: Path, scenario: str) -> dict:
    """One scenario of a probe that reports each scenario by name (an ``error`` key holds its traceback)."""
    out = run_json(script, tree, work, scenario)[scenario]
    assert "error" not in out, out["error"]
    return out
