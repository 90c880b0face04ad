"""SIMULATION ONLY: the pinned SGLang parent, patched by the project's series, for CPU-side use.

The engine stand-in keeps its disk tier with the real ``HiCacheFile`` class, so a warm restart in
the harness reads back what the runtime would: same file names, same write/read/discard code.
The wheel is fetched by pip (checked against runtime_patches/manifest.json), unpacked once into
~/.cache/qwen-hicache/sglang-trees/ and patched with runtime_patches/verify.py --apply. If the
series does not apply (or the repository's runtime_patches/ is absent) the unpatched parent is
used and ``tree_info()`` says so: the harness then shows the parent's behaviour.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "runtime_patches"
TREE_ENV = "QWEN_HICACHE_SIM_SGLANG_TREE"
INFO_FILE = ".qwen-hicache-tree.json"
# Bundled fallback for an installed (non-checkout) package: the pin as of series 0.5.23-qhc.1.
_FALLBACK_PARENT = {
    "version": "0.5.23",
    "wheel": "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl",
    "wheel_sha256": "8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",
}


def _cache_root(cache_dir: Path | None) -> Path:
    default = Path.home() / ".cache/qwen-hicache"
    return Path(cache_dir) if cache_dir else Path(os.environ.get("QWEN_HICACHE_CACHE", default))


def wheel_cache(cache_dir: Path | None = None) -> Path:
    """Where downloaded wheels are kept per machine ($QWEN_HICACHE_WHEEL_CACHE wins), shared by every fetch."""
    return Path(os.environ.get("QWEN_HICACHE_WHEEL_CACHE", _cache_root(cache_dir) / "wheels"))


def _manifest() -> dict:
    path = PATCHES / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"parent": _FALLBACK_PARENT}


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_wheel(cache_dir: Path | None = None) -> Path:
    """The pinned wheel, downloaded by pip once (shared with tests/runtime's cache) and hash-checked."""
    parent = _manifest()["parent"]
    wheels = wheel_cache(cache_dir)
    wheel = wheels / parent["wheel"]
    if not wheel.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp",
             "--platform", "manylinux_2_34_x86_64", f"sglang=={parent['version']}", "-d", str(wheels)],
            check=True, capture_output=True,
        )  # fmt: skip
    if _sha256(wheel) != parent["wheel_sha256"]:
        raise RuntimeError(f"{wheel} does not match the pinned sha256 {parent['wheel_sha256']}")
    return wheel


def _apply_series(site: Path) -> str | None:
    """Apply the series with the real verifier; the reason it could not, or None."""
    verify = PATCHES / "verify.py"
    if not verify.exists():
        return f"{verify} not found"
    proc = subprocess.run([sys.executable, str(verify), "--tree", str(site), "--apply"], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()[-500:]


def _unpack(wheel: Path, parent: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=parent))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging, [n for n in zf.namelist() if n.startswith("sglang/")])
    return staging


def _build(dest: Path, wheel: Path, patched: bool) -> None:
    staging = _unpack(wheel, dest.parent)
    problem = _apply_series(staging) if patched else "parent requested"
    if problem and patched:
        shutil.rmtree(staging)  # a failed apply may leave a half-patched tree
        staging = _unpack(wheel, dest.parent)
    info = {"patched": problem is None, "series": _manifest().get("series_version"), "why_unpatched": problem}
    (staging / INFO_FILE).write_text(json.dumps(info))
    staging.rename(dest)


def patched_sglang_tree(cache_dir: Path | None = None, patched: bool = True) -> Path:
    """A site directory holding ``sglang/`` (patched unless told or unable), built once per machine."""
    manifest = _manifest()
    trees = _cache_root(cache_dir) / "sglang-trees"
    trees.mkdir(parents=True, exist_ok=True)
    series, version = manifest.get("series_version", "unknown"), manifest["parent"]["version"]
    # The result digest too: a patch edited without a version bump must not reuse a stale tree.
    result = manifest.get("result", {}).get("inventory_sha256", "")[:12]
    key = f"{series}-{result}-patched" if patched else f"{version}-parent"
    dest = trees / key
    with open(trees / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # engines and tests may race to build it
        if not (dest / INFO_FILE).exists():
            _build(dest, fetch_wheel(cache_dir), patched)
    return dest


def tree_info(tree: Path) -> dict:
    """{'patched': bool, 'series': str, 'why_unpatched': str|None} as recorded when the tree was built."""
    return json.loads((Path(tree) / INFO_FILE).read_text())


def import_hicache_storage(tree: Path) -> types.ModuleType:
    """Import ``sglang.srt.mem_cache.hicache_storage`` from ``tree`` without the package __init__s.

    ``sglang/__init__.py`` pulls in transformers and friends (2.5 s, GPU-minded); the storage module
    needs none of it. Empty package modules pointing at the tree's directories let the real
    submodules load unchanged, so the code that runs is the wheel's own.
    """
    root = Path(tree) / "sglang"
    loaded = sys.modules.get("sglang")
    if loaded is not None and Path(getattr(loaded, "__path__", [""])[0]) != root:
        raise RuntimeError(f"another sglang is already imported: {loaded}")
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = module
    from sglang.srt.mem_cache import hicache_storage

    return hicache_storage
