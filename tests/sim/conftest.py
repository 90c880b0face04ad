"""Fixtures for the simulation harness (harness.sim): engine stand-ins on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.sim.cluster import IpPool
from harness.sim.sglang_tree import TREE_ENV, patched_sglang_tree

ADMIN_KEY = "s3cret"
BASE_ARGS = ["--served-model-name", "Qwen/sim-test", "--page-size", "64", "--tp-size", "2",
             "--enable-hierarchical-cache", "--hicache-storage-backend", "file", "--enable-metrics",
             "--enable-cache-report", "--hicache-storage-prefetch-policy", "wait_complete",
             "--admin-api-key", ADMIN_KEY, "--model-path", "/models/ignored", "--unknown-flag", "x"]  # fmt: skip


class Engine:
    """One engine stand-in process and a tiny HTTP client for it."""

    def __init__(self, ip: str, cache_dir: Path, extra: list[str], env: dict[str, str]) -> None:
        self.ip, self.url = ip, f"http://{ip}:30000"
        full_env = {**os.environ, "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(cache_dir), **env}
        argv = [sys.executable, "-m", "harness.sim.engine", *BASE_ARGS, "--host", ip, "--port", "30000", *extra]
        self.proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def call(self, method: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.url + path, data=data if method == "POST" else None, method=method)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout: float = 60, path: str = "/ready") -> Engine:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read().decode() if self.proc.stdout else ""
            try:
                if self.call("GET", path)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.url} not ready")

    def generate(self, text: str) -> dict:
        status, body = self.call("POST", "/generate", {"text": text, "sampling_params": {"max_new_tokens": 8}})
        assert status == 200, body
        return json.loads(body)["meta_info"]

    def flush(self, key: str | None = ADMIN_KEY) -> tuple[int, str]:
        return self.call("POST", "/flush_cache?timeout=30", key=key)

    def info(self) -> dict:
        return json.loads(self.call("GET", "/sim/info")[1])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()


@pytest.fixture(scope="session")
def sglang_tree() -> Path:
    return patched_sglang_tree()


@pytest.fixture
def start_engine(sglang_tree: Path) -> Iterator[Callable[..., Engine]]:
    """Start engines on fresh loopback IPs (or `ip`, from `start.take_ip()`), waiting until `wait` answers 200 (None:
    not at all); every one still running is stopped afterwards."""
    pool, engines = IpPool(), []

    def start(cache_dir: Path, *extra: str, wait: str | None = "/ready", ip: str | None = None, **env: str) -> Engine:
        engine = Engine(ip or pool.take(30000), cache_dir, list(extra), {TREE_ENV: str(sglang_tree), **env})
        engines.append(engine)
        return engine if wait is None else engine.wait_ready(path=wait)

    start.take_ip = lambda: pool.take(30000)  # type: ignore[attr-defined] - an address to name before starting

    yield start
    for engine in engines:
        if engine.proc.poll() is None:
            engine.proc.kill()
            engine.proc.wait()
