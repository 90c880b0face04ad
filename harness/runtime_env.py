"""The heavy runtime-side test dependencies (torch and the few packages sglang's CPU code imports), once per machine.

PyPI's Linux torch is the CUDA build (about 5 GB installed); reinstalling it into every fresh clone's .venv
would cost minutes. It goes instead into ``~/.cache/qwen-hicache/runtime-env-<hash of
runtime_patches/requirements-test.txt>`` and a ``.pth`` file puts that directory's site-packages behind the
project venv's own (so the venv's versions win where both have a package).

    python -m harness.runtime_env   # what `make setup` runs
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from harness.devcluster.build import file_lock

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "runtime_patches" / "requirements-test.txt"
PTH_NAME = "qwen-hicache-runtime-env.pth"


def cache_root() -> Path:
    env = os.environ.get("QWEN_HICACHE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen-hicache"


def env_dir() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache_root() / f"runtime-env-{digest}"


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def ensure(log=print) -> Path:
    """Create the cached environment if needed (a few minutes, once) and link it into this interpreter's venv."""
    venv = env_dir()
    done = venv / ".complete"
    if not done.exists():
        with file_lock(cache_root() / "runtime-env.lock", log, "installing the runtime test environment"):
            if not done.exists():
                _install(venv, log)
    site = _site_packages(venv)
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    if not pth.exists() or pth.read_text().strip() != str(site):
        pth.write_text(f"{site}\n")
    return site


def _install(venv: Path, log) -> None:
    log(f"runtime-env: installing {REQUIREMENTS.name} (torch {_pin('torch')}) into {venv}; a few minutes, once")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    cmd = [*pip, "-r", str(REQUIREMENTS)]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"runtime-env: pip install -r {REQUIREMENTS} failed (see above)")
    (venv / ".complete").write_text(REQUIREMENTS.read_text())
    log(f"runtime-env: ready in {time.monotonic() - started:.0f}s")


def _pin(name: str) -> str:
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1]
    return "?"


if __name__ == "__main__":
    print(f"runtime-env: {ensure()}")
