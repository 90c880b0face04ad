"""SIMULATION ONLY: cluster DNS for a process that resolves through the system resolver (the `smg` router).

A hosts file rewritten in place, bind-mounted over /etc/hosts in the process's own mount namespace (`unshare -m`,
as root): `<pod>.<server>-headless.<ns>.svc.cluster.local` -> the pod's current IP. It is strict: a pod that is
stopped has no record (as a deleted pod has none) and a restarted pod gets a new IP, so nothing works unless the
router resolves names. Used by harness/sim/routerlab.py and the GPU engine run (tests/gpu/engine_router.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path


def unshare_available() -> bool:
    """The name shim needs a private mount namespace (root and `unshare`)."""
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def with_hosts(path: Path, argv: list[str]) -> list[str]:
    """`argv` run in its own mount namespace where `path` is /etc/hosts."""
    return ["unshare", "-m", "sh", "-c", f'mount --bind {path} /etc/hosts && exec "$@"', "sh", *argv]


class NameShim:
    """The cluster DNS stand-in: a hosts file rewritten in place (same inode, so the bind mount sees it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = Path("/etc/hosts").read_text()
        self.records: dict[str, str] = {}
        self.lock = threading.Lock()
        self._write()

    def set(self, host: str, ip: str | None) -> None:
        with self.lock:
            if ip is None:
                self.records.pop(host, None)
            else:
                self.records[host] = ip
            self._write()

    def clear(self) -> None:
        """No records: the file is the host's /etc/hosts again."""
        with self.lock:
            self.records.clear()
            self._write()

    def _write(self) -> None:
        text = self.base + "".join(f"{ip} {host}\n" for host, ip in sorted(self.records.items()))
        with open(self.path, "r+" if self.path.exists() else "w") as f:
            f.seek(0)
            f.write(text)
            f.truncate()
