"""The in-pod scripts are package files (`qwen_hicache/pod_scripts`): shipped, loaded, and in step with the
constants the operator renders beside them (ports, marker and file names)."""

from __future__ import annotations

import ast
import subprocess
from importlib import resources

import pytest
from qwen_hicache import diskusage, podlifecycle, render_lws
from qwen_hicache.constants import pod_script

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
