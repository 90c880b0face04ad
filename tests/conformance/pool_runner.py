"""Run `pool_probe.py` (the runtime's own pool constructors, in a fresh interpreter) over a list of cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parent / "pool_probe.py"


def run_pool_probe(tree: Path, work: Path, payload: list[dict], timeout: float) -> dict[str, dict]:
    """Each case's report by name; a failed probe fails the test with its stderr tail."""
    (work / "cases.json").write_text(json.dumps(payload))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(tree), str(work / "cases.json"), str(work / "out.json")],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["name"]: r for r in json.loads((work / "out.json").read_text())}
