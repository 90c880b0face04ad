"""SIMULATION ONLY (the node's container runtime): a pod's containers run from their built images with runc.

What a kubelet and its runtime do for a container, played with the real OCI runtime on this machine:

- the image: resolved in the local store (harness.images: built from this checkout's Dockerfiles); a reference
  the store does not hold is ``ErrImagePull``. Its root filesystem is an overlay (a fresh writable layer per
  container start) over the image's, read-only when ``readOnlyRootFilesystem``;
- ``command``/``args`` replace the image's entrypoint/cmd as Kubernetes says; env is the image's, then the
  container's (resolved by the kubelet stand-in); the working directory and user are the image's unless the
  ``securityContext`` says otherwise; ``runAsNonRoot`` refuses a container that would run as uid 0
  (``CreateContainerConfigError``); capabilities are the runtime default set minus ``drop`` (``ALL``: none)
  plus ``add``; ``allowPrivilegeEscalation: false`` sets no_new_privs;
- volumes are bind mounts of the pod's host directories (read-only where the mount says so); an emptyDir with
  ``medium: Memory`` is a tmpfs of ``sizeLimit`` made once per pod (as the kubelet does), so its pages count
  against the pod's memory; ``/etc/hosts`` is the cluster DNS stand-in's file when one is registered;
- the memory limit is a real memory cgroup (v1 or v2, nested under this process's own cgroup): the pod's limit
  and each container's, so a container using more is OOM-killed by the kernel and shows ``OOMKilled``;
- pid, mount, IPC and UTS namespaces of its own (hostname = the pod's); the network is the host's (pods share
  it on loopback pod IPs, harness.sim.podnet), as with ``hostNetwork``;
- exec (probes, preStop hooks) runs inside the running container (``runc exec``).

A reaper process removes every container and mount of this runtime when the process that made them dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.images.store import LocalImage, Store

Obj = dict[str, Any]
# The capabilities container runtimes grant by default (containerd's and CRI-O's set).
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
                "CAP_KILL", "CAP_AUDIT_WRITE")  # fmt: skip
PODNET = Path(__file__).resolve().parent / "podnet"
PODNET_MOUNT = "/run/qwen-hicache-sim/podnet"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(RuntimeError):
    """The container's image cannot be had here (the pod shows ErrImagePull)."""


class ConfigError(RuntimeError):
    """The container cannot be created as specified (the pod shows CreateContainerConfigError)."""


# -- images ------------------------------------------------------------------------------------------
class Images:
    """Image references -> images in the local store; ``mirrors`` serve the placeholder references of the examples."""

    def __init__(self, store: Store, mirrors: dict[str, LocalImage] | None = None) -> None:
        self.store, self.mirrors = store, dict(mirrors or {})
        self._found: dict[str, LocalImage] = {}
        self._roots: dict[str, Path] = {}
        self._lock = threading.Lock()  # pods boot in parallel threads

    def resolve(self, ref: str) -> LocalImage:
        with self._lock:
            return self._resolve(ref)

    def _resolve(self, ref: str) -> LocalImage:
        if ref in self._found:
            return self._found[ref]
        image = self.mirrors.get(ref)
        for name in ([] if image else _candidates(ref)):
            if (image := self.store.lookup(name)) is not None:
                break
        if image is None:
            raise ImageError(f'image "{ref}" is not in the node\'s image store ({self.store.storage}): build it '
                             "(`make images`) or name a built one (`localhost/<name>:<tag>` or by digest)")
        self._found[ref] = image
        return image

    def rootfs(self, image: LocalImage) -> Path:
        with self._lock:
            if image.id not in self._roots:
                self._roots[image.id] = self.store.mount(image)
            return self._roots[image.id]


def _candidates(ref: str) -> list[str]:
    """A qualified reference as given; a short name also as ``localhost/<name>`` (where local builds live)."""
    first = ref.split("/", 1)[0]
    qualified = "/" in ref and ("." in first or ":" in first or first == "localhost")
    return [ref] if qualified else [f"localhost/{ref}", ref]


# -- cgroups -----------------------------------------------------------------------------------------
class Cgroups:
    """Memory cgroups below this process's own: ``<group>/<pod>/<container>``, limits written by us."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.base, self.version, self.why_not = _memory_cgroup()

    @property
    def enforced(self) -> bool:
        return self.base is not None

    def path(self, *parts: str) -> Path | None:
        return None if self.base is None else self.base.joinpath(self.group, *parts)

    def make(self, parts: tuple[str, ...], limit: int | None) -> None:
        path = self.path(*parts)
        if path is None:
            return
        path.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            with contextlib.suppress(OSError):
                (path.parent / "cgroup.subtree_control").write_text("+memory")
        if limit:
            (path / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")).write_text(str(limit))

    def oom_kills(self, parts: tuple[str, ...]) -> int:
        """A counter that grows when the kernel OOM-kills in this cgroup: v2's hierarchical ``oom_kill`` event; v1
        counts OOM kills only in the victim's own (runc's, removed on exit) cgroup, so there it is the
        ``memory.failcnt`` (charges refused at a limit) of this group and of each enclosing one below ours (the
        pod's: a charge is refused at whichever limit it reaches first), read together with a SIGKILL exit."""
        path = self.path(*parts)
        try:
            if path is None:
                return 0
            if self.version == 1:
                groups = [self.path(*parts[:n]) for n in range(len(parts), 0, -1)]
                return sum(int((g / "memory.failcnt").read_text()) for g in groups if g is not None)
            text = (path / "memory.events").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def runc_path(self, *parts: str) -> str:
        """runc's cgroupsPath (relative: below runc's own cgroup, which is ours)."""
        return "/".join((self.group, *parts, "c"))

    def remove(self, *parts: str) -> None:
        """The directories runc and we made for ``parts``, in every hierarchy, deepest first (best effort)."""
        for hierarchy in _own_cgroups():
            node = hierarchy.joinpath(self.group, *parts)
            if not node.is_dir():
                continue
            for dirpath, _, _ in os.walk(node, topdown=False):  # runc may be removing its leaf meanwhile
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _own_cgroups() -> list[Path]:
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            out.append(Path("/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup")
                       / rel.lstrip("/"))  # fmt: skip
        else:
            name = controllers.split(",")[0].removeprefix("name=")
            out.append(Path("/sys/fs/cgroup") / name / rel.lstrip("/"))
    return [p for p in out if p.is_dir()]


def _memory_cgroup() -> tuple[Path | None, int, str]:
    """(this process's memory cgroup directory, cgroup version, why not when None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            path = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
            if os.access(path, os.W_OK):
                return path, 1, ""
            return None, 1, f"{path} (cgroup v1 memory) is not writable by this process"
    root = Path("/sys/fs/cgroup")
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            path = root / line[3:].lstrip("/")
            if "memory" in (root / "cgroup.controllers").read_text().split() and os.access(path, os.W_OK):
                return path, 2, ""
    return None, 0, "no writable memory cgroup (v1 controller or v2 with memory) for this process"


# -- containers --------------------------------------------------------------------------------------
@dataclass
class Mount:
    source: str
    destination: str
    readonly: bool = False


@dataclass
class ContainerPlan:
    """What runc is given for one container start (built by ``plan``; pure)."""

    args: list[str]
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    caps: list[str]
    no_new_privs: bool
    readonly_root: bool
    mounts: list[Mount]
    memory_limit: int | None


def plan(container: Obj, image: LocalImage, env: dict[str, str], mounts: list[Mount],
         memory_limit: int | None) -> ContainerPlan:  # fmt: skip
    """The OCI process for a Kubernetes container on ``image``: command/args over entrypoint/cmd, env, user, caps."""
    config = image.config
    entrypoint, cmd = list(config.get("Entrypoint") or []), list(config.get("Cmd") or [])
    command, args = container.get("command"), container.get("args")
    argv = (command + (args or [])) if command else entrypoint + (args if args is not None else cmd)
    if not argv:
        raise ConfigError(f"container {container['name']}: no command, and image {image.ref} has none")
    image_env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    sc = container.get("securityContext") or {}
    uid, gid = _user(sc, config.get("User") or "", container["name"], image.ref)
    caps = [c for c in DEFAULT_CAPS if not _dropped(c, sc)]
    caps += [f"CAP_{c.upper().removeprefix('CAP_')}" for c in ((sc.get("capabilities") or {}).get("add") or [])]
    return ContainerPlan(
        args=argv, env={"PATH": DEFAULT_PATH, **image_env, **env}, cwd=container.get("workingDir")
        or config.get("WorkingDir") or "/", uid=uid, gid=gid, caps=sorted(set(caps)),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False, readonly_root=bool(sc.get("readOnlyRootFilesystem")),
        mounts=mounts, memory_limit=memory_limit,
    )  # fmt: skip


def _dropped(cap: str, sc: Obj) -> bool:
    drop = {c.upper().removeprefix("CAP_") for c in ((sc.get("capabilities") or {}).get("drop") or [])}
    return "ALL" in drop or cap.removeprefix("CAP_") in drop


def _user(sc: Obj, image_user: str, name: str, ref: str) -> tuple[int, int]:
    """(uid, gid): runAsUser/runAsGroup over the image's USER; runAsNonRoot refuses uid 0 or a user name."""
    user, _, group = image_user.partition(":")
    if sc.get("runAsUser") is not None:
        user = str(sc["runAsUser"])
    if sc.get("runAsGroup") is not None:
        group = str(sc["runAsGroup"])
    if user and not user.isdigit():
        if sc.get("runAsNonRoot"):
            raise ConfigError(f'container has runAsNonRoot and image has non-numeric user ({user}), cannot verify '
                              f'user is non-root (pod: container "{name}", image {ref})')  # fmt: skip
        raise ConfigError(f"container {name}: image user {user!r} is not numeric (the stand-in reads no /etc/passwd)")
    uid = int(user or 0)
    if sc.get("runAsNonRoot") and uid == 0:
        raise ConfigError(f'container has runAsNonRoot and image will run as root (container "{name}", image {ref})')
    return uid, int(group) if group.isdigit() else (uid if user else 0)


def oci_config(p: ContainerPlan, rootfs: Path, hostname: str, cgroups_path: str) -> Obj:
    """The runtime-spec config.json for ``p`` (host network; own pid, mount, IPC, UTS namespaces)."""
    caps = list(p.caps)
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755",
                                                                              "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf", "options": ["rbind", "ro"]},
    ]  # fmt: skip
    if not any(m.destination == "/dev/shm" for m in p.mounts):
        mounts.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                       "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]})  # fmt: skip
    for m in p.mounts:
        mounts.append({"destination": m.destination, "type": "bind", "source": m.source,
                       "options": ["rbind", "ro" if m.readonly else "rw"]})  # fmt: skip
    linux: Obj = {
        "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
        "cgroupsPath": cgroups_path,
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    }
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False, "user": {"uid": p.uid, "gid": p.gid}, "args": p.args,
            "env": [f"{k}={v}" for k, v in p.env.items()], "cwd": p.cwd, "noNewPrivileges": p.no_new_privs,
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        },
        "root": {"path": str(rootfs), "readonly": p.readonly_root},
        "hostname": hostname[:63],
        "mounts": mounts,
        "linux": linux,
    }  # fmt: skip


class Runtime:
    """runc with this harness's own state directory, containers and mounts, and a reaper for both."""

    def __init__(self, root: Path, group: str) -> None:
        if shutil.which("runc") is None:
            raise ImageError("runc is not installed: `make images` (python -m harness.images tools) installs it")
        self.root = root  # runc state (--root)
        self.cgroups = Cgroups(group)
        self.root.mkdir(parents=True, exist_ok=True)
        self._reaper: subprocess.Popen | None = None

    def runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.root), *args]

    def start_reaper(self, mounts_under: Path) -> None:
        """A watcher that kills and deletes every container and unmounts every mount here once we are gone."""
        script = _REAPER.format(pid=os.getpid(), runc=json.dumps(self.runc()), under=json.dumps(str(mounts_under)))
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self._reaper = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, **quiet)

    def bundle(self, bundle: Path, image_root: Path, config: Obj) -> None:
        """Make the container's bundle: a fresh overlay (upper layer) over the image's root filesystem."""
        for d in ("upper", "work", "rootfs"):
            (bundle / d).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={image_root},upperdir={bundle / 'upper'},workdir={bundle / 'work'}",
                        str(bundle / "rootfs")], check=True, capture_output=True)  # fmt: skip
        for m in config["mounts"]:  # bind targets must exist in the image's tree (runc creates dirs, not files)
            if m["type"] == "bind" and Path(m["source"]).is_file():
                target = bundle / "rootfs" / m["destination"].lstrip("/")
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.touch()
        (bundle / "config.json").write_text(json.dumps(config))

    def release(self, bundle: Path) -> None:
        subprocess.run(["umount", "-l", str(bundle / "rootfs")], capture_output=True)
        shutil.rmtree(bundle / "upper", ignore_errors=True)
        shutil.rmtree(bundle / "work", ignore_errors=True)

    def kill(self, cid: str, sig: int) -> None:
        subprocess.run(self.runc("kill", cid, str(int(sig))), capture_output=True)

    def delete(self, cid: str) -> None:
        subprocess.run(self.runc("delete", "--force", cid), capture_output=True)

    def exec_argv(self, cid: str, argv: list[str], env: dict[str, str], p: ContainerPlan) -> list[str]:
        flags = [f"--env={k}={v}" for k, v in env.items()]
        caps = [f"--cap={c}" for c in p.caps]
        return self.runc("exec", "--user", f"{p.uid}:{p.gid}", *flags, *caps, "--cwd", p.cwd,
                         *(["--no-new-privs"] if p.no_new_privs else []), cid, *argv)  # fmt: skip

    def stop(self) -> None:
        for cid in self.list():
            self.kill(cid, signal.SIGKILL)
            self.delete(cid)
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait()
        self.cgroups.remove()  # this runtime's group in every hierarchy, and runc's state directory
        shutil.rmtree(self.root, ignore_errors=True)

    def list(self) -> list[str]:
        proc = subprocess.run(self.runc("list", "--format", "json"), capture_output=True, text=True)
        return [c["id"] for c in json.loads(proc.stdout or "null") or []] if proc.returncode == 0 else []


def tmpfs(path: Path, size: int | None) -> None:
    """An emptyDir with ``medium: Memory``: a tmpfs of ``sizeLimit`` (the kubelet mounts it once per pod)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = "mode=1777" + (f",size={size}" if size else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True, capture_output=True)


def unmount_under(root: Path) -> None:
    """Every mount at or below ``root``, deepest first (pod teardown)."""
    prefix = str(root.resolve())
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


_REAPER = """
import json, os, subprocess, time
owner, runc, under = {pid}, {runc}, {under}
while os.path.exists(f"/proc/{{owner}}"):
    time.sleep(1)
out = subprocess.run(runc + ["list", "--format", "json"], capture_output=True, text=True).stdout
for c in json.loads(out or "null") or []:
    subprocess.run(runc + ["kill", c["id"], "9"], capture_output=True)
    subprocess.run(runc + ["delete", "--force", c["id"]], capture_output=True)
points = [l.split()[1] for l in open("/proc/self/mounts").read().splitlines()]
for p in sorted((p for p in points if p.startswith(under)), key=len, reverse=True):
    subprocess.run(["umount", "-l", p], capture_output=True)
"""
