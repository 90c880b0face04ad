"""Build (once per machine) the real Kubernetes control plane and etcd, cached outside the repository.

`go/go.mod` requires `k8s.io/kubernetes` v1.36.3 (its staging modules pinned by `replace`) and etcd's server
at the version Kubernetes pins; `go build` fetches the modules from the Go module proxy (verified against the
committed go.sum) and compiles kube-apiserver, kube-controller-manager, kube-scheduler and etcd. The binaries
land in `~/.cache/qwen-hicache/kube/bin-<hash of go/ and the build flags>/`, each checked by its own
`--version` before use. A file lock makes concurrent callers (pytest workers, a demo) share one build.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "go"
KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "3.6.8"
CACHE_ENV = "QWEN_HICACHE_CACHE"
BUILD_TIMEOUT_S = 60 * 60
HEARTBEAT_S = 30.0
_V = "k8s.io/component-base/version"
LDFLAGS = (
    f"-s -w -X {_V}.gitVersion={KUBERNETES_VERSION} -X {_V}.gitMajor=1 -X {_V}.gitMinor=36 "
    f"-X {_V}.gitTreeState=clean"
)
PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "etcd": "./etcd",
}
EXPECTED_VERSION = {name: f"Kubernetes {KUBERNETES_VERSION}" for name in PACKAGES} | {
    "etcd": f"etcd Version: {ETCD_VERSION}"
}

Log = Callable[[str], None]


class DevClusterError(RuntimeError):
    """The local Kubernetes control plane could not be built, fetched or started."""


class BuildError(DevClusterError):
    """The Go build failed; the message names the step and the log file."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the four control-plane programs of one build."""

    apiserver: Path
    controller_manager: Path
    scheduler: Path
    etcd: Path


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir`, else `$QWEN_HICACHE_CACHE`, else ~/.cache/qwen-hicache (never the repo)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen-hicache"


def default_cache_dir(cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / "kube"


def source_hash() -> str:
    """Short digest of the build inputs (go.mod, go.sum, Go sources, flags); names the binaries' directory."""
    h = hashlib.sha256(LDFLAGS.encode())
    for path in sorted(p for p in GO_DIR.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(GO_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def binaries(cache_dir: Path | str | None = None) -> Binaries:
    d = default_cache_dir(cache_dir) / f"bin-{source_hash()}"
    return Binaries(d / "kube-apiserver", d / "kube-controller-manager", d / "kube-scheduler", d / "etcd")


def _ready(bins: Binaries) -> bool:
    return all(os.access(p, os.X_OK) for p in vars(bins).values()) and (bins.etcd.parent / ".verified").exists()


@contextlib.contextmanager
def file_lock(path: Path, log: Log, what: str) -> Iterator[None]:
    """Exclusive flock on `path`; says so when it has to wait for another process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"devcluster: waiting for another process to finish {what} (lock {path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_built(cache_dir: Path | str | None = None, log: Log = print) -> Binaries:
    """The cached binaries, building them first if needed (about 6 minutes cold on 2 cores).

    Raises BuildError (with the log path and its tail) if the build or a version check fails: never skips.
    """
    bins = binaries(cache_dir)
    if _ready(bins):
        return bins
    with file_lock(default_cache_dir(cache_dir) / "build.lock", log, "building the Kubernetes control plane"):
        if not _ready(bins):
            _build(bins, log)
    return bins


def _build(bins: Binaries, log: Log) -> None:
    if shutil.which("go") is None:
        raise BuildError("building the Kubernetes control plane needs Go (>= 1.26) on PATH; none was found")
    out = bins.etcd.parent
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log_path = out.with_name(f"build-{source_hash()}.log")
    log(
        f"devcluster: building Kubernetes {KUBERNETES_VERSION} (kube-apiserver, kube-controller-manager, "
        f"kube-scheduler) and etcd {ETCD_VERSION} from the Go module proxy; about 6 minutes the first time on "
        f"2 cores. Log: {log_path}"
    )
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local"}
    cmd = ["go", "build", "-C", str(GO_DIR), "-trimpath", "-ldflags", LDFLAGS, "-o", str(staging) + "/",
           *PACKAGES.values()]  # fmt: skip
    rc = _run_logged(cmd, env, log_path, log)
    if rc != 0:
        raise BuildError(
            f"building the Kubernetes control plane failed (go build exit status {rc}); "
            f"full log: {log_path}\n--- last lines ---\n{tail(log_path)}"
        )
    _verify(staging, log_path)
    (staging / ".verified").write_text(f"{KUBERNETES_VERSION} etcd {ETCD_VERSION}\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    log(f"devcluster: built {out} in {time.monotonic() - started:.0f}s")


def _verify(bin_dir: Path, log_path: Path) -> None:
    """Each program must report the pinned version, or the build is refused."""
    for name, expected in EXPECTED_VERSION.items():
        res = subprocess.run([str(bin_dir / name), "--version"], capture_output=True, text=True, timeout=60)
        if expected not in res.stdout:
            raise BuildError(f"{name} --version printed {res.stdout.strip()!r}, expected {expected!r} ({log_path})")


def _run_logged(cmd: list[str], env: dict[str, str], log_path: Path, log: Log) -> int:
    """Run `cmd` in its own process group, copying its output to `log_path` and printing a progress line
    every HEARTBEAT_S; the whole group is killed on timeout or interruption."""
    started = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _pump(proc, out, log, started)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _pump(proc: subprocess.Popen[bytes], out: BinaryIO, log: Log, started: float) -> None:
    assert proc.stdout is not None
    fd, downloads, last = proc.stdout.fileno(), 0, started
    while time.monotonic() - started < BUILD_TIMEOUT_S:
        ready = select.select([fd], [], [], HEARTBEAT_S)[0]
        if time.monotonic() - last >= HEARTBEAT_S:
            last = time.monotonic()
            log(f"devcluster: ... still building ({last - started:.0f}s so far, {downloads} modules downloaded)")
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        out.write(chunk)
        out.flush()
        downloads += chunk.count(b"go: downloading ")
    out.write(f"\n[devcluster] build killed after {BUILD_TIMEOUT_S}s\n".encode())


def tail(path: Path, lines: int = 30) -> str:
    """Last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
