"""SIMULATION ONLY: the node side of a real control plane: kubelet stand-ins and a volume provisioner.

Everything above the node is real (harness.devcluster): the StatefulSet controller creates pods and claims,
the scheduler binds pods to nodes, the PV controller binds claims, the garbage collector, disruption and
node lifecycle controllers do their work. ``SimCluster`` plays only what needs a machine:

- registers its nodes (``sim-<tag>-<i>``, 8 GPUs each by default) with heartbeats (harness.sim.node);
- provisions, resizes and reclaims hostPath volumes for the default StorageClass (harness.sim.provisioner);
- runs every pod the scheduler binds to its nodes (harness.sim.kubelet: a loopback pod IP, service-account
  token files from the TokenRequest API, every container from its built image with runc (harness.sim.containers),
  init containers, probes, container restarts with the kubelet's crash-loop back-off, status through pods/status);
- honours graceful deletion: preStop hook, SIGTERM, SIGKILL at the end of the grace period, then the final
  delete (grace 0, uid precondition) that a kubelet makes once the containers have stopped; a hook that exits
  non-zero gets the kubelet's ``FailedPreStopHook`` Warning on the pod (``prestop_failed_event``);
- ``lose_node()``: a machine vanishes (processes killed, no more heartbeats), for node-loss tests;
- plays the cluster DNS for pods' hostname/subdomain records (harness.sim.dns), e.g. LWS_LEADER_ADDRESS.

``namespace`` only scopes the queries (``ready_pods``, ``record``); the nodes run whatever is bound to them.
``history["<ns>/<pod>"]`` is a ``PodRecord`` per pod name for tests to assert on.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from harness.polling import wait_for

from . import containers
from .dns import HOSTS_ENV, HostsFile, records
from .images import sim_node
from .kubelet import ConfigError, ImageError, Node, PodProcesses, PodRecord, Spawner, http_port, secret_reader
from .node import NodeAgent, NodeShape
from .podstatus import ContainerState, pod_status
from .provisioner import Provisioner

Obj = dict[str, Any]
BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0  # the kubelet's crash-loop back-off
STATUS_SYNC_S = 10.0  # the kubelet status manager's syncPeriod
DNS_REFRESH_S = 0.5  # how often the published DNS records follow the pods (CoreDNS follows a watch)
LOG_TAIL_BYTES, LOG_TAIL_LINES = 2048, 80  # terminationMessagePolicy: FallbackToLogsOnError takes this much


class IpPool:
    """Distinct loopback addresses, never handed out twice while in use, skipping ones already bound."""

    def __init__(self) -> None:
        self.prefix = f"127.{random.randint(64, 250)}"  # apart from 127.0.0.1 and from a second harness
        self.counter = 0
        self.used: set[str] = set()
        self.lock = threading.Lock()

    def take(self, port: int) -> str:
        with self.lock:
            while True:
                self.counter += 1
                ip = f"{self.prefix}.{self.counter // 250 % 256}.{self.counter % 250 + 1}"
                if ip not in self.used and self._free(ip, port):
                    self.used.add(ip)
                    return ip

    @staticmethod
    def _free(ip: str, port: int) -> bool:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
                return True
            except OSError:
                return False

    def release(self, ip: str) -> None:
        with self.lock:
            self.used.discard(ip)


@dataclass
class LivePod:
    """A pod this harness is running: its processes and where it stands."""

    namespace: str
    name: str
    uid: str
    node: str
    procs: PodProcesses
    record: PodRecord
    started: float = field(default_factory=time.time)
    state: str = "starting"  # starting | running | init-failed | image-error | terminating
    ready: bool = False
    containers: dict[str, ContainerState] = field(default_factory=dict)
    restart_at: dict[str, float] = field(default_factory=dict)  # container -> when its back-off ends
    starter: threading.Thread | None = None

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in self.containers.values())


class SimCluster:
    """Kubelet stand-ins for `nodes` nodes plus the volume provisioner; a context manager with a background loop."""

    def __init__(self, api_client: Any, root_dir: Path | str, namespace: str | None = None, *,
                 nodes: int = 2, shape: NodeShape | None = None, engine_args: list[str] | None = None,
                 max_grace_seconds: float | None = None, poll_seconds: float = 0.1,
                 backoff_seconds: float = BACKOFF_START_S,
                 log: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.root = Path(root_dir)
        self.namespace = namespace
        self.engine_args = list(engine_args or [])
        self.max_grace = max_grace_seconds
        self.poll = poll_seconds
        self.backoff_start = backoff_seconds
        self.log = log or (lambda _msg: None)
        tag = uuid.uuid4().hex[:5]
        self.node_names = [f"sim-{tag}-{i}" for i in range(nodes)]
        self.nodes = NodeAgent(api_client, self.node_names, shape or NodeShape())
        self.provisioner = Provisioner(api_client, self.root)
        self.history: dict[str, PodRecord] = {}
        self.pods: dict[tuple[str, str], LivePod] = {}
        self.errors: list[str] = []
        self._lost: set[str] = set()
        self._next_status_sync = 0.0
        self._ips = IpPool()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spawner: Spawner | None = None
        self.node: Node | None = None
        self._secrets = secret_reader(self.core)
        host = api_client.configuration.host.split("://", 1)[-1]
        self._hosts = HostsFile(self.root / ".dns" / "hosts.json")
        self._next_dns = 0.0
        self._api_env = {"KUBERNETES_SERVICE_HOST": host.rsplit(":", 1)[0],
                         "KUBERNETES_SERVICE_PORT": host.rsplit(":", 1)[1],
                         HOSTS_ENV: str(self._hosts.path)}  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SimCluster:
        """Find (or build) the images and start the container runtime, register the nodes, start the loop."""
        self.node = sim_node(self.root, self.log)
        self._spawner = Spawner()
        self.nodes.start()
        self._thread = threading.Thread(target=self._loop, name="sim-cluster", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop, then every container (SIGTERM, then SIGKILL): machines switched off; nodes removed."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            self._kill(pod)
        self.pods.clear()
        self.nodes.stop(delete=True)
        if self.node:
            self.node.runtime.stop()
        if self._spawner:
            self._spawner.close()

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def lose_node(self, node: str) -> list[str]:
        """The machine `node` is gone: its containers die at once and its heartbeats stop; the pods it ran."""
        self._lost.add(node)
        self.nodes.lose(node)
        gone = [p for p in list(self.pods.values()) if p.node == node]
        for pod in gone:
            self._kill(pod, crash=True)
        return [p.name for p in gone]

    def weights_claim(self, namespace: str, name: str = "qwen-weights", size: str = "200Gi") -> None:
        """The model-weights claim an admin provides before creating a server (the scheduler needs it bound)."""
        body = {"metadata": {"name": name}, "spec": {"accessModes": ["ReadOnlyMany"],
                                                     "resources": {"requests": {"storage": size}}}}  # fmt: skip
        with contextlib.suppress(ApiException):  # 409: it exists
            self.core.create_namespaced_persistent_volume_claim(namespace, body)

    # -- queries for tests and the demo -----------------------------------------------------
    def record(self, namespace: str, pod: str) -> PodRecord:
        return self.history.setdefault(f"{namespace}/{pod}", PodRecord())

    def pod_ip(self, namespace: str, pod: str) -> str | None:
        live = self.pods.get((namespace, pod))
        return live.procs.ip if live and live.state != "terminating" else None

    def pvc_dir(self, namespace: str, claim: str) -> Path:
        return self.provisioner.claim_dir(namespace, claim)

    def wait_for(self, check: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
        """Poll ``check`` until truthy; TimeoutError naming ``what`` and the harness's errors."""
        try:
            return wait_for(check, what, timeout, interval=0.05)
        except TimeoutError as err:
            raise TimeoutError(f"{err}; harness errors: {self.errors[-3:]}") from None

    def ready_pods(self, namespace: str, sts: str) -> list[str]:
        return sorted(p.name for p in list(self.pods.values())
                      if p.namespace == namespace and p.ready and p.name.rsplit("-", 1)[0] == sts)  # fmt: skip

    def wait_ready(self, namespace: str, sts: str, replicas: int, timeout: float = 60) -> list[str]:
        """Wait until exactly ``replicas`` pods of ``sts`` are Ready; their names. On a timeout the error says
        where each pod stands, in the API and in this harness, so a failure in CI can be read from its log."""
        try:
            want = f"{replicas} ready pods of {sts}"
            return self.wait_for(lambda: len(n := self.ready_pods(namespace, sts)) == replicas and n, timeout, want)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.diagnose(namespace, sts)}") from None

    def diagnose(self, namespace: str, sts: str) -> str:
        """Each pod of ``sts``: its API phase, node and conditions; the harness's state, notes and log tail."""
        lines = [f"harness nodes: {self.node_names} (lost: {sorted(self._lost)})"]
        with contextlib.suppress(Exception):
            for p in self.core.list_namespaced_pod(namespace).items:
                if p.metadata.name.rsplit("-", 1)[0] != sts:
                    continue
                conds = [(c.type, c.status, c.reason) for c in p.status.conditions or []]
                gone = bool(p.metadata.deletion_timestamp)
                lines.append(f"api {p.metadata.name} uid={p.metadata.uid} node={p.spec.node_name} "
                             f"phase={p.status.phase} deleting={gone} {conds}")  # fmt: skip
        for (ns, name), live in list(self.pods.items()):
            if ns != namespace or name.rsplit("-", 1)[0] != sts:
                continue
            log = live.procs.run_dir / f"{live.procs.container['name']}.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
            lines.append(f"harness {name} uid={live.uid} state={live.state} ready={live.ready} "
                         f"notes={live.record.events[-8:]}\nlog tail:\n{tail}")  # fmt: skip
        return "\n".join(lines)

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the API may blink; keep playing
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.log(f"sim: {self.errors[-1]}")
            self._stop.wait(self.poll)

    def _tick(self) -> None:
        self.provisioner.tick()
        mine = set(self.node_names) - self._lost
        listed = self.api.sanitize_for_serialization(self.core.list_pod_for_all_namespaces()).get("items") or []
        bound = {p["metadata"]["uid"]: p for p in listed if p["spec"].get("nodeName") in mine}
        for pod in list(self.pods.values()):
            obj = bound.get(pod.uid)
            if obj is None and pod.state != "terminating":  # force-deleted: stop it without the API
                pod.state = "terminating"
                threading.Thread(target=self._terminate, args=(pod, False), daemon=True).start()
        running = {p.uid for p in self.pods.values()}
        for uid, obj in bound.items():
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                live = self.pods.get((meta["namespace"], meta["name"]))
                if live is not None and live.uid == uid:
                    if live.state != "terminating":
                        live.state = "terminating"
                        threading.Thread(target=self._terminate, args=(live, True), daemon=True).start()
                elif uid not in running:
                    self._confirm_deleted(meta)
            elif uid not in running and _runnable(obj) and (meta["namespace"], meta["name"]) not in self.pods:
                self._start(obj)  # (a name still in self.pods is the old incarnation, stopping)
        self._probe()
        self._resync_status(bound)
        self._publish_dns(listed)

    def _publish_dns(self, pods: list[Obj]) -> None:
        """The cluster DNS's pod records, from every pod and headless Service in the API (all namespaces)."""
        if time.monotonic() < self._next_dns:
            return
        self._next_dns = time.monotonic() + DNS_REFRESH_S
        if not any((p.get("spec") or {}).get("subdomain") for p in pods):
            self._hosts.publish({})
            return
        services = self.api.sanitize_for_serialization(self.core.list_service_for_all_namespaces()).get("items")
        self._hosts.publish(records(pods, services or []))

    def _resync_status(self, bound: dict[str, Obj]) -> None:
        """The kubelet's status manager: every STATUS_SYNC_S it re-posts a pod whose Ready condition in the API
        differs from its own (the node lifecycle controller marks pods NotReady when heartbeats lapse)."""
        if time.monotonic() < self._next_status_sync:
            return
        self._next_status_sync = time.monotonic() + STATUS_SYNC_S
        for pod in list(self.pods.values()):
            obj = bound.get(pod.uid)
            if obj is None or pod.state != "running":
                continue
            conds = (obj.get("status") or {}).get("conditions") or []
            api_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
            if api_ready != pod.ready or (obj.get("status") or {}).get("phase") != "Running":
                pod.record.note(f"status re-posted: the API said ready={api_ready}")
                self._patch_pod(pod, phase="Running")

    # -- the kubelet ----------------------------------------------------------------------------
    def _volume_dirs(self, pod: Obj, run_dir: Path) -> dict[str, Path]:
        ns, dirs = pod["metadata"]["namespace"], {}
        for v in pod["spec"].get("volumes") or []:
            path = run_dir / "volumes" / v["name"]
            if "persistentVolumeClaim" in v:
                path = self._claim_path(ns, v["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in v:
                path = Path(v["hostPath"]["path"])
            elif "projected" in v:
                self._project(pod, v["projected"], path)
            elif "configMap" in v or "secret" in v:
                self._write_keys(pod, v, path)
            elif (v.get("emptyDir") or {}).get("medium") == "Memory":  # a tmpfs of sizeLimit, charged to the pod
                size = v["emptyDir"].get("sizeLimit")
                containers.tmpfs(path, int(parse_quantity(str(size))) if size else None)
            if not path.exists():  # emptyDir and anything else: a fresh directory per pod, writable by any uid
                path.mkdir(parents=True)
                path.chmod(0o777)
            dirs[v["name"]] = path
        return dirs

    def _claim_path(self, ns: str, claim: str) -> Path:
        pvc = self.core.read_namespaced_persistent_volume_claim(claim, ns)
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        return Path(pv.spec.host_path.path)

    def _project(self, pod: Obj, projected: Obj, path: Path) -> None:
        """The service-account volume: a token from the TokenRequest API, the cluster CA and the namespace."""
        path.mkdir(parents=True, exist_ok=True)
        meta = pod["metadata"]
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                spec = {"expirationSeconds": sat.get("expirationSeconds", 3607),
                        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}}
                if sat.get("audience"):
                    spec["audiences"] = [sat["audience"]]
                token = self.core.create_namespaced_service_account_token(
                    pod["spec"].get("serviceAccountName", "default"), meta["namespace"], {"spec": spec})
                token_file = path / sat.get("path", "token")
                token_file.write_text(token.status.token)
                _own_token(token_file, pod["spec"])
            elif "configMap" in source:
                cm = self.core.read_namespaced_config_map(source["configMap"]["name"], meta["namespace"])
                for item in source["configMap"].get("items") or [{"key": k, "path": k} for k in cm.data or {}]:
                    (path / item["path"]).write_text((cm.data or {}).get(item["key"], ""))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    field_path = (item.get("fieldRef") or {}).get("fieldPath", "")
                    value = {"metadata.namespace": meta["namespace"], "metadata.name": meta["name"]}.get(field_path, "")
                    (path / item["path"]).write_text(value)

    def _write_keys(self, pod: Obj, volume: Obj, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        ns = pod["metadata"]["namespace"]
        if "configMap" in volume:
            data = self.core.read_namespaced_config_map(volume["configMap"]["name"], ns).data or {}
            for key, value in data.items():
                (path / key).write_text(value)
        else:
            data = self.core.read_namespaced_secret(volume["secret"]["secretName"], ns).data or {}
            for key, value in data.items():
                (path / key).write_bytes(base64.b64decode(value))

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        record = self.record(ns, name)
        record.incarnations += 1
        run_dir = self.root / ".pods" / ns / f"{name}-{record.incarnations}"
        ip = self._ips.take(http_port(pod))
        procs = PodProcesses(pod, ip, {}, self._secrets, self._spawner, run_dir, self.engine_args, self.node,
                             self._api_env)  # fmt: skip
        live = LivePod(ns, name, meta["uid"], pod["spec"]["nodeName"], procs, record)
        record.ips.append(ip)
        record.note(f"scheduled on {live.node} uid={meta['uid']} ip={ip}")
        self.pods[(ns, name)] = live
        live.starter = threading.Thread(target=self._boot, args=(live, pod, run_dir), name=f"boot-{name}", daemon=True)
        live.starter.start()

    def _boot(self, pod: LivePod, obj: Obj, run_dir: Path) -> None:
        """Pending with an IP, volumes, init containers, then the containers: Running, not yet Ready."""
        try:
            pod.procs.volumes = self._volume_dirs(obj, run_dir)
        except Exception as exc:  # a volume that cannot be set up keeps the pod Pending, as a kubelet would
            pod.record.note(f"volume setup failed: {exc}")
            self.errors.append(f"{pod.name}: volume setup failed: {exc}")
            self.pods.pop((pod.namespace, pod.name), None)
            self._ips.release(pod.procs.ip)
            return
        self._patch_pod(pod, phase="Pending")
        try:
            pod.procs.check_images()
        except (ImageError, ConfigError) as exc:
            reason = "ErrImagePull" if isinstance(exc, ImageError) else "CreateContainerConfigError"
            pod.state = "image-error"
            for c in pod.procs.containers:
                pod.containers.setdefault(c["name"], ContainerState()).waiting = (reason, str(exc))
            pod.record.note(f"{reason}: {exc}")
            self._patch_pod(pod, phase="Pending")
            return
        failure = pod.procs.run_init()
        if pod.state == "terminating":
            return
        if failure is not None:
            pod.state = "init-failed"
            pod.record.init_failures.append(f"{failure['name']}: exit {failure['exitCode']}")
            pod.record.note(f"init container {failure['name']} failed with {failure['exitCode']}")
            self._patch_pod(pod, phase="Pending", init_failure=failure)
            return
        now = time.time()
        for c in pod.procs.containers:
            pod.containers.setdefault(c["name"], ContainerState()).started_at = now
        pod.procs.start_all()
        pod.record.starts += 1
        pod.state = "running"
        self._patch_pod(pod, phase="Running")

    def _probe(self) -> None:
        for pod in list(self.pods.values()):
            if pod.state != "running":
                continue
            changed = False
            for c in pod.procs.containers:
                changed |= self._watch_container(pod, c)
            _, unhealthy = pod.procs.probe(time.monotonic())
            for name in unhealthy:  # liveness (or startup) failed: the kubelet kills the container, then restarts it
                pod.record.note(f"container {name} failed its liveness/startup probe: killed")
                pod.procs.node.runtime.kill(pod.procs.cids[name], signal.SIGKILL)
            ready = all(cs.waiting is None for cs in pod.containers.values()) and pod.procs.ready()
            if ready != pod.ready or changed:
                if ready != pod.ready:
                    pod.record.note(f"ready={ready}")
                pod.ready = ready
                self._patch_pod(pod, phase="Running")

    def _watch_container(self, pod: LivePod, c: Obj) -> bool:
        """Exited containers wait out the crash-loop back-off, then restart; True when the status changed."""
        name, cs = c["name"], pod.containers.setdefault(c["name"], ContainerState())
        proc = pod.procs.procs.get(name)
        if cs.waiting is not None and time.monotonic() >= pod.restart_at.get(name, 0):
            cs.waiting, cs.started_at = None, time.time()
            pod.procs.start_container(name)
            pod.record.starts += 1
            pod.record.note(f"container {name} restarted (restart {cs.restarts})")
            return True
        if cs.waiting is not None or proc is None or proc.poll() is None:
            return False
        code = proc.returncode
        pod.procs.finished(name, code)
        if name == pod.procs.container["name"]:
            pod.record.exit_codes.append(code)
        ran = time.time() - (cs.started_at or time.time())
        cs.history = [] if ran > BACKOFF_RESET_S else cs.history
        cs.history.append(code)
        delay = min(self.backoff_start * 2 ** (len(cs.history) - 1), BACKOFF_MAX_S)
        cs.restarts += 1
        cs.last_terminated = self._termination(pod, c, code)
        cs.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={name} pod={pod.name}")
        pod.restart_at[name] = time.monotonic() + delay
        pod.record.note(f"container {name} exited {code}; back-off {delay:.0f}s")
        return True

    @staticmethod
    def _termination(pod: LivePod, c: Obj, code: int) -> Obj:
        reason = "OOMKilled" if pod.procs.oom.get(c["name"]) else "Completed" if code == 0 else "Error"
        out: Obj = {"exitCode": code if code >= 0 else 128 - code, "reason": reason,
                    "startedAt": None, "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        if c.get("terminationMessagePolicy") == "FallbackToLogsOnError" and code != 0:
            with contextlib.suppress(OSError):
                raw = (pod.procs.run_dir / f"{c['name']}.log").read_bytes()[-LOG_TAIL_BYTES:]
                out["message"] = "\n".join(raw.decode(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        return out

    def _terminate(self, pod: LivePod, graceful: bool) -> None:
        """preStop within the grace period, SIGTERM, SIGKILL at its end; then the final delete (grace 0)."""
        try:
            self._stop_containers(pod, graceful)
        finally:  # the API may be away (chaos tests): the next pass confirms the deletion, as a kubelet retries
            self._ips.release(pod.procs.ip)
            self.pods.pop((pod.namespace, pod.name), None)

    def _stop_containers(self, pod: LivePod, graceful: bool) -> None:
        if pod.starter:
            pod.starter.join()
        grace = 30.0
        with contextlib.suppress(Exception):  # ApiException, or no API server at all
            obj = self.core.read_namespaced_pod(pod.name, pod.namespace)
            if obj.metadata.uid == pod.uid:
                grace = float(obj.metadata.deletion_grace_period_seconds or grace)
        grace = min(grace, self.max_grace) if self.max_grace is not None else grace
        began = time.monotonic()
        if pod.procs.proc is not None and pod.procs.proc.poll() is None:
            hook = pod.procs.run_prestop(grace)
            if hook is not None:
                pod.record.prestop_runs += 1
                pod.record.prestop_exit_codes.append(hook[0])
                pod.record.prestop_output.append(hook[1][-2000:])
                pod.record.note(f"preStop exited {hook[0]}")
                if hook[0]:  # not 0, not killed at the grace limit (None): see prestop_failed_event
                    self._post_event(pod, prestop_failed_event(pod, pod.procs.container["name"]))
        code, killed = pod.procs.stop_engine(max(grace - (time.monotonic() - began), 2.0))
        if code is not None:
            pod.record.exit_codes.append(code)
        pod.record.sigkilled += int(killed)
        pod.record.note(f"engine stopped: exit {code}{' (SIGKILL)' if killed else ''}")
        pod.procs.teardown()
        if graceful:
            self._confirm_deleted({"name": pod.name, "namespace": pod.namespace, "uid": pod.uid})

    def _kill(self, pod: LivePod, crash: bool = False) -> None:
        """Machine switched off (SIGTERM, 5 s) or crashed (`crash`: SIGKILL at once, nothing drains)."""
        if pod.starter:
            pod.starter.join(timeout=30)
        code, _ = pod.procs.stop_engine(0 if crash else 5, signal.SIGKILL if crash else signal.SIGTERM)
        if code is not None:
            pod.record.exit_codes.append(code)
        pod.procs.teardown()
        self._ips.release(pod.procs.ip)
        self.pods.pop((pod.namespace, pod.name), None)

    def _post_event(self, pod: LivePod, event: client.CoreV1Event) -> None:
        """Post an event as the kubelet's recorder does: best effort, a refusal is only noted."""
        try:
            self.core.create_namespaced_event(pod.namespace, event)
            pod.record.note(f"event {event.reason} posted")
        except Exception as exc:  # noqa: BLE001 - ApiException, or no API server (chaos tests)
            pod.record.note(f"event {event.reason} not posted: {type(exc).__name__}")

    def _confirm_deleted(self, meta: Obj) -> None:
        """The kubelet's last word on a pod whose containers have stopped: delete now, this uid only."""
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"]))
        with contextlib.suppress(Exception):  # refused, or the API is away: a later pass sees the pod and retries
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)

    def _patch_pod(self, pod: LivePod, phase: str, init_failure: Obj | None = None) -> None:
        status = pod_status(pod.procs, pod.state, pod.ready, phase, init_failure, pod.containers, pod.started)
        try:
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, {"status": status})
        except ApiException as exc:
            pod.record.note(f"status not written: {exc.status}")
        except Exception as exc:  # noqa: BLE001 - no API server (chaos tests): the status sync re-posts it
            pod.record.note(f"status not written: {type(exc).__name__}")


def prestop_failed_event(pod: LivePod, container: str) -> client.CoreV1Event:
    """The kubelet's event for a preStop hook that failed (kuberuntime ``executePreStopHook``: reason
    ``FailedPreStopHook``, Warning, on the pod's container, message ``PreStopHook failed``; it leaves the hook's
    output out so that secrets do not leak). A hook cut off at the grace limit gets none here: the kubelet stops
    waiting for it, and whether its later failure is recorded depends on the kubelet's version."""
    now = datetime.datetime.now(datetime.UTC)
    ref = client.V1ObjectReference(api_version="v1", kind="Pod", name=pod.name, namespace=pod.namespace,
                                   uid=pod.uid, field_path=f"spec.containers{{{container}}}")  # fmt: skip
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{pod.name}.{time.time_ns():x}", namespace=pod.namespace),
        involved_object=ref, reason="FailedPreStopHook", message="PreStopHook failed", type="Warning",
        source=client.V1EventSource(component="kubelet", host=pod.node), first_timestamp=now, last_timestamp=now,
        count=1, reporting_component="kubelet", reporting_instance=pod.node,
    )  # fmt: skip


def _runnable(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _own_token(path: Path, spec: Obj) -> None:
    """The kubelet's projected token: 0600 for the pod's runAsUser, or 0640 for its fsGroup, else 0644."""
    sc = spec.get("securityContext") or {}
    uid, group = sc.get("runAsUser"), sc.get("fsGroup")
    if uid is not None or group is not None:
        os.chown(path, int(uid if uid is not None else 0), int(group if group is not None else -1))
    path.chmod(0o600 if uid is not None and group is None else 0o640 if group is not None else 0o644)
