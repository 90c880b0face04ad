"""The per-machine image store: containers-storage under ~/.cache/qwen-hicache/containers, driven by buildah.

Every build and every container of the kubelet stand-in uses this one store, so an image built once is
run by every test session on the machine. ``Store`` wraps the few buildah calls needed: build, tag,
untag, inspect, and a read-only mount of an image's root filesystem.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("QWEN_HICACHE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qwen-hicache"


@dataclass(frozen=True)
class LocalImage:
    """A built image: its name in the store, its id and its manifest digest (``repo@digest`` pulls exactly it)."""

    ref: str
    id: str
    digest: str
    config: dict

    @property
    def pinned(self) -> str:
        """``repository@sha256:...``: the reference by digest (what ImagePinned wants)."""
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


class StoreError(RuntimeError):
    """A buildah call failed."""


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or cache_root() / "containers")
        self.storage = self.root / "storage"
        run = Path("/run") if os.access("/run", os.W_OK) else self.root
        self.runroot = run / f"qwen-hicache-containers-{_digest(str(self.storage))[:8]}"
        self.logs = self.root / "logs"

    @property
    def flags(self) -> list[str]:
        return ["--root", str(self.storage), "--runroot", str(self.runroot), "--storage-driver", "overlay"]

    def buildah(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        cmd = ["buildah", *self.flags, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if check and proc.returncode != 0:
            raise StoreError(f"`buildah {' '.join(args[:3])} ...` failed ({proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[-1500:]}")  # fmt: skip
        return proc

    def lookup(self, ref: str) -> LocalImage | None:
        """The stored image named ``ref`` (a name:tag, name@digest or id), or None."""
        proc = self.buildah("inspect", "--type", "image", ref, check=False)
        if proc.returncode != 0:
            return None
        info = json.loads(proc.stdout)
        oci = info.get("OCIv1") or {}
        return LocalImage(ref, info["FromImageID"], info["FromImageDigest"], oci.get("config") or {})

    def tag(self, ref: str, *names: str) -> None:
        self.buildah("tag", ref, *names)

    def untag(self, name: str) -> None:
        self.buildah("rmi", name, check=False)

    def size(self, ref: str) -> str:
        """buildah's own figure for the image (e.g. "220 MB")."""
        return json.loads(self.buildah("images", "--json", ref).stdout)[0]["size"]

    def mount(self, image: LocalImage) -> Path:
        """The image's root filesystem, mounted read-only through a working container kept per image id."""
        name = f"qhc-root-{image.id[:16]}"
        if self.buildah("inspect", "--type", "container", name, check=False).returncode != 0:
            made = self.buildah("from", "--pull-never", "--name", name, image.id, check=False)
            if made.returncode != 0 and "already in use" not in made.stderr:  # another process made it first
                raise StoreError(f"`buildah from {image.id[:12]}` failed: {made.stderr.strip()[-800:]}")
        return Path(self.buildah("mount", name).stdout.strip())


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
