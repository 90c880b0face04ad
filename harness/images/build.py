"""Build the project's images with buildah from the committed Dockerfiles, once per machine per input.

    python -m harness.images build [--full] [NAME...]   # what `make images` / `make test` run

Images (``IMAGES``): ``base`` (Debian bookworm + its Python 3.11, made by mmdebstrap: no registry here),
``operator``, ``router``, ``runtime`` (Dockerfile.hicache in full: the CUDA dependency set, several GB),
``runtime-tree`` (Dockerfile.hicache's ``tree`` target: the hash-checked sglang wheel, the series applied and
verified; what CI builds), and ``runtime-sim`` (TEST ONLY: the engine stand-in as a layer on top of
``runtime-tree``, harness/images/Dockerfile.sim-runtime).

Each image is keyed by a digest of everything that goes into it (its Dockerfile, the files it copies, its
build arguments, its base's image id): ``localhost/<repository>:<key>``. A key already in the store is not
rebuilt. A build is tagged ``candidate-<key>`` first; only after its post-build checks pass inside the built
image does it get its real tag, and a failed build or check leaves nothing tagged as good. The Dockerfiles
are used unchanged: the local base comes in through the build argument each one already has.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.devcluster.build import file_lock

from . import tools
from .store import LocalImage, Store, StoreError

REPO = Path(__file__).resolve().parents[2]
Log = Callable[[str], None]
SITE = "/opt/sglang/lib/python3.11/site-packages"  # Dockerfile.hicache's venv on the images' Python
# The local base: Debian bookworm's own Python 3.11, pip and venv (the published base: python:3.11-slim-bookworm).
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
BASE_SUITE = "bookworm"
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")


class BuildError(RuntimeError):
    """A build step or a post-build check failed; nothing was tagged as good."""


@dataclass(frozen=True)
class ImageSpec:
    name: str
    repository: str
    dockerfile: str = ""
    inputs: tuple[str, ...] = ()  # repository paths whose bytes the image is made of
    base_arg: str = ""  # the build argument that names the base
    base: str = "base"  # the image this one is built on
    target: str | None = None
    args: tuple[tuple[str, str], ...] = ()
    check: Callable[[Store, str], None] | None = field(default=None, compare=False)
    ci: bool = True  # built by `make test`


def _run_in(store: Store, ref: str, argv: list[str], user: str | None = None) -> str:
    """Run ``argv`` inside the image (a throw-away working container, chroot isolation); its output."""
    name = f"qhc-check-{hashlib.sha256(ref.encode()).hexdigest()[:10]}"
    store.buildah("rm", name, check=False)
    store.buildah("from", "--pull-never", "--name", name, ref)
    try:
        flags = ["--isolation", "chroot", *(["--user", user] if user else [])]
        proc = store.buildah("run", *flags, name, "--", *argv, check=False)
        if proc.returncode != 0:
            raise BuildError(f"in {ref}: `{' '.join(argv)[:200]}` exited {proc.returncode}: "
                             f"{(proc.stderr + proc.stdout).strip()[-1500:]}")  # fmt: skip
        return proc.stdout
    finally:
        store.buildah("rm", name, check=False)


def _check_tree(store: Store, ref: str) -> None:
    """The image's sglang tree is the patched result, file for file (verify.py inside the image)."""
    out = _run_in(store, ref, ["python3", "/opt/runtime_patches/verify.py", "--tree", SITE, "--ignore-bytecode"])
    if json.loads(out.strip().splitlines()[-1]).get("state") != "patched":
        raise BuildError(f"{ref}: verify.py does not report the patched tree: {out[-400:]}")


def _check_runtime(store: Store, ref: str) -> None:
    """The full runtime: patched tree, ``launch_server --help`` accepts every flag the operator renders, and the JIT
    kernels' toolchain is there (CUDA_HOME from images/runtime/cuda-home.sh, nvcc runs, a host C++ compiler)."""
    _check_tree(store, ref)
    _run_in(store, ref, ["sh", "-c", '"$CUDA_HOME/bin/nvcc" --version && g++ --version '
                                     '&& test -e "$CUDA_HOME/lib64/libcudart.so"'])  # fmt: skip
    _check_flags(_run_in(store, ref, ["python3", "-m", "sglang.launch_server", "--help"]), "sglang", ref)


def _check_operator(store: Store, ref: str) -> None:
    """The CLI starts as the image's user, who has a name (Kopf's peering id asks getpass.getuser())."""
    _run_in(store, ref, ["python3", "-c", "import getpass, qwen_hicache.cli; print(getpass.getuser())"],
            user="65532:65532")


def _check_router(store: Store, ref: str) -> None:
    _check_flags(_run_in(store, ref, ["smg", "launch", "--help"], user="65532:65532"), "smg", ref)


def _check_flags(help_text: str, container: str, ref: str) -> None:
    words = set(help_text.replace(",", " ").split())
    missing = sorted(f for f in rendered_flags(container) if f not in words)
    if missing:
        raise BuildError(f"{ref}: its --help lacks flags the operator renders for container {container}: {missing}")


def rendered_flags(container: str) -> set[str]:
    """Every ``--flag`` the operator renders (`qwen-hicache render` of the shipped examples) for ``container``."""
    import yaml

    flags: set[str] = set()
    for path in sorted((REPO / "examples").glob("qwenhicache*.yaml")):
        out = subprocess.run([sys.executable, "-m", "qwen_hicache.cli", "render", str(path)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        for doc in filter(None, yaml.safe_load_all(out)):
            for c in (doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []):
                if c["name"] == container:
                    flags |= {a.split("=", 1)[0] for a in c.get("args") or [] if a.startswith("--")}
    if not flags:
        raise BuildError(f"the operator renders no container {container} for examples/: nothing to check")
    return flags


IMAGES: dict[str, ImageSpec] = {s.name: s for s in (
    ImageSpec("base", "qwen-hicache-base", base=""),
    ImageSpec("operator", "qwen-hicache-operator", "images/operator/Dockerfile",
              ("images/operator", "operator/qwen_hicache"), "PYTHON_IMAGE", check=_check_operator),
    ImageSpec("router", "qwen-hicache-router", "images/router/Dockerfile", ("images/router",), "PYTHON_IMAGE",
              check=_check_router),
    ImageSpec("runtime-tree", "sglang-hicache-tree", "Dockerfile.hicache", ("runtime_patches",), "BASE_IMAGE",
              target="tree", check=_check_tree),
    ImageSpec("runtime", "sglang-hicache", "Dockerfile.hicache", ("runtime_patches", "images/runtime"), "BASE_IMAGE",
              target="runtime", check=_check_runtime, ci=False),
    ImageSpec("runtime-sim", "sglang-hicache-sim", "harness/images/Dockerfile.sim-runtime",
              ("harness/__init__.py", "harness/sim"), "RUNTIME_IMAGE", base="runtime-tree"),
)}  # fmt: skip
CI_IMAGES = tuple(n for n, s in IMAGES.items() if s.ci)
FULL_IMAGES = ("base", "operator", "router", "runtime-tree", "runtime")


def _tree_bytes(path: Path, repo: Path) -> bytes:
    if path.is_file():
        return path.read_bytes()
    parts = []
    for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        parts.append(f"{f.relative_to(repo)}\0".encode() + hashlib.sha256(f.read_bytes()).digest())
    return b"".join(parts)


def key_of(spec: ImageSpec, base_id: str, repo: Path = REPO) -> str:
    h = hashlib.sha256(json.dumps([spec.dockerfile, spec.target, spec.args, base_id]).encode())
    if spec.dockerfile:
        h.update((repo / spec.dockerfile).read_bytes())
    for path in spec.inputs:
        h.update(_tree_bytes(repo / path, repo))
    if spec.name == "base":
        h.update(json.dumps([BASE_SUITE, BASE_PACKAGES, DPKG_EXCLUDES]).encode())
    return h.hexdigest()[:16]


class Builder:
    def __init__(self, store: Store | None = None, log: Log = print, repo: Path = REPO) -> None:
        self.store = store or Store()
        self.repo = repo  # the build context (a checkout)
        self.log = log
        self.timings: dict[str, float] = {}  # seconds per image built in this process (0: found in the store)

    def ensure(self, name: str) -> LocalImage:
        """The image, built first if the store does not have this exact key (with its base before it)."""
        spec = IMAGES[name]
        base = self.ensure(spec.base) if spec.base else None
        key = key_of(spec, base.id if base else "", self.repo)
        ref = f"localhost/{spec.repository}:{key}"
        if (found := self.store.lookup(ref)) is not None:
            self.timings.setdefault(name, 0.0)
            return found
        tools.ensure(tools.BUILD_TOOLS if name == "base" else ("buildah",), self.log)
        with file_lock(self.store.root / f"build-{spec.repository}.lock", self.log, f"building {ref}"):
            if (found := self.store.lookup(ref)) is None:
                started = time.monotonic()
                found = self._build(spec, ref, key, base)
                self.timings[name] = time.monotonic() - started
                self.log(f"images: {ref} built in {self.timings[name]:.0f}s")
        return found

    def _build(self, spec: ImageSpec, ref: str, key: str, base: LocalImage | None) -> LocalImage:
        candidate = f"localhost/{spec.repository}:candidate-{key}"
        self.store.untag(candidate)
        log_path = self.store.logs / f"{spec.name}-{key}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log(f"images: building {ref} (log {log_path})")
        try:
            if spec.name == "base":
                self._build_base(candidate, log_path)
            else:
                self._bud(spec, candidate, base, log_path)
            if spec.check is not None:
                spec.check(self.store, candidate)
            self.store.tag(candidate, ref)
        except (BuildError, StoreError, subprocess.SubprocessError, OSError) as exc:
            raise BuildError(f"image {spec.name} ({ref}) failed: {exc}\nlog: {log_path}") from exc
        finally:
            self.store.untag(candidate)
        image = self.store.lookup(ref)
        assert image is not None
        return image

    def _bud(self, spec: ImageSpec, candidate: str, base: LocalImage, log_path: Path) -> None:
        args = [*(("--build-arg", f"{k}={v}") for k, v in spec.args)]
        argv = ["bud", "--isolation", "chroot", "--network", "host", "--layers", "--pull-never", *self._pip_volumes(),
                "-f", str(self.repo / spec.dockerfile), "--build-arg", f"{spec.base_arg}={base.pinned}",
                *[a for pair in args for a in pair], *(["--target", spec.target] if spec.target else []),
                "-t", candidate, str(self.repo)]  # fmt: skip
        self._logged(argv, log_path)

    def _pip_volumes(self) -> list[str]:
        """Build-time only (never in a layer): this machine's pip settings for reaching PyPI, e.g. the CA bundle of
        a TLS-inspecting proxy (PIP_CERT / SSL_CERT_FILE / REQUESTS_CA_BUNDLE) and an index (PIP_INDEX_URL)."""
        lines = []
        volumes: list[str] = []
        names = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
        ca = next((os.environ[k] for k in names if os.environ.get(k)), "")
        if ca and Path(ca).is_file():
            volumes += ["--volume", f"{ca}:/run/qwen-hicache-build/ca.crt:ro"]
            lines.append("cert = /run/qwen-hicache-build/ca.crt")
        if os.environ.get("PIP_INDEX_URL"):
            lines.append(f"index-url = {os.environ['PIP_INDEX_URL']}")
        if not lines:
            return []
        conf = self.store.root / "build-pip.conf"
        conf.write_text("[global]\n" + "\n".join(lines) + "\n")
        return [*volumes, "--volume", f"{conf}:/etc/pip.conf:ro"]

    def _logged(self, argv: list[str], log_path: Path) -> None:
        with open(log_path, "w") as log:
            proc = subprocess.run(["buildah", *self.store.flags, *argv], stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise BuildError(f"`buildah {argv[0]}` exited {proc.returncode}:\n{tail}")

    def _build_base(self, candidate: str, log_path: Path) -> None:
        """Debian bookworm (minbase) with its Python, made by mmdebstrap and imported as a one-layer image."""
        with tempfile.TemporaryDirectory(prefix="qhc-base-", dir=self.store.root) as tmp:
            tar = Path(tmp) / "rootfs.tar"
            excludes = [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
            cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", f"--include={','.join(BASE_PACKAGES)}",
                   *excludes, "--aptopt=Acquire::Retries 3", BASE_SUITE, str(tar)]  # fmt: skip
            with open(log_path, "w") as log:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise BuildError(f"mmdebstrap exited {proc.returncode}:\n{log_path.read_text()[-2000:]}")
            container = self.store.buildah("from", "scratch").stdout.strip()
            try:
                self.store.buildah("add", container, str(tar), "/")
                label = f"io.qwen-hicache.base=debian-{BASE_SUITE}-minbase"
                path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                self.store.buildah("config", "--cmd", "/bin/sh", "--env", path, "--label", label, container)
                self.store.buildah("commit", "-q", container, candidate)
            finally:
                self.store.buildah("rm", container, check=False)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harness.images", description="build the project's images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find cached) images")
    b.add_argument("names", nargs="*", help=f"images (default: the CI set {', '.join(CI_IMAGES)})")
    b.add_argument("--full", action="store_true", help=f"all of: {', '.join(FULL_IMAGES)} (`make images`)")
    sub.add_parser("tools", help="install the container tools (buildah, mmdebstrap, runc)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "tools":
            tools.ensure()
            return 0
        names = args.names or (FULL_IMAGES if args.full else CI_IMAGES)
        tools.ensure()  # runc too: the tests run these images right after (one apt-get, before any test starts)
        builder = Builder()
        for name in names:
            image = builder.ensure(name)
            took = builder.timings.get(name, 0.0)
            size = builder.store.size(image.ref)
            print(f"{name:13} {image.pinned}  {size:>9}  {'cached' if not took else f'built in {took:.0f}s'}")
    except (BuildError, tools.ToolError, StoreError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0
