"""The operator as its own process (`qwen-hicache run --standalone`), for tests that SIGKILL or restart it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class OperatorProcess:
    """The operator as its own process (`qwen-hicache run --standalone`), so a test can SIGKILL it."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None, repo: Path = REPO) -> None:
        """`repo`: the checkout whose operator runs (a benchmark's baseline runs another commit's)."""
        self.kubeconfig, self.log, self.env, self.repo = kubeconfig, log, env or {}, repo
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> subprocess.Popen[bytes]:
        """Start it (the real CLI entry point, logging to `log`); works from a checkout that is not installed."""
        path = os.pathsep.join(filter(None, [str(self.repo / "operator"), str(self.repo),
                                             os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
               **self.env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "qwen_hicache.cli", "run", "--standalone"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.repo)
        return self.proc

    def kill(self) -> None:
        """SIGKILL: no cleanup, no final status write."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self.kills += 1

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
