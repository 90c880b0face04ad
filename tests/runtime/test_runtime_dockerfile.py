"""Dockerfile.hicache: the build's verify/compile steps, run here in place of docker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import MANIFEST, PATCHES, REPO

DOCKERFILE = (REPO / "Dockerfile.hicache").read_text()


def test_dockerfile_pins_and_fails_closed():
    assert re.search(r"^ARG BASE_IMAGE$", DOCKERFILE, re.M)
    assert "*@sha256:*" in DOCKERFILE  # tag-only base images are refused
    assert "--require-hashes" in DOCKERFILE and "--only-binary=:all:" in DOCKERFILE
    assert "verify.py --tree" in DOCKERFILE and "--apply" in DOCKERFILE
    assert f"ARG SERIES_VERSION={MANIFEST['series_version']}" in DOCKERFILE
    assert 'ENTRYPOINT ["python3", "-m", "sglang.launch_server"]' in DOCKERFILE


def test_build_steps_on_the_pinned_files(tree_copy: Path):
    """Locate the package like the Dockerfile does, verify+apply, then byte-compile."""
    env = {**os.environ, "PYTHONPATH": str(tree_copy)}
    find = re.search(r"python3 -c '([^']+)'", DOCKERFILE).group(1)
    site = subprocess.run([sys.executable, "-c", find], env=env, capture_output=True, text=True, check=True)
    assert Path(site.stdout.strip()) == tree_copy
    proc = subprocess.run(
        [sys.executable, str(PATCHES / "verify.py"), "--tree", site.stdout.strip(), "--apply"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["series_version"] == MANIFEST["series_version"]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree_copy / "sglang/srt/mem_cache")], check=True)
