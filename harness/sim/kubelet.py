"""SIMULATION ONLY: what a kubelet does for one pod: its containers, run from their built images with runc.

Every container, init containers included, runs from its image (harness.sim.containers: the local image store,
an overlay root filesystem, the pod's volumes bound at their paths, the securityContext, a memory cgroup with the
container's limit), with env resolved as Kubernetes does (values, ``secretKeyRef``, ``configMapKeyRef``,
``fieldRef``, ``$(VAR)``) plus ``KUBERNETES_SERVICE_HOST``/``_PORT``. An image the node's store does not hold
leaves the pod ``ErrImagePull``. The runtime image's container runs the engine stand-in that the test-only image
layer carries (harness/images/Dockerfile.sim-runtime) against the image's own patched tree. Probes (startup,
readiness, liveness: httpGet and tcpSocket from the node to the pod IP, exec inside the container) run at their
periods with their thresholds; preStop exec hooks run inside the container. A wildcard address (0.0.0.0) in a
container's args becomes the pod IP, and a Python program's wildcard binds are narrowed to it (podnet), so
nothing listens beyond loopback: pods share the host's network.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from harness.deathsig import die_with_parent

from . import containers
from .dns import HOSTS_ENV

Obj = dict[str, Any]
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
RUNTIME_CONTAINER = "sglang"
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


ImageError = containers.ImageError
ConfigError = containers.ConfigError
RUNTIME_ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]
SIM_LABEL = "io.qwen-hicache.test-only"
TORCH_LABEL = "io.qwen-hicache.sim.torch-env"
DNS_MOUNT = "/run/qwen-hicache-sim/dns"
DNS_PY_MOUNT = "/run/qwen-hicache-sim/dns.py"  # harness.sim.dns for podnet in images without the harness


CLUSTER_HOSTS: list[Path] = []  # the cluster DNS stand-in's hosts files, newest last (harness.sim.routerpod)


@dataclass
class Node:
    """What every pod on the simulated nodes shares: the image store, runc, the cluster DNS file, test-only mounts."""

    images: containers.Images
    runtime: containers.Runtime
    torch_env: Path | None = None  # the machine's runtime test env, for images that ask for it (TORCH_LABEL)
    hosts: list[Path] = field(default_factory=list)  # CLUSTER_HOSTS: the newest is bound at every pod's /etc/hosts

    @property
    def hosts_file(self) -> Path | None:
        return self.hosts[-1] if self.hosts else None


@dataclass
class ProbeState:
    started: bool = False  # the startup probe passed (or there is none)
    ready: bool = False
    next_at: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    successes: dict[str, int] = field(default_factory=dict)


class PodProcesses:
    """One pod's containers: env, init containers, container starts, probes, preStop and shutdown."""

    def __init__(self, pod: Obj, ip: str, volumes: dict[str, Path], secrets: Any, spawner: Spawner,
                 run_dir: Path, engine_extra: list[str], node: Node,
                 api_env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.pod, self.ip, self.spawner, self.run_dir, self.node = pod, ip, spawner, run_dir, node
        self.engine_extra, self.api_env = engine_extra, dict(api_env or {})
        self.spec = pod["spec"]
        self.uid = pod["metadata"]["uid"]
        self.containers: list[Obj] = list(self.spec["containers"])
        self.container = next((c for c in self.containers if c["name"] == RUNTIME_CONTAINER), self.containers[0])
        self.volumes, self.secrets = volumes, secrets
        self.procs: dict[str, subprocess.Popen] = {}
        self.cids: dict[str, str] = {}  # container -> its current runc id
        self.bundles: dict[str, Path] = {}  # container -> its current bundle (overlay root)
        self.plans: dict[str, containers.ContainerPlan] = {}
        self.probes: dict[str, ProbeState] = {}
        self.oom: dict[str, bool] = {}
        self._oom_before: dict[str, int] = {}
        self._starts = 0
        run_dir.mkdir(parents=True, exist_ok=True)

    @property
    def proc(self) -> subprocess.Popen | None:
        """The main container's process (the runtime's, in a server pod)."""
        return self.procs.get(self.container["name"])

    # -- env -------------------------------------------------------------------------------------
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

    def env(self, container: Obj) -> dict[str, str]:
        """The container's env as Kubernetes resolves it, after the service env the kubelet injects."""
        env: dict[str, str] = dict(self.api_env)
        for item in container.get("env") or []:
            value = self._env_value(item, env)
            if value is not None:
                env[item["name"]] = value
        return env

    def words(self, container: Obj, key: str, env: dict[str, str]) -> list[str] | None:
        words = container.get(key)
        return None if words is None else [expand(a, env).replace("0.0.0.0", self.ip) for a in words]

    # -- images and plans ------------------------------------------------------------------------
    def check_images(self) -> None:
        """Resolve every container's image and plan it; ImageError / ConfigError for the first that cannot run."""
        for c in [*(self.spec.get("initContainers") or []), *self.containers]:
            self.plans[c["name"]] = self._plan(c)

    def _plan(self, c: Obj) -> containers.ContainerPlan:
        image = self.node.images.resolve(c.get("image", ""))
        env = self.env(c)
        command, args = self.words(c, "command", env), self.words(c, "args", env)
        if SIM_LABEL in (image.config.get("Labels") or {}) and command == RUNTIME_ENTRYPOINT:
            # the test-only layer's entrypoint (the engine stand-in) takes the runtime's args
            command = None
            args = [*(args or []), "--host", self.ip, "--port", str(self.port()), *self.engine_extra]
        merged = {**c, "command": command, "args": args,
                  "securityContext": {**_pod_security(self.spec), **(c.get("securityContext") or {})}}  # fmt: skip
        extra = {"QWEN_HICACHE_SIM_POD_IP": self.ip, "HOSTNAME": self.pod["metadata"]["name"],
                 "QWEN_HICACHE_SIM_POD_NAMESPACE": self.pod["metadata"]["namespace"]}  # podnet's DNS search path
        if HOSTS_ENV in env:  # the DNS stand-in's records (harness.sim.dns), through its directory's mount
            extra[HOSTS_ENV] = f"{DNS_MOUNT}/{Path(env[HOSTS_ENV]).name}"
            extra["QWEN_HICACHE_SIM_DNS_PY"] = DNS_PY_MOUNT
        image_env = dict(e.split("=", 1) for e in image.config.get("Env") or [] if "=" in e)
        path = env.get("PYTHONPATH", image_env.get("PYTHONPATH"))
        extra["PYTHONPATH"] = ":".join(filter(None, [containers.PODNET_MOUNT, path]))
        return containers.plan(merged, image, {**env, **extra}, self._mounts(c, image), _memory_limit(c))

    def _mounts(self, c: Obj, image: Any) -> list[containers.Mount]:
        mounts = [containers.Mount(str(containers.PODNET), containers.PODNET_MOUNT, readonly=True)]
        for m in c.get("volumeMounts") or []:
            host = self.volumes.get(m["name"])
            if host is None:
                raise ConfigError(f'container {c["name"]}: volume "{m["name"]}" is not defined in the pod')
            src = host / m.get("subPath", "")
            src.mkdir(parents=True, exist_ok=True) if not src.exists() else None
            mounts.append(containers.Mount(str(src), m["mountPath"], bool(m.get("readOnly"))))
        if HOSTS_ENV in self.api_env:
            mounts.append(containers.Mount(str(Path(self.api_env[HOSTS_ENV]).parent), DNS_MOUNT, readonly=True))
            mounts.append(containers.Mount(str(Path(__file__).with_name("dns.py")), DNS_PY_MOUNT, readonly=True))
        torch = (image.config.get("Labels") or {}).get(TORCH_LABEL)
        if torch and self.node.torch_env is not None:  # test-only: torch for the engine stand-in
            mounts.append(containers.Mount(str(self.node.torch_env), torch, readonly=True))
        hosts = self.node.hosts_file or self._hosts_file()
        mounts.append(containers.Mount(str(hosts), "/etc/hosts", readonly=True))
        return mounts

    def _hosts_file(self) -> Path:
        path = self.run_dir / "etc-hosts"
        if not path.exists():
            name = self.pod["metadata"]["name"]
            path.write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{self.ip}\t{name}\n")
        return path

    def port(self) -> int:
        return http_port(self.pod)

    # -- running containers ----------------------------------------------------------------------
    def _cgroup(self, name: str) -> tuple[str, ...]:
        return (self.uid, name)

    def _launch(self, c: Obj, stdout: Any) -> subprocess.Popen:
        name, p = c["name"], self.plans[c["name"]]
        self._starts += 1
        cid = f"{self.uid[:13]}-{name}-{self._starts}"
        bundle = self.run_dir / "containers" / f"{name}-{self._starts}"
        node = self.node.runtime
        node.cgroups.make((self.uid,), _pod_memory_limit(self.spec))
        node.cgroups.make(self._cgroup(name), p.memory_limit)
        self._oom_before[name] = node.cgroups.oom_kills(self._cgroup(name))
        image = self.node.images.resolve(c.get("image", ""))
        hostname = self.pod["spec"].get("hostname") or self.pod["metadata"]["name"]
        config = containers.oci_config(p, bundle / "rootfs", hostname, node.cgroups.runc_path(self.uid, name))
        node.bundle(bundle, self.node.images.rootfs(image), config)
        self.cids[name], self.bundles[name] = cid, bundle
        return self.spawner.popen(node.runc("run", "--bundle", str(bundle), cid), stdout=stdout,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.run_dir)  # fmt: skip

    def finished(self, name: str, code: int | None = None) -> None:
        """After a container's process ended (exit ``code``): OOM-killed or not, its overlay released."""
        node = self.node.runtime
        killed = code in (137, -9) or (code is None and name in self.procs and self.procs[name].returncode in (137, -9))
        self.oom[name] = killed and node.cgroups.oom_kills(self._cgroup(name)) > self._oom_before.get(name, 0)
        node.delete(self.cids.get(name, ""))
        if name in self.bundles:
            node.release(self.bundles.pop(name))

    def run_init(self) -> Obj | None:
        """Run init containers in order; the failing one's terminated state, or None when all passed."""
        for c in self.spec.get("initContainers") or []:
            log_path = self.run_dir / f"init-{c['name']}.log"
            with open(log_path, "wb") as log:
                proc = self._launch(c, log)
            try:
                code: int | None = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.node.runtime.kill(self.cids[c["name"]], signal.SIGKILL)
                code = None
                proc.wait()
            self.finished(c["name"], code)
            if code != 0:
                out = log_path.read_text(errors="replace")
                reason = "OOMKilled" if self.oom.get(c["name"]) else "Error"
                return {"name": c["name"], "exitCode": -1 if code is None else code, "reason": reason,
                        "message": out[-1000:]}  # fmt: skip
        return None

    def start_container(self, name: str) -> None:
        c = next(c for c in self.containers if c["name"] == name)
        with open(self.run_dir / f"{name}.log", "ab") as log:
            self.procs[name] = self._launch(c, log)
        self.probes[name] = ProbeState()

    def start_all(self) -> None:
        for c in self.containers:
            self.start_container(c["name"])

    # -- probes ----------------------------------------------------------------------------------
    def probe(self, now: float) -> tuple[bool, list[str]]:
        """Run the probes that are due; (whether some readiness changed, containers whose liveness failed)."""
        changed, unhealthy = False, []
        for c in self.containers:
            name, proc = c["name"], self.procs.get(c["name"])
            state = self.probes.setdefault(name, ProbeState())
            ready = state.ready
            if proc is None or proc.poll() is not None:
                ready = False
            elif not state.started:
                ok = self._run_due(c, "startupProbe", state, now) if c.get("startupProbe") else True
                state.started = bool(ok)
                if ok is False and state.failures["startupProbe"] >= _threshold(c["startupProbe"], "failure"):
                    unhealthy.append(name)
            if proc is not None and proc.poll() is None and state.started:
                if c.get("livenessProbe") and self._run_due(c, "livenessProbe", state, now) is False \
                        and state.failures["livenessProbe"] >= _threshold(c["livenessProbe"], "failure"):
                    unhealthy.append(name)
                ok = self._run_due(c, "readinessProbe", state, now) if c.get("readinessProbe") else True
                if ok is True and state.successes.get("readinessProbe", 1) >= _threshold(c.get("readinessProbe"),
                                                                                         "success"):
                    ready = True
                elif ok is False and (not ready or state.failures["readinessProbe"] >= _threshold(
                        c["readinessProbe"], "failure")):
                    ready = False
            changed |= ready != state.ready
            state.ready = ready
        return changed, unhealthy

    def _run_due(self, c: Obj, kind: str, state: ProbeState, now: float) -> bool | None:
        """The probe's result when its period is up (counting successes and failures), else None."""
        probe = c[kind]
        due = state.next_at.setdefault(kind, now + float(probe.get("initialDelaySeconds", 0)))
        if now < due:
            return None
        state.next_at[kind] = now + float(probe.get("periodSeconds", 10))
        ok = self._probe_once(c, probe)
        hit, miss = (state.successes, state.failures) if ok else (state.failures, state.successes)
        hit[kind], miss[kind] = hit.get(kind, 0) + 1, 0
        return ok

    def _probe_once(self, c: Obj, probe: Obj) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            get = probe["httpGet"]
            return self._http_ok(_probe_port(c, get["port"]), get.get("path", "/"), timeout)
        if "tcpSocket" in probe:
            with contextlib.suppress(OSError), socket.create_connection(
                    (self.ip, _probe_port(c, probe["tcpSocket"]["port"])), timeout):  # fmt: skip
                return True
            return False
        if "exec" in probe:
            code, _ = self.exec(c["name"], probe["exec"]["command"], timeout)
            return code == 0
        return True

    def ready(self) -> bool:
        """Every container running and ready (as its probes last said)."""
        return all(self.probes.get(c["name"], ProbeState()).ready for c in self.containers) and all(
            (p := self.procs.get(c["name"])) is not None and p.poll() is None for c in self.containers)

    def _http_ok(self, port: int, path: str, timeout: float) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{port}{path}", timeout=timeout) as r:
                return 200 <= r.status < 400
        except OSError:
            return False

    # -- exec, preStop, stop ---------------------------------------------------------------------
    def exec(self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None,
             ) -> tuple[int | None, str]:  # fmt: skip
        """``argv`` inside the running container ``name`` (its env, user, caps, cwd); (exit code or None, output)."""
        p, cid = self.plans[name], self.cids.get(name)
        if cid is None:
            return 126, "container not running"
        return self.spawner.run(self.node.runtime.exec_argv(cid, argv, {**p.env, **(env or {})}, p), timeout=timeout,
                                cwd=self.run_dir)  # fmt: skip

    def run_prestop(self, grace: float) -> tuple[int | None, str] | None:
        """The main container's preStop exec hook, inside it, pointed at the pod IP; None when it has none."""
        command = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
        if not command:
            return None
        env = self.env(self.container)
        return self.exec(self.container["name"], [expand(a, env) for a in command], grace, {POD_HOST_ENV: self.ip})

    def stop_engine(self, grace: float, sig: int = signal.SIGTERM) -> tuple[int | None, bool]:
        """`sig` (SIGTERM) to every container, wait up to ``grace``, then SIGKILL; (main exit code, main killed?)."""
        for name, proc in self.procs.items():
            if proc.poll() is None:
                self.node.runtime.kill(self.cids[name], sig)
        deadline, result = time.monotonic() + max(grace, 0.1), (None, False)
        for name, proc in self.procs.items():
            try:
                code, killed = proc.wait(timeout=max(deadline - time.monotonic(), 0.1)), False
            except subprocess.TimeoutExpired:
                self.node.runtime.kill(self.cids[name], signal.SIGKILL)
                try:
                    code, killed = proc.wait(timeout=10), True
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    code, killed = proc.wait(), True
            self.finished(name, code)
            if name == self.container["name"]:
                result = (code, killed)
        return result

    def teardown(self) -> None:
        """After the pod's last container: its memory volumes unmounted, its cgroups removed."""
        containers.unmount_under(self.run_dir)
        self.node.runtime.cgroups.remove(self.uid)


def _pod_security(spec: Obj) -> Obj:
    """The pod-level securityContext fields a container inherits."""
    sc = spec.get("securityContext") or {}
    return {k: sc[k] for k in ("runAsUser", "runAsGroup", "runAsNonRoot") if k in sc}


def _memory_limit(c: Obj) -> int | None:
    value = ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return int(parse_quantity(str(value))) if value is not None else None


def _pod_memory_limit(spec: Obj) -> int | None:
    """The pod cgroup's limit: the containers' sum (or the largest init container's), when every one has a limit."""
    limits = [_memory_limit(c) for c in spec["containers"]]
    init = [_memory_limit(c) for c in spec.get("initContainers") or []]
    if any(v is None for v in [*limits, *init]):
        return None
    return max(sum(limits), *init) if init else sum(limits)


def _threshold(probe: Obj | None, which: str) -> int:
    default = 3 if which == "failure" else 1
    return int((probe or {}).get(f"{which}Threshold", default))


def _field_ref(pod: Obj, path: str, ip: str) -> str | None:
    meta = pod["metadata"]
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:  # the downward API's one-key form, as a kubelet resolves it
        return (meta.get(keyed.group(1)) or {}).get(keyed.group(2))
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
