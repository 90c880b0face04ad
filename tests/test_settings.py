"""The operator's settings: one object read at start-up; no module reads the environment by being imported."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
from qwen_hicache.handlers import register
from qwen_hicache.settings import Settings, SettingsError

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "qwen_hicache"
ALLOWED_ENV = {
    "settings.py": "the settings themselves",
    "kube.py": "KUBECONFIG, read when the client is made",
    "handlers.py": "KUBERNETES_SERVICE_HOST/_PORT, read at login",
}
"""Modules allowed to read the process environment at all (in a function, never at import)."""


def test_defaults_and_overrides_from_the_environment() -> None:
    assert Settings.load({}) == Settings()
    s = Settings.load({"QWEN_HICACHE_RESYNC_SECONDS": "30", "QWEN_HICACHE_NODE_SIZING_CHECK": "false",
                       "QWEN_HICACHE_WORKERS": "3", "UNRELATED": "x"})
    assert (s.resync_seconds, s.node_sizing_check, s.workers, s.rollout_poll_seconds) == (30.0, False, 3, 2.0)
    assert Settings.load(s.env()) == s  # what an operator subprocess gets


def test_a_bad_value_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="QWEN_HICACHE_ROLLOUT_WORKERS"):
        Settings.load({"QWEN_HICACHE_ROLLOUT_WORKERS": "0"})
    with pytest.raises(SettingsError, match="QWEN_HICACHE_RESYNC_SECONDS"):
        Settings.load({"QWEN_HICACHE_RESYNC_SECONDS": "soon"})


def test_every_setting_is_documented() -> None:
    assert all(field.description for field in Settings.model_fields.values())


def _reads_environment(tree: ast.AST) -> list[tuple[int, bool]]:
    """(line, at module level) of each `os.environ` / `os.getenv` use."""
    out = []
    top = {id(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    nested = {id(c) for f in ast.walk(tree) if id(f) in top for c in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" and \
                node.attr in ("environ", "getenv"):
            out.append((node.lineno, id(node) not in nested))
    return out


def test_no_module_reads_the_environment_on_import() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        uses = _reads_environment(ast.parse(path.read_text()))
        assert not [line for line, at_import in uses if at_import], f"{path.name} reads the environment on import"
        assert not uses or path.name in ALLOWED_ENV, f"{path.name} reads the environment: add it to Settings"


def test_handlers_register_with_the_settings_given_into_the_registry_given() -> None:
    registry = register(Settings(resync_seconds=7), kopf.OperatorRegistry())
    (timer,) = [h for h in registry._spawning.get_all_handlers() if h.id == "resync"]
    assert timer.interval == 7 and timer.initial_delay == 7
    ids = {h.id for h in registry._changing.get_all_handlers()}
    assert {"create_resource", "reconcile_resource", "forget_metrics"} <= ids


def test_importing_every_module_registers_nothing() -> None:
    """In a fresh interpreter: Kopf's own CLI (KopfRunner in other tests) replaces the default registry with the
    one it ran and never restores it, so this process's default registry says nothing about imports."""
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    code = "; ".join([*(f"import qwen_hicache.{m}" for m in modules),
                      "import kopf", "r = kopf.get_default_registry()",
                      "print(len(r._changing.get_all_handlers()) + len(r._spawning.get_all_handlers()))"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), *sys.path])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "0"
