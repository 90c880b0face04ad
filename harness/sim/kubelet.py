"""SIMULATION ONLY: what a kubelet does for one pod, played with host processes on loopback.

Init containers and preStop hooks run for real (``sh -c ...`` as the pod spec says) on this host,
with container paths rewritten to the host directories bound to the pod's volumes, env resolved
(values, ``secretKeyRef``, ``configMapKeyRef``, ``$(VAR)``) as Kubernetes does. Which command stands
in for each image is decided in harness.sim.images: the ``sglang`` container runs the engine stand-in
on the pod IP and its ``http`` port; the operator image runs ``qwen-hicache run`` in its own mount
namespace, where the pod's service-account token, CA and namespace files (made through the real
TokenRequest API) are bound at /var/run/secrets/kubernetes.io/serviceaccount, as in a real pod. A
wildcard address (0.0.0.0) in a container's args becomes the pod IP, so nothing listens beyond loopback.
No images, cgroups, users or liveness probes; readiness follows the main container's httpGet probe (none: ready).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.deathsig import die_with_parent

from .images import RUNTIME_CONTAINER, command_for

Obj = dict[str, Any]
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
REPO = Path(__file__).resolve().parents[2]  # the stand-ins' "image": this checkout (harness/ importable)
POD_HOST_ENV = "QWEN_HICACHE_POD_HOST"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` escapes, unknown references stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


class Spawner:
    """Forks every child from one long-lived thread, since PR_SET_PDEATHSIG follows the forking thread.

    Children get SIGKILL when that thread (hence the harness's process) dies, so a crashed test
    leaves no engines behind; each child leads its own process group so hooks' children go too.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="sim-spawner", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._requests.get()) is not None:
            argv, kwargs, future = item
            try:
                future.set_result(subprocess.Popen(die_with_parent(argv), start_new_session=True, **kwargs))
            except Exception as exc:
                future.set_exception(exc)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((argv, kwargs, future))
        return future.result()

    def run(self, argv: list[str], timeout: float, **kwargs: Any) -> tuple[int | None, str]:
        """Run to completion within ``timeout``; (exit code or None when killed, combined output)."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, _ = proc.communicate()
            return None, out

    def close(self) -> None:
        self._requests.put(None)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


@dataclass
class PodRecord:
    """What happened to one pod name across its incarnations (the harness's ``history``)."""

    incarnations: int = 0  # pod objects this harness started
    starts: int = 0  # engine starts, restarts included
    ips: list[str] = field(default_factory=list)
    prestop_runs: int = 0
    prestop_exit_codes: list[int | None] = field(default_factory=list)  # None: killed at the grace limit
    prestop_output: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)  # engine exit codes (negative: signal)
    sigkilled: int = 0  # engines killed after the grace period
    init_failures: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    @property
    def prestop_ran(self) -> bool:
        return self.prestop_runs > 0

    def note(self, msg: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {msg}")


class PathMap:
    """Rewrites container paths (volume mount points) to host directories inside any string."""

    def __init__(self, mounts: list[tuple[str, Path]]) -> None:
        self.mounts = sorted(((m.rstrip("/") or "/", h) for m, h in mounts), key=lambda x: -len(x[0]))
        alternatives = "|".join(re.escape(m) for m, _ in self.mounts) or r"(?!)"
        self._re = re.compile(rf"(?<![\w.-])({alternatives})(?=/|$|[^\w.-])")

    def __call__(self, text: str) -> str:
        hosts = dict(self.mounts)
        return self._re.sub(lambda m: str(hosts[m.group(1)]), text)


class ImageError(RuntimeError):
    """No local stand-in exists for a container's image (the pod shows ErrImagePull)."""


class PodProcesses:
    """One pod's host side: its env, init containers, container processes, preStop and shutdown."""

    def __init__(self, pod: Obj, ip: str, volumes: dict[str, Path], secrets: Any, spawner: Spawner,
                 run_dir: Path, engine_extra: list[str], engine_env: dict[str, str],
                 api_env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.pod, self.ip, self.spawner, self.run_dir = pod, ip, spawner, run_dir
        self.engine_extra, self.engine_env, self.api_env = engine_extra, engine_env, dict(api_env or {})
        self.spec = pod["spec"]
        self.containers: list[Obj] = list(self.spec["containers"])
        self.container = next((c for c in self.containers if c["name"] == RUNTIME_CONTAINER), self.containers[0])
        self.volumes, self.secrets = volumes, secrets
        self.procs: dict[str, subprocess.Popen] = {}
        run_dir.mkdir(parents=True, exist_ok=True)

    @property
    def proc(self) -> subprocess.Popen | None:
        """The main container's process (the runtime's, in a server pod)."""
        return self.procs.get(self.container["name"])

    # -- env and paths -------------------------------------------------------------------------
    def paths(self, container: Obj) -> PathMap:
        mounts = []
        for m in container.get("volumeMounts") or []:
            host = self.volumes.get(m["name"])
            if host is not None:
                mounts.append((m["mountPath"], host / m.get("subPath", "")))
        return PathMap(mounts)

    def _env_value(self, item: Obj, env: dict[str, str]) -> str | None:
        if "value" in item:
            return expand(item["value"] or "", env)
        ref = item.get("valueFrom") or {}
        for kind in ("secretKeyRef", "configMapKeyRef"):
            if kind in ref:
                return self.secrets(kind, self.pod["metadata"]["namespace"], ref[kind])
        if "fieldRef" in ref:
            return _field_ref(self.pod, ref["fieldRef"].get("fieldPath", ""), self.ip)
        return None

    def env(self, container: Obj, map_paths: bool = True) -> dict[str, str]:
        """The container's env as Kubernetes resolves it (container paths mapped to host dirs when asked)."""
        env: dict[str, str] = dict(self.api_env)
        for item in container.get("env") or []:
            value = self._env_value(item, env)
            if value is not None:
                env[item["name"]] = value
        if not map_paths:
            return env
        paths = self.paths(container)
        return {k: paths(v) for k, v in env.items()}

    def _base_env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("SGLANG_", "QWEN_HICACHE_", "KUBECONFIG", "KUBERNETES_"))}  # fmt: skip
        keep["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{keep.get('PATH', '')}"  # python3 = this venv
        keep["HOSTNAME"] = self.pod["metadata"]["name"]
        podnet = str(Path(__file__).resolve().parent / "podnet")  # wildcard binds narrowed to the pod IP
        keep["PYTHONPATH"] = os.pathsep.join(filter(None, [podnet, str(REPO), keep.get("PYTHONPATH")]))
        keep["QWEN_HICACHE_SIM_POD_IP"] = self.ip
        keep["QWEN_HICACHE_SIM_POD_NAMESPACE"] = self.pod["metadata"]["namespace"]  # the DNS search path
        return keep

    def argv(self, container: Obj, env: dict[str, str], map_paths: bool = True) -> list[str]:
        paths = self.paths(container) if map_paths else (lambda a: a)
        words = (container.get("command") or []) + (container.get("args") or [])
        return [paths(expand(a, env)).replace("0.0.0.0", self.ip) for a in words]

    # -- lifecycle -------------------------------------------------------------------------------
    def run_init(self) -> Obj | None:
        """Run init containers in order; the failing one's terminated state, or None when all passed."""
        for c in self.spec.get("initContainers") or []:
            env = self.env(c)
            code, out = self.spawner.run(self.argv(c, env), timeout=300, env={**self._base_env(), **env},
                                         cwd=self.run_dir)  # fmt: skip
            (self.run_dir / f"init-{c['name']}.log").write_text(out)
            if code != 0:
                return {"name": c["name"], "exitCode": -1 if code is None else code, "reason": "Error",
                        "message": out[-1000:]}  # fmt: skip
        return None

    def port(self) -> int:
        return http_port(self.pod)

    def check_images(self) -> None:
        """Raise ImageError for the first container no local command stands in for."""
        for c in self.containers:
            if self._command(c) is None:
                raise ImageError(f'no local stand-in for image "{c.get("image", "")}" (container {c["name"]})')

    def _command(self, c: Obj) -> list[str] | None:
        env = self.env(c, map_paths=c is self.container)
        argv = self.argv(c, env, map_paths=c is self.container)
        args = self.argv({"args": c.get("args")}, env, map_paths=c is self.container)
        return command_for(c, argv, args)

    def start_container(self, name: str) -> None:
        c = next(c for c in self.containers if c["name"] == name)
        log = open(self.run_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        command = self._command(c)
        if command is None:
            raise ImageError(f'no local stand-in for image "{c.get("image", "")}" (container {name})')
        if c is self.container and name == "sglang":
            env = {**self._base_env(), **self.engine_env, **self.env(c)}
            argv = [*command, "--host", self.ip, "--port", str(self.port()), *self.engine_extra]
        else:  # a real program: its own mount namespace with the pod's volumes bound at their paths
            argv, extra = self._in_mount_namespace(c, command)
            env = {**self._base_env(), **self.env(c, map_paths=False), **extra}
        self.procs[name] = self.spawner.popen(argv, env=env, stdout=log, stderr=log, cwd=self.run_dir)
        log.close()

    def start_all(self) -> None:
        for c in self.containers:
            self.start_container(c["name"])

    def _in_mount_namespace(self, container: Obj, command: list[str]) -> tuple[list[str], dict[str, str]]:
        """The command in its own mount namespace with the pod's volumes bound at their paths; and env additions.

        The "image" is this host, so a volume whose mount path holds the image itself (the interpreter or this
        checkout, e.g. an emptyDir at /tmp over a clone under /tmp) cannot be bound there without hiding it: it
        is left unbound and, for /tmp, offered through TMPDIR instead (what programs consult for scratch)."""
        image = [Path(sys.executable).resolve(), Path(sys.prefix).resolve(), REPO]
        binds, env = [], {}
        for m in container.get("volumeMounts") or []:
            if m["name"] not in self.volumes:
                continue
            src, dst = str(self.volumes[m["name"]] / m.get("subPath", "")), m["mountPath"]
            if any(p == Path(dst) or Path(dst) in p.parents for p in image):
                if dst.rstrip("/") == "/tmp":
                    env["TMPDIR"] = src
                continue
            binds.append((src, dst))
        binds.sort(key=lambda b: -len(b[1]))  # deepest first: a later bind (over /tmp, say) hides no source
        script = "".join(f'mkdir -p "{dst}" 2>/dev/null; mount --bind "{src}" "{dst}" || exit 125; '
                         for src, dst in binds)  # fmt: skip
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script + 'exec "$@"', "sh",
                *command]  # fmt: skip
        return argv, env

    def ready(self, timeout: float = 0.5) -> bool:
        """Every container running and passing its own httpGet readiness probe (the path it declares; none: ready)."""
        for c in self.containers:
            proc = self.procs.get(c["name"])
            if proc is None or proc.poll() is not None:
                return False
            probe = (c.get("readinessProbe") or {}).get("httpGet")
            if probe and not self._http_ok(_probe_port(c, probe["port"]), probe.get("path", "/"), timeout):
                return False
        return True

    def _http_ok(self, port: int, path: str, timeout: float) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{port}{path}", timeout=timeout) as r:
                return r.status == 200
        except OSError:
            return False

    def run_prestop(self, grace: float) -> tuple[int | None, str] | None:
        """The container's preStop exec hook on the host, pointed at the pod IP; None when it has none."""
        command = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
        if not command:
            return None
        env = {**self.env(self.container), POD_HOST_ENV: self.ip}
        argv = [self.paths(self.container)(expand(a, env)) for a in command]
        return self.spawner.run(argv, timeout=grace, env={**self._base_env(), **env}, cwd=self.run_dir)

    def stop_engine(self, grace: float, sig: int = signal.SIGTERM) -> tuple[int | None, bool]:
        """`sig` (SIGTERM) to every container, wait up to ``grace``, then SIGKILL; (main exit code, main killed?)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                kill_group(proc, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        deadline, result = time.monotonic() + max(grace, 0.1), (None, False)
        for name, proc in self.procs.items():
            try:
                code, killed = proc.wait(timeout=max(deadline - time.monotonic(), 0.1)), False
            except subprocess.TimeoutExpired:
                kill_group(proc)
                code, killed = proc.wait(), True
            if name == self.container["name"]:
                result = (code, killed)
        return result


def _field_ref(pod: Obj, path: str, ip: str) -> str | None:
    meta = pod["metadata"]
    return {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
            "metadata.uid": meta.get("uid"), "spec.nodeName": pod["spec"].get("nodeName"),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName"), "status.podIP": ip,
            "status.hostIP": "127.0.0.1"}.get(path)  # fmt: skip


def _probe_port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    return next(int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == port)


def http_port(pod: Obj) -> int:
    """The runtime container's port named ``http`` (else its first port, else SGLang's 30000)."""
    containers = pod["spec"]["containers"]
    container = next((c for c in containers if c["name"] == RUNTIME_CONTAINER), containers[0])
    ports = container.get("ports") or []
    named = [p["containerPort"] for p in ports if p.get("name") == "http"]
    return int((named or [p["containerPort"] for p in ports] or [30000])[0])


def secret_reader(core: Any) -> Any:
    """A resolver for ``secretKeyRef``/``configMapKeyRef`` that reads the object from the API server."""

    def read(kind: str, namespace: str, ref: Obj) -> str | None:
        try:
            if kind == "secretKeyRef":
                raw = (core.read_namespaced_secret(ref["name"], namespace).data or {}).get(ref["key"])
                return None if raw is None else base64.b64decode(raw).decode()
            return (core.read_namespaced_config_map(ref["name"], namespace).data or {}).get(ref["key"])
        except Exception:
            return None

    return read
