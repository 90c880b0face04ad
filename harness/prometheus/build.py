"""Prometheus and promtool for the observability tests, built from Go module sources once per machine.

    python -m harness.prometheus.build      # prints the two paths

`go.mod`/`go.sum` here pin `github.com/prometheus/prometheus` (module v0.316.0 = Prometheus 3.16.0);
`go build` fetches the sources through the Go module proxy, checks them against go.sum and compiles
`cmd/prometheus` and `cmd/promtool` into ~/.cache/qwen-hicache/prometheus-<version>/ (several minutes on
two cores the first time; the Go build cache is shared). A file lock keeps parallel test runs from
building twice; the binaries are used only if `--version` names the pinned version. The server is built
without its web UI assets (tests use the HTTP API only).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = "github.com/prometheus/prometheus"
TOOLS = ("prometheus", "promtool")


def pinned() -> tuple[str, str]:
    """(module version, Prometheus version) from go.mod: v0.3MM.P is Prometheus 3.MM.P."""
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)} v0\.(\d)(\d\d)\.(\d+)\s*$", (HERE / "go.mod").read_text(),
                  re.M)
    if not m:
        raise RuntimeError(f"{HERE / 'go.mod'} does not pin {MODULE}")
    major, minor, patch = m.groups()
    return f"v0.{major}{minor}.{patch}", f"{int(major)}.{int(minor)}.{patch}"


def _cache_root() -> Path:
    return Path(os.environ.get("QWEN_HICACHE_CACHE", Path.home() / ".cache/qwen-hicache"))


def _version_ok(binary: Path, version: str) -> bool:
    if not binary.exists():
        return False
    res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    return res.returncode == 0 and f"version {version}" in (res.stdout + res.stderr)


def _build(dest: Path, version: str) -> None:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is needed to build Prometheus and promtool (harness/prometheus/go.mod)")
    staging = dest.with_name(dest.name + ".build")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    ldflags = f"-X github.com/prometheus/common/version.Version={version}"
    cmd = [go, "build", "-mod=readonly", "-trimpath", "-ldflags", ldflags, "-o", str(staging) + "/",
           *(f"{MODULE}/cmd/{t}" for t in TOOLS)]  # fmt: skip
    res = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building Prometheus {version} failed:\n{res.stdout}{res.stderr}"[-4000:])
    for tool in TOOLS:
        if not _version_ok(staging / tool, version):
            raise RuntimeError(f"{staging / tool} does not report version {version}")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)


def ensure() -> dict[str, Path]:
    """{'prometheus': path, 'promtool': path}, built on first use."""
    _, version = pinned()
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"prometheus-{version}"
    with open(root / f"prometheus-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(_version_ok(dest / t, version) for t in TOOLS):
            _build(dest, version)
    return {t: dest / t for t in TOOLS}


if __name__ == "__main__":
    for name, path in ensure().items():
        sys.stdout.write(f"{name} {path}\n")
