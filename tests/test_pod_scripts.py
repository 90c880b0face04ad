"""The in-pod scripts are package files (`qwen_hicache/pod_scripts`): shipped, loaded, and in step with the
constants the operator renders beside them (ports, marker and file names)."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from importlib import resources
from pathlib import Path

import pytest
from qwen_hicache import diskusage, podlifecycle, render_lws
from qwen_hicache.constants import JIT_CACHE_DIR, pod_script
from qwen_hicache.plan import parse_spec
from qwen_hicache.status_model import OUTCOMES
from resources import variant

FILES = ("cache_guard.sh", "worker_sweep.sh", "prestop.py", "disk_usage.py")


@pytest.mark.parametrize("name", FILES)
def test_every_script_is_package_data_the_operator_loads(name: str) -> None:
    path = resources.files("qwen_hicache").joinpath("pod_scripts", name)
    assert path.is_file() and pod_script(name) == path.read_text()


@pytest.mark.parametrize("name", [f for f in FILES if f.endswith(".py")])
def test_the_python_scripts_compile_for_the_runtimes_python(name: str) -> None:
    compile(ast.parse(pod_script(name)), name, "exec")


@pytest.mark.parametrize("name", [f for f in FILES if f.endswith(".sh")])
def test_the_shell_scripts_parse(name: str) -> None:
    assert subprocess.run(["sh", "-n", "-c", pod_script(name)], capture_output=True).returncode == 0


def test_the_scripts_name_the_constants_the_operator_renders_beside_them() -> None:
    assert podlifecycle.GUARD_SCRIPT.count(podlifecycle.MARKER) == 3
    assert render_lws.WORKER_GUARD_SCRIPT == podlifecycle.GUARD_SCRIPT + render_lws.WORKER_SWEEP
    assert f'os.path.join(ns, "{diskusage.CREATED_FILE}")' in diskusage.SCRIPT
    assert f'int(env.get("QWEN_HICACHE_USAGE_PORT") or {diskusage.PORT})' in diskusage.SCRIPT
    assert f'os.path.join(root, "{podlifecycle.PRESTOP_RECORD}")' in diskusage.SCRIPT
    assert f'e.name == "{JIT_CACHE_DIR}"' in diskusage.SCRIPT
    assert podlifecycle.GUARD_SCRIPT.count(f'"$root"/{JIT_CACHE_DIR}/*') == 1
    assert repr(OUTCOMES).replace("'", "\"") in diskusage.SCRIPT


def _usage_of(tmp_path: Path, env: dict[str, str]) -> diskusage.DiskUsage:
    """Run the sidecar on loopback over `tmp_path` and parse its first /metrics answer; it is stopped after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {"PATH": os.environ["PATH"], "QWEN_HICACHE_CACHE_ROOT": str(tmp_path), "QWEN_HICACHE_FINGERPRINT": "fp",
            "QWEN_HICACHE_USAGE_HOST": "127.0.0.1", "QWEN_HICACHE_USAGE_PORT": str(port)}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", diskusage.SCRIPT], env={**base, **env})
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return diskusage.parse(r.read().decode())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(10)


def test_the_usage_sidecar_counts_and_caps_only_its_own_ranks(tmp_path: Path) -> None:
    """A node of a multi-node group holds only its own ranks' shards: its cap is its ranks' caps, not the group's."""
    ns = tmp_path / "fp"
    ns.mkdir()
    for rank in range(4):
        (ns / f"k{rank}_model_{rank}_4.bin").write_bytes(b"x" * 1000 * (rank + 1))
    caps = {"QWEN_HICACHE_TP_SIZE": "4", "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1000000"}
    whole = _usage_of(tmp_path, caps)
    assert (whole.used_bytes, whole.page_files, whole.cap_bytes) == (10000, 4, 4000000)
    node1 = _usage_of(tmp_path, {**caps, "QWEN_HICACHE_RANKS_PER_POD": "2", "QWEN_HICACHE_NODE_RANK": "1"})
    assert (node1.used_bytes, node1.page_files, node1.cap_bytes) == (7000, 2, 2000000)


def test_the_usage_sidecar_keeps_compiled_kernels_out_of_old_namespaces(tmp_path: Path) -> None:
    (tmp_path / "fp").mkdir()
    (tmp_path / "v1-old").mkdir()
    (tmp_path / "v1-old" / "a_0_1.bin").write_bytes(b"x" * 5000)
    (tmp_path / ".jit" / "fp" / "triton").mkdir(parents=True)
    (tmp_path / ".jit" / "fp" / "triton" / "k.cubin").write_bytes(b"y" * 9000)
    old = os.lstat(tmp_path / "v1-old" / "a_0_1.bin").st_blocks * 512
    assert _usage_of(tmp_path, {}).old_namespaces_bytes == old


def test_group_pods_tell_the_sidecar_their_node_rank() -> None:
    spec = parse_spec(variant(**{"spec.nodesPerReplica": 2, "spec.runtime.tensorParallelSize": 4})["spec"])
    env = {e["name"]: e for e in render_lws._node_ranks_env(spec)}
    assert env["QWEN_HICACHE_RANKS_PER_POD"]["value"] == "2"
    assert env["QWEN_HICACHE_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        f"metadata.labels['{render_lws.WORKER_INDEX_LABEL}']"


def test_the_usage_sidecar_reports_the_last_prestop_on_its_volume(tmp_path: Path) -> None:
    assert _usage_of(tmp_path, {}).prestop is None  # none yet
    (tmp_path / podlifecycle.PRESTOP_RECORD).write_text(json.dumps({
        "podName": "srv-1", "podUid": "uid-1", "outcome": "timeout", "time": 1767225600.5, "seconds": 41.2,
        "message": 'flush: "timed out"\nat C:\\x'}))
    rec = _usage_of(tmp_path, {}).prestop
    assert rec == diskusage.PreStopRecord("uid-1", "timeout", 'flush: "timed out"\nat C:\\x', "srv-1",
                                          1767225600, 41.2)
    (tmp_path / podlifecycle.PRESTOP_RECORD).write_text('{"podUid": "uid-1", "outcome": "maybe"}')
    assert _usage_of(tmp_path, {}).prestop is None  # not a record the operator can read: none
