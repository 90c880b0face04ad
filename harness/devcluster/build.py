"""Build (once per machine) the local API server and cache it outside the repository.

The binary is keyed by a hash of build.sh, main.go and sid-packages.txt, so editing any of them
rebuilds; a file lock makes concurrent callers (pytest workers, a demo) share one build.
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
from pathlib import Path
from typing import BinaryIO

HERE = Path(__file__).resolve().parent
SOURCES = ("build.sh", "main.go", "sid-packages.txt")
CACHE_ENV = "QWEN_HICACHE_CACHE"
BUILD_TIMEOUT_S = 30 * 60
HEARTBEAT_S = 30.0

Log = Callable[[str], None]


class DevClusterError(RuntimeError):
    """The local Kubernetes API server could not be built, fetched or started."""


class BuildError(DevClusterError):
    """build.sh failed; the message names the step and the log file."""


def default_cache_dir(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir`, else `$QWEN_HICACHE_CACHE`, else ~/.cache/qwen-hicache/kube (never the repo)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen-hicache" / "kube"


def source_hash() -> str:
    """Short digest of the build inputs; part of the cached binary's name."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def apiserver_path(cache_dir: Path | str | None = None) -> Path:
    return default_cache_dir(cache_dir) / "bin" / f"mini-apiserver-{source_hash()}"


def etcd_path(cache_dir: Path | str | None = None) -> Path:
    return default_cache_dir(cache_dir) / "venv" / "bin" / "etcd"


def _ready(cache: Path) -> bool:
    return all(os.access(p, os.X_OK) for p in (apiserver_path(cache), etcd_path(cache)))


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


def ensure_built(cache_dir: Path | str | None = None, log: Log = print) -> Path:
    """Return the cached mini-apiserver binary, building it first if needed (2-5 min cold).

    Raises BuildError (with the log path and its tail) if the build fails: never skips silently.
    """
    cache = default_cache_dir(cache_dir)
    if _ready(cache):
        return apiserver_path(cache)
    with file_lock(cache / "build.lock", log, "building the local Kubernetes API server"):
        if not _ready(cache):
            _build(cache, log)
    return apiserver_path(cache)


def _build(cache: Path, log: Log) -> None:
    digest = source_hash()
    src = cache / f"src-{digest}"
    src.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:  # build exactly what was hashed, even if the checkout changes meanwhile
        shutil.copyfile(HERE / name, src / name)
    log_path = cache / f"build-{digest}.log"
    log(
        "devcluster: building the local Kubernetes API server (Go + Debian sid sources); "
        f"takes about 2-5 minutes the first time on 2 cores. Log: {log_path}"
    )
    started = time.monotonic()
    rc = _run_logged(["bash", str(src / "build.sh")], {**os.environ, "K": str(cache)}, log_path, log)
    if rc != 0:
        raise BuildError(
            f"building the local Kubernetes API server failed (build.sh exit status {rc}); "
            f"full log: {log_path}\n--- last lines ---\n{tail(log_path)}"
        )
    os.replace(cache / "bin" / "mini-apiserver", apiserver_path(cache))
    for old in (cache / "bin").glob("mini-apiserver-*"):
        if old != apiserver_path(cache):
            old.unlink(missing_ok=True)
    shutil.rmtree(src, ignore_errors=True)
    log(f"devcluster: built {apiserver_path(cache)} in {time.monotonic() - started:.0f}s")


def _run_logged(cmd: list[str], env: dict[str, str], log_path: Path, log: Log) -> int:
    """Run `cmd` in its own process group, copying its output to `log_path` and relaying
    '==> ' step lines plus a heartbeat; the whole group is killed on timeout or interruption."""
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
    fd, pending = proc.stdout.fileno(), b""
    while time.monotonic() - started < BUILD_TIMEOUT_S:
        if not select.select([fd], [], [], HEARTBEAT_S)[0]:
            log(f"devcluster: ... still building ({time.monotonic() - started:.0f}s so far)")
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        out.write(chunk)
        out.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"==> "):
                log(f"devcluster: {line[4:].decode(errors='replace')}")
    out.write(f"\n[devcluster] build killed after {BUILD_TIMEOUT_S}s\n".encode())


def tail(path: Path, lines: int = 30) -> str:
    """Last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
