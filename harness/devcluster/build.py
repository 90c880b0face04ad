"""Build (once per machine) the real Kubernetes control plane and etcd, cached outside the repository.

`go/go.mod` requires `k8s.io/kubernetes` v1.36.3 (its staging modules pinned by `replace`) and etcd's server
at the version Kubernetes pins; `go build` fetches the modules from the Go module proxy (verified against the
committed go.sum) and compiles kube-apiserver, kube-controller-manager, kube-scheduler and etcd. The binaries
land in `~/.cache/qwen-hicache/kube/bin-<hash of go/ and the build flags>/`, each checked by its own
`--version` before use. A file lock makes concurrent callers (pytest workers, a demo) share one build.

The LeaderWorkerSet controller (`sigs.k8s.io/lws` v0.9.0) is built the same way from a module of its own,
`go-lws/` (requiring it in `go/` would upgrade the control plane's dependencies), into
`~/.cache/qwen-hicache/kube/lws-<hash>/`: the `lws-manager` binary plus the files of the same module version
the harness installs with it (`config/crd/bases`, the webhook manifests and their kustomize patches, the
manager's ClusterRole).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "go"
LWS_GO_DIR = HERE / "go-lws"
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

LWS_MODULE, LWS_VERSION = "sigs.k8s.io/lws", "v0.9.0"
LWS_LDFLAGS = f"-s -w -X {LWS_MODULE}/pkg/version.GitVersion={LWS_VERSION}"
# What the harness installs next to the controller, copied from the module at the built version.
LWS_CONFIG_FILES = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
    "config/webhook/manifests.yaml",
    "config/webhook/mutating-patch.yaml",
    "config/webhook/validating-patch.yaml",
    "config/rbac/role.yaml",
)

Log = Callable[[str], None]
T = TypeVar("T")


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


@dataclass(frozen=True)
class LwsBuild:
    """The LeaderWorkerSet controller of one build, with the module's LWS_CONFIG_FILES beside it."""

    root: Path

    @property
    def manager(self) -> Path:
        return self.root / "lws-manager"

    def file(self, relative: str) -> Path:
        """`relative` is one of LWS_CONFIG_FILES (a path inside the module)."""
        return self.root / relative


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir`, else `$QWEN_HICACHE_CACHE`, else ~/.cache/qwen-hicache (never the repo)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen-hicache"


def default_cache_dir(cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / "kube"


def source_hash(go_dir: Path | None = None, ldflags: str = LDFLAGS) -> str:
    """Short digest of the build inputs (go.mod, go.sum, Go sources, flags); names the binaries' directory."""
    go_dir = GO_DIR if go_dir is None else go_dir
    h = hashlib.sha256(ldflags.encode())
    for path in sorted(p for p in go_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(go_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def lws_build(cache_dir: Path | str | None = None) -> LwsBuild:
    d = default_cache_dir(cache_dir) / f"lws-{source_hash(LWS_GO_DIR, LWS_LDFLAGS)}"
    return LwsBuild(d)


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
    return _cached(binaries(cache_dir), _ready, _build, cache_dir, "build.lock",
                   "building the Kubernetes control plane", log)  # fmt: skip


def ensure_lws_built(cache_dir: Path | str | None = None, log: Log = print) -> LwsBuild:
    """The cached LeaderWorkerSet controller, building it first if needed (about 4 minutes cold on 2 cores)."""
    return _cached(lws_build(cache_dir), _lws_ready, _build_lws, cache_dir, "build-lws.lock",
                   "building the LeaderWorkerSet controller", log)  # fmt: skip


def _cached(target: T, ready: Callable[[T], bool], build: Callable[[T, Log], None], cache_dir: Path | str | None,
            lock: str, what: str, log: Log) -> T:  # fmt: skip
    """`target` once `build` made it, under a file lock so concurrent callers (pytest workers, a demo) share one."""
    if ready(target):
        return target
    with file_lock(default_cache_dir(cache_dir) / lock, log, what):
        if not ready(target):
            build(target, log)
    return target


def _lws_ready(lws: LwsBuild) -> bool:
    return os.access(lws.manager, os.X_OK) and (lws.root / ".verified").exists()


def _build(bins: Binaries, log: Log) -> None:
    what = "the Kubernetes control plane"
    with _staged(bins.etcd.parent, what, log) as (staging, log_path):
        log(f"devcluster: building Kubernetes {KUBERNETES_VERSION} (kube-apiserver, kube-controller-manager, "
            f"kube-scheduler) and etcd {ETCD_VERSION} from the Go module proxy; about 6 minutes the first time on "
            f"2 cores. Log: {log_path}")  # fmt: skip
        _go_build(what, [str(GO_DIR), "-ldflags", LDFLAGS, "-o", str(staging) + "/", *PACKAGES.values()],
                  log_path, log)  # fmt: skip
        _verify(staging, log_path)
        (staging / ".verified").write_text(f"{KUBERNETES_VERSION} etcd {ETCD_VERSION}\n")


def _build_lws(lws: LwsBuild, log: Log) -> None:
    what = "the LeaderWorkerSet controller"
    with _staged(lws.root, what, log) as (staging, log_path):
        log(f"devcluster: building {what} {LWS_VERSION} from the Go module proxy; about 4 minutes the first time "
            f"on 2 cores. Log: {log_path}")  # fmt: skip
        manager = LwsBuild(staging).manager
        _go_build(what, [str(LWS_GO_DIR), "-ldflags", LWS_LDFLAGS, "-o", str(manager), f"{LWS_MODULE}/cmd"],
                  log_path, log)  # fmt: skip
        res = subprocess.run([str(manager), "--version"], capture_output=True, text=True, timeout=60)
        if f"Version: {LWS_VERSION}" not in res.stdout:
            raise BuildError(f"lws-manager --version printed {res.stdout.strip()!r}, expected {LWS_VERSION} "
                             f"({log_path})")  # fmt: skip
        module = _module_dir(log_path)
        for relative in LWS_CONFIG_FILES:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(module / relative, staging / relative)
        (staging / ".verified").write_text(f"{LWS_MODULE} {LWS_VERSION}\n")


_GO_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local"}


@contextlib.contextmanager
def _staged(out: Path, what: str, log: Log) -> Iterator[tuple[Path, Path]]:
    """(staging directory, build log) for a build into `out`; `out` is replaced only when the body succeeds."""
    if shutil.which("go") is None:
        raise BuildError(f"building {what} needs Go (>= 1.26) on PATH; none was found")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    yield staging, out.with_name(f"build-{out.name}.log")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    log(f"devcluster: built {out} in {time.monotonic() - started:.0f}s")


def _go_build(what: str, args: list[str], log_path: Path, log: Log) -> None:
    """`go build -C <args...>` with the pinned flags, its output in `log_path`; BuildError on failure."""
    rc = _run_logged(["go", "build", "-C", args[0], "-trimpath", *args[1:]], {**os.environ, **_GO_ENV}, log_path, log)
    if rc != 0:
        raise BuildError(
            f"building {what} failed (go build exit status {rc}); "
            f"full log: {log_path}\n--- last lines ---\n{tail(log_path)}"
        )


def _module_dir(log_path: Path) -> Path:
    """The LWS module's directory in the Go module cache (verified against go-lws/go.sum by `go mod download`)."""
    cmd = ["go", "mod", "download", "-json", f"{LWS_MODULE}@{LWS_VERSION}"]
    env = {**os.environ, **_GO_ENV}
    res = subprocess.run(cmd, cwd=LWS_GO_DIR, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed: {res.stderr.strip() or res.stdout.strip()} ({log_path})")
    return Path(json.loads(res.stdout)["Dir"])


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
