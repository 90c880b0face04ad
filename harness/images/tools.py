"""The container tools the image builds and the kubelet stand-in use, installed from Debian's packages.

- ``buildah`` builds the images from the committed Dockerfiles (``--isolation chroot``: this machine's
  cgroup layout, v1 controllers plus a cgroup2 mount with a controller, makes crun refuse to create a
  container, so builds use no OCI runtime at all);
- ``mmdebstrap`` makes the local base image (Debian bookworm with its Python 3.11) from Debian's packages,
  since no image registry can be reached;
- ``runc`` runs the pods' containers (crun 1.8 refuses the same cgroup layout: "cgroups in hybrid mode not
  supported"; runc supports it).

``ensure()`` installs what is missing with ``apt-get`` when it can (root, apt-get present) and otherwise fails
with the exact package names to install. Nothing here downloads anything but Debian packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable

Log = Callable[[str], None]
# command -> the Debian package that provides it
PACKAGES = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "runc": "runc"}
BUILD_TOOLS = ("buildah", "mmdebstrap")
RUN_TOOLS = ("buildah", "runc")


class ToolError(RuntimeError):
    """A tool the images need is missing and cannot be installed here."""


def missing(tools: Iterable[str]) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def ensure(tools: Iterable[str] = (*BUILD_TOOLS, *RUN_TOOLS), log: Log = print) -> None:
    """Every tool present, installing the missing ones with apt-get (as root); ToolError naming them if not."""
    absent = missing(dict.fromkeys(tools))
    if not absent:
        return
    packages = sorted({PACKAGES[t] for t in absent})
    hint = f"install them with: apt-get install -y {' '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ToolError(f"missing container tools: {', '.join(absent)}; {hint}")
    log(f"images: installing {' '.join(packages)} from Debian's packages (once per machine)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()[-800:]}; {hint}")
    if still := missing(absent):
        raise ToolError(f"apt-get installed {' '.join(packages)} but {', '.join(still)} is still not on PATH")
