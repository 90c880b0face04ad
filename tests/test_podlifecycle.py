"""The cache-guard init script and the preStop drain/flush hook, run for real (sh, python3, loopback HTTP)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from qwen_hicache import podlifecycle as pl
from qwen_hicache.plan import parse_spec
from qwen_hicache.podlifecycle import GUARD_SCRIPT, MARKER, PRESTOP_SCRIPT, drain_plan
from resources import example, variant


def _guard(root: Path, fp: str, keep: int = 1) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QWEN_HICACHE_CACHE_ROOT": str(root), "QWEN_HICACHE_FINGERPRINT": fp,
           "QWEN_HICACHE_KEEP_OLD": str(keep)}
    return subprocess.run(["sh", "-c", GUARD_SCRIPT], env=env, capture_output=True, text=True, timeout=30)


def test_guard_creates_and_reuses_its_namespace(tmp_path: Path) -> None:
    assert _guard(tmp_path, "v1-aaa").returncode == 0
    assert (tmp_path / "v1-aaa" / MARKER).read_text().strip() == "v1-aaa"
    (tmp_path / "v1-aaa" / "page.bin").write_bytes(b"x")
    assert _guard(tmp_path, "v1-aaa").returncode == 0
    assert (tmp_path / "v1-aaa" / "page.bin").exists()


def test_guard_refuses_a_directory_whose_marker_disagrees(tmp_path: Path) -> None:
    (tmp_path / "v1-aaa").mkdir()
    (tmp_path / "v1-aaa" / MARKER).write_text("v1-other\n")
    result = _guard(tmp_path, "v1-aaa")
    assert result.returncode == 3
    assert "refusing cache directory" in result.stderr and "v1-other" in result.stderr


def test_guard_keeps_the_newest_old_namespaces_only(tmp_path: Path) -> None:
    for i, fp in enumerate(["v1-old1", "v1-old2", "v1-old3"]):
        assert _guard(tmp_path, fp, keep=5).returncode == 0
        os.utime(tmp_path / fp / MARKER, (1000 + i, 1000 + i))
    result = _guard(tmp_path, "v1-new", keep=1)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1-new", "v1-old3"]
    assert _guard(tmp_path, "v1-new", keep=0).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1-new"]


def test_guard_prunes_the_compiled_kernels_of_removed_namespaces_only(tmp_path: Path) -> None:
    for fp in ("v1-old1", "v1-old2"):
        assert _guard(tmp_path, fp, keep=5).returncode == 0
        (tmp_path / ".jit" / fp / "triton").mkdir(parents=True)
    os.utime(tmp_path / "v1-old1" / MARKER, (1000, 1000))
    (tmp_path / ".jit" / "v1-new").mkdir()
    result = _guard(tmp_path, "v1-new", keep=1)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / ".jit").iterdir()) == ["v1-new", "v1-old2"]
    assert "removing compiled kernels of removed namespace v1-old1" in result.stdout


class _Runtime(BaseHTTPRequestHandler):
    running = 2.0
    flushes: list[tuple[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        type(self).running = max(0.0, type(self).running - 1)
        body = f'sglang:num_running_reqs{{model_name="m"}} {type(self).running}\n'.encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        type(self).flushes.append((self.path, self.headers.get("Authorization", "")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_prestop_waits_for_running_requests_then_flushes_with_the_key() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "QWEN_HICACHE_POD_HOST": "127.0.0.1", "QWEN_HICACHE_PORT": str(server.server_port),
           "QWEN_HICACHE_DRAIN_SECONDS": "20", "QWEN_HICACHE_FLUSH_SECONDS": "7",
           "QWEN_HICACHE_ADMIN_API_KEY": "sekret"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", PRESTOP_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    server.shutdown()
    assert out.returncode == 0, out.stderr
    assert _Runtime.flushes == [("/flush_cache?timeout=7", "Bearer sekret")]
    assert _Runtime.running == 0 and time.monotonic() - started >= 1  # it waited for the drain


def test_grace_period_covers_drain_flush_and_shutdown() -> None:
    spec = parse_spec(example()["spec"])
    plan = drain_plan(spec, host_bytes_per_rank=30 * 10**9, write_bytes_per_second=500 << 20)
    assert plan.drain_seconds == spec.runtime.max_request_seconds
    assert plan.flush_seconds == -(-2 * 30 * 10**9 // (500 << 20))
    assert plan.grace_seconds == pl.worst_case_stop_seconds(plan.drain_seconds, plan.flush_seconds) + pl.MARGIN_SECONDS
    assert plan.grace_seconds > plan.drain_seconds + 2 * plan.flush_seconds  # the flush and the SIGTERM drain
    no_disk = drain_plan(parse_spec(variant(**{"spec.hicache.disk": {"enabled": False}})["spec"]), 10**9, 1)
    assert no_disk.flush_seconds == 0


class _FlakyMetrics(_Runtime):
    """`/metrics` fails (503) `failures` times, then reports no running requests."""

    failures = 2
    gets = 0

    def do_GET(self) -> None:  # noqa: N802
        type(self).gets += 1
        if type(self).gets <= type(self).failures:
            self.send_response(503)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'sglang:num_running_reqs{model_name="m"} 0\n')


def _prestop(handler: type, drain: str) -> tuple[subprocess.CompletedProcess[str], float]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "QWEN_HICACHE_POD_HOST": "127.0.0.1", "QWEN_HICACHE_PORT": str(server.server_port),
           "QWEN_HICACHE_DRAIN_SECONDS": drain, "QWEN_HICACHE_FLUSH_SECONDS": "3", "QWEN_HICACHE_ADMIN_API_KEY": "k"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", PRESTOP_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    server.shutdown()
    return out, time.monotonic() - started


def test_prestop_treats_an_unreadable_metrics_endpoint_as_busy() -> None:
    _FlakyMetrics.flushes, _FlakyMetrics.gets, _FlakyMetrics.failures = [], 0, 2
    out, _ = _prestop(_FlakyMetrics, drain="20")
    assert out.returncode == 0, out.stderr
    assert _FlakyMetrics.gets == 3  # two failed reads did not end the wait; the third saw 0 running
    assert out.stdout.count("running requests unknown") == 2
    assert _FlakyMetrics.flushes == [("/flush_cache?timeout=3", "Bearer k")]


def test_prestop_waits_out_the_deadline_when_metrics_never_answer() -> None:
    _FlakyMetrics.flushes, _FlakyMetrics.gets, _FlakyMetrics.failures = [], 0, 10**6
    out, seconds = _prestop(_FlakyMetrics, drain="2")
    assert out.returncode == 0, out.stderr
    assert seconds >= 2 and _FlakyMetrics.gets >= 2
    assert _FlakyMetrics.flushes == [("/flush_cache?timeout=3", "Bearer k")]  # still flushes at the deadline


class _RefusingFlush(_Runtime):
    """No running requests; `/flush_cache` answers 400 (the runtime's refusal) after `delay` seconds."""

    delay = 0.0

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'sglang:num_running_reqs{model_name="m"} 0\n')

    def do_POST(self) -> None:  # noqa: N802
        time.sleep(type(self).delay)
        body = b"Flush cache failed: the storage backup did not finish in time.\n"
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _recorded(tmp_path: Path, handler: type | None, flush: str = "3") -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the preStop with a record path on `tmp_path` (handler None: nothing listens); its record."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler) if handler else None
    if server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_port
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    record = tmp_path / pl.PRESTOP_RECORD
    env = {**os.environ, "QWEN_HICACHE_POD_HOST": "127.0.0.1", "QWEN_HICACHE_PORT": str(port),
           "QWEN_HICACHE_DRAIN_SECONDS": "0", "QWEN_HICACHE_FLUSH_SECONDS": flush, "QWEN_HICACHE_ADMIN_API_KEY": "k",
           "QWEN_HICACHE_PRESTOP_RECORD": str(record), "QWEN_HICACHE_POD_NAME": "srv-1",
           "QWEN_HICACHE_POD_UID": "uid-1"}
    out = subprocess.run([sys.executable, "-c", PRESTOP_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    if server:
        server.shutdown()
    assert not (tmp_path / (pl.PRESTOP_RECORD + ".tmp")).exists()  # replaced atomically, nothing left behind
    return out, json.loads(record.read_text())


def test_prestop_records_a_good_flush_and_exits_0(tmp_path: Path) -> None:
    _Runtime.flushes, _Runtime.running = [], 0.0
    out, rec = _recorded(tmp_path, _Runtime)
    assert out.returncode == 0 and out.stdout.startswith("flush: 200"), out.stdout + out.stderr
    assert {k: rec[k] for k in ("podName", "podUid", "outcome")} == {"podName": "srv-1", "podUid": "uid-1",
                                                                    "outcome": "ok"}
    assert rec["seconds"] >= 0 and abs(rec["time"] - time.time()) < 60


def test_prestop_records_a_refused_flush_and_exits_1_for_the_kubelets_event(tmp_path: Path) -> None:
    _RefusingFlush.delay = 0.0
    out, rec = _recorded(tmp_path, _RefusingFlush)
    assert out.returncode == 1 and rec["outcome"] == "failed"
    assert rec["message"].startswith("flush: 400 Flush cache failed")
    assert "flush failed (failed)" in out.stdout


def test_a_refusal_after_the_flush_budget_is_a_timeout(tmp_path: Path) -> None:
    _RefusingFlush.delay = 1.2
    out, rec = _recorded(tmp_path, _RefusingFlush, flush="1")
    assert out.returncode == 1 and rec["outcome"] == "timeout"


def test_prestop_records_a_runtime_that_does_not_answer(tmp_path: Path) -> None:
    out, rec = _recorded(tmp_path, None)
    assert out.returncode == 1 and rec["outcome"] == "failed" and "refused" in rec["message"].lower()


def test_without_a_disk_tier_a_failed_flush_records_nothing_and_exits_0() -> None:
    _RefusingFlush.delay = 0.0
    out, _ = _prestop(_RefusingFlush, drain="0")
    assert out.returncode == 0 and "flush failed" in out.stdout
