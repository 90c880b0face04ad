"""Fixtures for the runtime patch series: the pinned wheel, parent and patched trees.

The wheel is fetched by pip from PyPI into a cache outside the repository
(QWEN_HICACHE_WHEEL_CACHE, default ~/.cache/qwen-hicache/wheels) and checked
against the sha256 pinned in runtime_patches/manifest.json before use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.sim.sglang_tree import fetch_wheel

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "runtime_patches"
PROBE = Path(__file__).resolve().parent / "runtime_probe.py"
MANIFEST = json.loads((PATCHES / "manifest.json").read_text())


@pytest.fixture(scope="session")
def wheel() -> Path:
    return fetch_wheel()


@pytest.fixture(scope="session")
def parent_tree(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned parent's sglang/ package, unpacked once; never modified."""
    site = tmp_path_factory.mktemp("parent")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site, [n for n in zf.namelist() if n.startswith("sglang/")])
    return site


@pytest.fixture
def tree_copy(parent_tree: Path, tmp_path: Path) -> Path:
    """A private copy of the parent a test may tamper with."""
    site = tmp_path / "site"
    shutil.copytree(parent_tree, site)
    return site


@pytest.fixture(scope="session")
def patched_tree(parent_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("patched") / "site"
    shutil.copytree(parent_tree, site)
    subprocess.run(
        [sys.executable, str(PATCHES / "verify.py"), "--tree", str(site), "--apply"],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def _probe(tree: Path, work: Path, only: str | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(tree), str(work), *([only] if only else [])],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def run_probe():
    """runtime_probe.py on a tree of the test's choosing (a fixture: test modules never import a conftest)."""
    return _probe


@pytest.fixture(scope="session")
def probes(parent_tree: Path, patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One probe run per tree (separate interpreters): {'patched': ..., 'parent': ...}."""
    return {
        "patched": _probe(patched_tree, tmp_path_factory.mktemp("probe-patched")),
        "parent": _probe(parent_tree, tmp_path_factory.mktemp("probe-parent")),
    }
