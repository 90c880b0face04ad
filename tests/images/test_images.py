"""harness.images: a missing tool and a build that fails its verification are clear errors, and nothing half-built is
tagged as good (the real buildah, the real Dockerfile.hicache, a doctored patch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.images import build, tools
from harness.images.build import REPO, Builder, BuildError, key_of

pytestmark = pytest.mark.tools


def test_a_missing_tool_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.shutil, "which", lambda name: None if name == "runc" else f"/usr/bin/{name}")
    monkeypatch.setattr(tools.os, "geteuid", lambda: 1000)  # not root: no apt-get
    with pytest.raises(tools.ToolError, match=r"missing container tools: runc; install them with: apt-get install -y"):
        tools.ensure(tools.RUN_TOOLS)


def test_a_patch_that_fails_verification_fails_the_build_and_tags_nothing(tmp_path: Path) -> None:
    """Dockerfile.hicache's tree target on a checkout whose first patch lost a byte: verify.py refuses it."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    shutil.copy(REPO / "Dockerfile.hicache", repo)
    shutil.copy(REPO / ".dockerignore", repo)
    shutil.copytree(REPO / "runtime_patches", repo / "runtime_patches", ignore=shutil.ignore_patterns("__pycache__"))
    patch = sorted((repo / "runtime_patches" / "patches").glob("*.patch"))[0]
    patch.write_bytes(patch.read_bytes()[:-2] + b"\n")
    builder = Builder(repo=repo, log=lambda _: None)
    base = builder.ensure("base")
    spec = build.IMAGES["runtime-tree"]
    key = key_of(spec, base.id, repo)
    with pytest.raises(BuildError, match=r"runtime_patches verify FAILED: patch .* sha256 changed"):
        builder.ensure("runtime-tree")
    for name in (f"localhost/{spec.repository}:{key}", f"localhost/{spec.repository}:candidate-{key}"):
        assert builder.store.lookup(name) is None, f"{name} was tagged after a failed build"
