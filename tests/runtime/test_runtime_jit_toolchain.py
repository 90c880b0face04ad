"""The runtime image's CUDA toolchain builds the runtime's own HiCache transfer kernels.

Where sglang's JIT kernels build, the host pool moves pages with them (`MHATokenToKVPoolHost.can_use_jit`): 49.5 GB/s
on an H200 against 11 GB/s for sgl_kernel's fallback (bench/gpu_engine.md). They build with `$CUDA_HOME/bin/nvcc` and
link `-L$CUDA_HOME/lib64 -lcudart`. The image has no CUDA toolkit, only the lock's nvidia-* wheels, whose layout has
no lib64/libcudart.so: images/runtime/cuda-home.sh makes a CUDA_HOME of them (Dockerfile.hicache's runtime stage).
Here the lock's toolchain wheels (hash-checked) are installed as pip installs them, and the patched tree's own JIT
loader builds both HiCache modules (register and TMA) for sm_90a, no GPU needed; without the script the link fails.

flashinfer (in the lock) is sglang's default sampling backend wherever it imports (`_sampling_backend_default`): the
first request with top-k, top-p or min-p builds its sampling module in the scheduler, and a failed build ends the
server. Its bundled CCCL refuses an nvcc whose version differs from the CUDA_HOME's runtime headers (torch's
nvidia-cuda-runtime 13.0.96): with the 13.5 nvcc the lock once resolved, that build stopped at `#error "CUDA compiler
and CUDA toolkit headers are incompatible"` (measured here, 2026-12-07), so requirements.in pins the 13.0 toolchain.
Where flashinfer imports, sgl_kernel's gemma_rmsnorm goes through flashinfer's norm module, which a server builds at
start (the MTP draft's CUDA-graph capture); its norm.cu includes cublasLt.h (trtllm/common/cudaUtils.h), which only the
lock's nvidia-cublas wheel gives: without it that build stopped the server on an H100 (2026-12-07). The site here takes
only that wheel's headers (nvidia/cu13/include, 6 files; the wheel is 423 MB), where the image's install puts them.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import PATCHES, REPO

from harness.sim.sglang_tree import wheel_cache

TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime", "nvidia-nvvm",
             "nvidia-curand")  # curand: its headers, which flashinfer's sampling kernels include
FLASHINFER = ("flashinfer-python", "nvidia-ml-py", "ninja")  # the module, what its import needs, its build tool
HEADERS = ("nvidia-cublas",)  # only its nvidia/cu13/include members: cublasLt.h, which flashinfer's norm.cu includes
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64")
SCRIPT = REPO / "images" / "runtime" / "cuda-home.sh"
PREBUILD = REPO / "tests" / "gpu" / "flashinfer_prebuild.py"
BUILD = """
import sglang.kernels.jit.utils.arch as arch
from sglang.kernels.ops.kvcache import hicache
try:
    arch._init_jit_cuda_arch_once()  # no GPU here: the target is set below, as the H200 would give it
except Exception:
    pass
arch._CUDA_ARCH = arch.make_jit_cuda_arch(9, 0)
hicache._jit_hicache_module(element_size=256, unroll=4, block_quota=hicache.DEFAULT_BLOCK_QUOTA)
hicache._jit_hicache_tma_module(block_quota=hicache.TMA_BLOCK_QUOTA)
print("built")
"""


def _pins() -> dict[str, tuple[str, set[str]]]:
    """Each toolchain wheel's version and hashes, as runtime_patches/requirements.lock pins them."""
    lock = (PATCHES / "requirements.lock").read_text()
    out = {}
    for name in (*TOOLCHAIN, *FLASHINFER, *HEADERS):
        m = re.search(rf"^{re.escape(name)}==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{{64}}(?: \\)?\n)+)", lock, re.M)
        assert m, f"{name} is not pinned in the lock"
        out[name] = (m.group(1), set(re.findall(r"sha256:([0-9a-f]{64})", m.group(2))))
    return out


def _wheel(cache: Path, name: str, version: str, hashes: set[str]) -> Path:
    """The lock's wheel of `name`, downloaded once into the wheel cache, hash-checked."""
    found = [w for w in cache.glob(f"{name.replace('-', '_')}-{version}-*.whl")]
    if not found:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", *platforms, "-d", str(cache), f"{name}=={version}"],
                       check=True, capture_output=True)  # fmt: skip
        found = [w for w in cache.glob(f"{name.replace('-', '_')}-{version}-*.whl")]
    with open(found[0], "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() in hashes, f"{found[0].name}: not the lock's hash"
    return found[0]


@pytest.fixture(scope="session")
def toolchain_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lock's toolchain and flashinfer wheels installed together as pip does (the nvidia-* wheels share one
    nvidia/cu13 tree), and nvidia-cublas's headers where its wheel puts them (its 600 MB of libraries left out)."""
    cache = wheel_cache() / "jit-toolchain"
    cache.mkdir(parents=True, exist_ok=True)
    pins = _pins()
    wheels = [str(_wheel(cache, name, *pins[name])) for name in (*TOOLCHAIN, *FLASHINFER)]
    site = tmp_path_factory.mktemp("toolchain") / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *wheels], check=True, capture_output=True)  # fmt: skip
    for name in HEADERS:
        with zipfile.ZipFile(_wheel(cache, name, *pins[name])) as zf:
            headers = [m for m in zf.namelist() if m.startswith("nvidia/cu13/include/")]
            assert "nvidia/cu13/include/cublasLt.h" in headers, headers
            zf.extractall(site, headers)
    return site


def _build(tree: Path, cuda_home: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_HOME": str(cuda_home), "HOME": str(home), "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=900)


def _cuda_home(site: Path, tmp_path: Path) -> Path:
    cuda = tmp_path / "cuda"
    subprocess.run(["sh", str(SCRIPT), str(site), str(cuda)], check=True, capture_output=True)
    return cuda


def test_the_images_cuda_home_builds_the_runtimes_hicache_kernels(
        patched_tree: Path, toolchain_site: Path, tmp_path: Path) -> None:  # fmt: skip
    r = _build(patched_tree, _cuda_home(toolchain_site, tmp_path), tmp_path / "home")
    assert r.returncode == 0 and "built" in r.stdout, (r.stdout + r.stderr)[-3000:]
    built = sorted(p.name for p in (tmp_path / "home" / ".cache" / "sglang" / "jit" / "sm90a").rglob("*.so"))
    assert built == ["sgl_kernel_jit_hicache_256_4_2_1024.so", "sgl_kernel_jit_hicache_tma_32768_6_4_4.so"], built


def test_the_wheels_alone_are_no_cuda_home(patched_tree: Path, toolchain_site: Path, tmp_path: Path) -> None:
    """Control: CUDA_HOME at the wheels' own directory compiles but cannot link (what the H200 run met first)."""
    r = _build(patched_tree, toolchain_site / "nvidia" / "cu13", tmp_path / "home")
    assert r.returncode != 0 and "cannot find -lcudart" in r.stderr, (r.stdout + r.stderr)[-3000:]


def test_the_images_cuda_home_builds_flashinfers_sampling_and_norm_kernels(
        toolchain_site: Path, tmp_path: Path) -> None:  # fmt: skip
    """flashinfer's own JIT loader builds its sampling and norm modules for sm_90a (flashinfer takes the target from
    the GPU), through tests/gpu/flashinfer_prebuild.py, the script that builds the GPU lease's modules the same way.
    The norm build reads cublasLt.h from $CUDA_HOME/include (without nvidia-cublas's headers it stops at `fatal error:
    cublasLt.h: No such file or directory`, as on the H100); about 40 s on 2 cores.
    The link asks for -lcuda in $CUDA_HOME/lib64/stubs or on the library path: on a GPU node the NVIDIA container
    toolkit injects the driver's libcuda.so; here an empty library of that name stands in, for the link only."""
    cuda = _cuda_home(toolchain_site, tmp_path)
    stubs = cuda / "lib64" / "stubs"
    stubs.mkdir()
    stub = ["cc", "-shared", "-x", "c", "/dev/null", "-o", str(stubs / "libcuda.so"), "-Wl,-soname,libcuda.so.1"]
    subprocess.run(stub, check=True, capture_output=True)
    home = tmp_path / "home"
    env = {**os.environ, "CUDA_HOME": str(cuda), "FLASHINFER_WORKSPACE_BASE": str(home), "MAX_JOBS": "2",
           "PYTHONPATH": str(toolchain_site),
           "PATH": os.pathsep.join([str(toolchain_site / "bin"), os.environ["PATH"]])}  # fmt: skip
    build = [sys.executable, str(PREBUILD), "--arch", "9.0a", "--only", "sampling", "--only", "norm",
             "--out", str(tmp_path / "r.json")]  # fmt: skip
    r = subprocess.run(build, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    built = sorted(p.name for p in home.rglob("*.so"))
    assert built == ["norm.so", "sampling.so"], built
