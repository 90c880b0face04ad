"""SIMULATION ONLY: what a kubelet does for one pod, played with host processes on loopback.

Init containers and preStop hooks run for real (``sh -c ...`` as the pod spec says) on this host,
with container paths rewritten to the host directories bound to the pod's volumes, env resolved
(values, ``secretKeyRef``, ``configMapKeyRef``, ``$(VAR)``) as Kubernetes does. The ``sglang``
container runs the engine stand-in (harness.sim.engine) with the container's args on the
pod IP and the port named ``http``. No images, cgroups, probes' timing or restart backoff.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ctypes
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

Obj = dict[str, Any]
RUNTIME_CONTAINER = "sglang"
POD_HOST_ENV = "QWEN_HICACHE_POD_HOST"
_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
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
        parent = os.getpid()

        def preexec() -> None:
            _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

        while (item := self._requests.get()) is not None:
            argv, kwargs, future = item
            try:
                future.set_result(subprocess.Popen(argv, preexec_fn=preexec, start_new_session=True, **kwargs))
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


class PodProcesses:
    """One pod's host side: its env, init containers, engine process, preStop and shutdown."""

    def __init__(self, pod: Obj, ip: str, volumes: dict[str, Path], secrets: Any, spawner: Spawner,
                 run_dir: Path, engine_extra: list[str], engine_env: dict[str, str]) -> None:  # fmt: skip
        self.pod, self.ip, self.spawner, self.run_dir = pod, ip, spawner, run_dir
        self.engine_extra, self.engine_env = engine_extra, engine_env
        self.spec = pod["spec"]
        self.container = next(c for c in self.spec["containers"] if c["name"] == RUNTIME_CONTAINER)
        self.volumes, self.secrets = volumes, secrets
        self.proc: subprocess.Popen | None = None
        run_dir.mkdir(parents=True, exist_ok=True)

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
        return None

    def env(self, container: Obj) -> dict[str, str]:
        """The container's env as Kubernetes resolves it, container paths mapped to host dirs."""
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            value = self._env_value(item, env)
            if value is not None:
                env[item["name"]] = value
        paths = self.paths(container)
        return {k: paths(v) for k, v in env.items()}

    def _base_env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "QWEN_HICACHE_"))}
        keep["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{keep.get('PATH', '')}"  # python3 = this venv
        keep["HOSTNAME"] = self.pod["metadata"]["name"]
        return keep

    def argv(self, container: Obj, env: dict[str, str]) -> list[str]:
        paths = self.paths(container)
        return [paths(expand(a, env)) for a in (container.get("command") or []) + (container.get("args") or [])]

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

    def start_engine(self) -> None:
        env = self.env(self.container)
        args = self.argv({"args": self.container.get("args")}, env)  # the image's entrypoint is the stand-in
        argv = [sys.executable, "-m", "harness.sim.engine", *args, "--host", self.ip,
                "--port", str(self.port()), *self.engine_extra]  # fmt: skip
        log = open(self.run_dir / "engine.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = self.spawner.popen(argv, env={**self._base_env(), **self.engine_env, **env}, stdout=log, stderr=log)
        log.close()

    def ready(self, timeout: float = 0.5) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{self.port()}/ready", timeout=timeout) as r:
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

    def stop_engine(self, grace: float) -> tuple[int | None, bool]:
        """SIGTERM, wait up to ``grace``, then SIGKILL; (exit code, killed?)."""
        if self.proc is None:
            return None, False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=max(grace, 0.1)), False
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            return self.proc.wait(), True


def http_port(pod: Obj) -> int:
    """The runtime container's port named ``http`` (else its first port, else SGLang's 30000)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == RUNTIME_CONTAINER)
    ports = container.get("ports") or []
    named = [p["containerPort"] for p in ports if p.get("name") == "http"]
    return int((named or [p["containerPort"] for p in ports] or [30000])[0])


def secret_reader(dyn: Any) -> Any:
    """A resolver for ``secretKeyRef``/``configMapKeyRef`` that reads the object from the API server."""
    kinds = {"secretKeyRef": "Secret", "configMapKeyRef": "ConfigMap"}

    def read(kind: str, namespace: str, ref: Obj) -> str | None:
        res = dyn.resources.get(api_version="v1", kind=kinds[kind])
        try:
            obj = res.get(name=ref["name"], namespace=namespace).to_dict()
        except Exception:
            return None
        raw = (obj.get("data") or {}).get(ref["key"])
        if raw is not None and kind == "secretKeyRef":
            return base64.b64decode(raw).decode()
        # the local server stores Secrets as sent: stringData is not folded into data there
        return raw if raw is not None else (obj.get("stringData") or {}).get(ref["key"])

    return read
