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


def test_the_runtime_image_gives_the_jit_kernels_a_cuda_home(tmp_path: Path):
    """The runtime stage runs images/runtime/cuda-home.sh on the installed site and sets CUDA_HOME to its result;
    the script, on the wheels' layout, gives what sglang's JIT build reads ($CUDA_HOME/bin/nvcc, include, nvvm, and
    lib64/libcudart.so for `-L$CUDA_HOME/lib64 -lcudart`), and refuses a site without the toolchain wheels or without
    curand's headers (flashinfer's sampling kernels include curand.h) or cublasLt.h (its norm module includes it)."""
    runtime = DOCKERFILE[DOCKERFILE.index("FROM tree AS runtime") :]
    assert 'sh /opt/cuda-home.sh "${SITE}" /opt/cuda' in runtime and "ENV CUDA_HOME=/opt/cuda" in runtime
    assert "install -y --no-install-recommends g++" in runtime  # nvcc's host compiler and the JIT module's linker
    script = REPO / "images" / "runtime" / "cuda-home.sh"
    site, dest = tmp_path / "site", tmp_path / "cuda"
    nv = site / "nvidia" / "cu13"
    refused = subprocess.run(["sh", str(script), str(site), str(dest)], capture_output=True, text=True)
    assert refused.returncode == 1 and "bin/nvcc is missing" in refused.stderr
    for f in ("bin/nvcc", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/crt/host_defines.h",
              "include/cccl/cuda/std/version", "lib/libcudart.so.13"):  # fmt: skip
        (nv / f).parent.mkdir(parents=True, exist_ok=True)
        (nv / f).write_text(f)
    refused = subprocess.run(["sh", str(script), str(site), str(dest)], capture_output=True, text=True)
    assert refused.returncode == 1 and "include/curand.h is missing" in refused.stderr  # flashinfer's sampling
    (nv / "include" / "curand.h").write_text("include/curand.h")
    refused = subprocess.run(["sh", str(script), str(site), str(dest)], capture_output=True, text=True)
    assert refused.returncode == 1 and "include/cublasLt.h is missing" in refused.stderr  # flashinfer's norm
    assert "nvidia-cublas" in refused.stderr
    (nv / "include" / "cublasLt.h").write_text("include/cublasLt.h")
    subprocess.run(["sh", str(script), str(site), str(dest)], check=True, capture_output=True)
    assert (dest / "bin" / "nvcc").read_text() == "bin/nvcc"
    assert (dest / "nvvm" / "bin" / "cicc").exists() and (dest / "include" / "cuda_runtime.h").exists()
    assert (dest / "lib64" / "libcudart.so").read_text() == "lib/libcudart.so.13"
