"""SIMULATION ONLY: the StatefulSet controller and a kubelet for the local API server, on loopback.

The local API server stores pods but nothing runs them (see harness.devcluster). For every
StatefulSet labelled ``app.kubernetes.io/managed-by=qwen-hicache-operator`` ``SimCluster``:

- creates pods ``<sts>-<i>`` for ordinals below ``spec.replicas`` from the template (owner reference,
  ``statefulset.kubernetes.io/pod-name``, ``controller-revision-hash``, claim volumes) and the
  claims ``<template>-<sts>-<i>`` (owned by the set only when ``whenDeleted: Delete``), binding
  each claim to ``<root_dir>/<namespace>/<claim>/``; an existing (retained) claim keeps its dir;
- deletes pods above ``spec.replicas`` (scale down; claims stay);
- plays the kubelet (sim.kubelet): a distinct loopback pod IP, init containers run for real,
  the engine stand-in as the ``sglang`` container, Ready following its ``/ready``, a crashed
  engine restarted; status written through the pods/status subresource;
- on a pod's deletion (the local server deletes at once: no graceful deletion) runs the preStop
  hook, SIGTERMs the engine, SIGKILLs it after the grace period, and only then lets the pod be
  recreated under the same name and claims, as the real controller waits for the old pod;
- writes the set's status (replicas, readyReplicas, currentReplicas, updatedReplicas, ...).

It polls the API every ``poll_seconds`` (no watches: simpler to stop, and ordering is its own).
``history["<ns>/<pod>"]`` is a ``PodRecord`` per pod name for tests to assert on.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from harness.polling import wait_for

from .kubelet import PodProcesses, PodRecord, Spawner, http_port, secret_reader
from .podstatus import pod_status
from .sglang_tree import TREE_ENV, patched_sglang_tree

Obj = dict[str, Any]
MANAGED_BY = "app.kubernetes.io/managed-by=qwen-hicache-operator"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
REVISION_LABEL = "controller-revision-hash"
HOST_PATH_ANNOTATION = "sim.qwen-hicache.io/host-path"
MERGE = "application/merge-patch+json"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def revision(sts: Obj) -> str:
    """``<sts>-<hash of the pod template>``, the shape of a ControllerRevision name."""
    digest = hashlib.sha256(json.dumps(sts["spec"]["template"], sort_keys=True).encode()).hexdigest()[:10]
    return f"{sts['metadata']['name']}-{digest}"


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
    procs: PodProcesses
    record: PodRecord
    state: str = "starting"  # starting | running | init-failed | terminating
    ready: bool = False
    restarts: int = 0
    starter: threading.Thread | None = None


class SimCluster:
    """Plays the StatefulSet controller and the kubelet; a context manager running a background thread."""

    def __init__(self, api_client: Any, root_dir: Path | str, namespace: str | None = None, *,
                 engine_args: list[str] | None = None, max_grace_seconds: float | None = None,
                 poll_seconds: float = 0.1, log: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.dyn = DynamicClient(api_client)
        self.root = Path(root_dir)
        self.namespace = namespace
        self.engine_args = list(engine_args or [])
        self.max_grace = max_grace_seconds
        self.poll = poll_seconds
        self.log = log or (lambda _msg: None)
        self.history: dict[str, PodRecord] = {}
        self.pvc_dirs: dict[str, Path] = {}
        self.pods: dict[tuple[str, str], LivePod] = {}
        self.errors: list[str] = []
        self._ips = IpPool()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spawner: Spawner | None = None
        self._engine_env: dict[str, str] = {}
        self._res = {k: self.dyn.resources.get(api_version=v, kind=k) for k, v in
                     (("Pod", "v1"), ("PersistentVolumeClaim", "v1"), ("StatefulSet", "apps/v1"))}  # fmt: skip
        self._secrets = secret_reader(self.dyn)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SimCluster:
        """Build the patched sglang tree once (engines would race to), then start the loop."""
        self._engine_env = {TREE_ENV: str(patched_sglang_tree())}
        self._spawner = Spawner()
        self._thread = threading.Thread(target=self._loop, name="sim-cluster", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop, then every engine (SIGTERM, then SIGKILL): a node going away, no preStop."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            if pod.starter:
                pod.starter.join(timeout=30)
            code, _ = pod.procs.stop_engine(5)
            if code is not None:
                pod.record.exit_codes.append(code)
            self._ips.release(pod.procs.ip)
        self.pods.clear()
        if self._spawner:
            self._spawner.close()

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- queries for tests and the demo -----------------------------------------------------
    def record(self, namespace: str, pod: str) -> PodRecord:
        return self.history.setdefault(f"{namespace}/{pod}", PodRecord())

    def pod_ip(self, namespace: str, pod: str) -> str | None:
        live = self.pods.get((namespace, pod))
        return live.procs.ip if live and live.state != "terminating" else None

    def pvc_dir(self, namespace: str, claim: str) -> Path:
        return self.root / namespace / claim

    def wait_for(self, check: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
        """Poll ``check`` until truthy; TimeoutError naming ``what`` and the harness's errors."""
        try:
            return wait_for(check, what, timeout, interval=0.05)
        except TimeoutError as err:
            raise TimeoutError(f"{err}; harness errors: {self.errors[-3:]}") from None

    def ready_pods(self, namespace: str, sts: str) -> list[str]:
        return sorted(p.name for p in self.pods.values()
                      if p.namespace == namespace and p.ready and p.name.rsplit("-", 1)[0] == sts)  # fmt: skip

    def wait_ready(self, namespace: str, sts: str, replicas: int, timeout: float = 30) -> list[str]:
        """Wait until exactly ``replicas`` pods of ``sts`` are Ready; their names."""
        return self.wait_for(lambda: len(self.ready_pods(namespace, sts)) == replicas and
                             self.ready_pods(namespace, sts), timeout, f"{replicas} ready pods of {sts}")  # fmt: skip

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the API may blink; keep playing
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.log(f"sim: {self.errors[-1]}")
            self._stop.wait(self.poll)

    def _list(self, kind: str, **selectors: str) -> list[Obj]:
        kwargs = {"namespace": self.namespace} if self.namespace else {}
        return self._res[kind].get(**kwargs, **selectors).to_dict().get("items") or []

    def _tick(self) -> None:
        sets = self._list("StatefulSet", label_selector=MANAGED_BY)
        live = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): p
            for p in self._list("Pod", label_selector=POD_NAME_LABEL)
        }
        self._notice_deletions(live)
        for sts in sets:
            self._reconcile(sts, live)
        self._probe()
        for sts in sets:
            self._write_sts_status(sts, live)

    def _notice_deletions(self, live: dict[tuple[str, str], Obj]) -> None:
        for key, pod in list(self.pods.items()):
            obj = live.get(key)
            if pod.state != "terminating" and (obj is None or obj["metadata"]["uid"] != pod.uid):
                pod.state = "terminating"
                threading.Thread(target=self._terminate, args=(pod,), daemon=True).start()

    def _reconcile(self, sts: Obj, live: dict[tuple[str, str], Obj]) -> None:
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        replicas = sts["spec"].get("replicas", 1)
        for i in range(replicas):
            key = (ns, f"{name}-{i}")
            if key in self.pods:
                continue  # running, or still terminating: the controller waits for the old pod
            pod = live.get(key) or self._create_pod(sts, i)
            self._start(pod)
        for (pns, pname), pod in live.items():
            ordinal = pname.rsplit("-", 1)[-1]
            owned = any(o.get("uid") == sts["metadata"]["uid"] for o in pod["metadata"].get("ownerReferences") or [])
            if pns == ns and owned and ordinal.isdigit() and int(ordinal) >= replicas:
                self._delete("Pod", ns, pname)  # scale down; its claims stay (whenScaled: Retain)

    def _delete(self, kind: str, ns: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._res[kind].delete(name=name, namespace=ns)

    # -- the StatefulSet controller -------------------------------------------------------------
    def _create_pod(self, sts: Obj, i: int) -> Obj:
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        template = copy.deepcopy(sts["spec"]["template"])
        spec = template["spec"]
        pod_name = f"{name}-{i}"
        spec.update(hostname=pod_name, subdomain=sts["spec"].get("serviceName", name))
        claims = {
            c["metadata"]["name"]: self._ensure_claim(sts, c, i) for c in sts["spec"].get("volumeClaimTemplates") or []
        }
        volumes = [v for v in spec.get("volumes") or [] if v["name"] not in claims]
        spec["volumes"] = volumes + [
            {"name": c, "persistentVolumeClaim": {"claimName": pvc}} for c, pvc in claims.items()
        ]
        meta = template.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": {**(meta.get("labels") or {}), POD_NAME_LABEL: pod_name,
                           "apps.kubernetes.io/pod-index": str(i), REVISION_LABEL: revision(sts)},
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [self._owner(sts)],
            },
            "spec": spec,
        }  # fmt: skip
        return self._res["Pod"].create(body=body, namespace=ns).to_dict()

    @staticmethod
    def _owner(sts: Obj) -> Obj:
        meta = sts["metadata"]
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"], "uid": meta["uid"],
                "controller": True, "blockOwnerDeletion": True}  # fmt: skip

    def _ensure_claim(self, sts: Obj, template: Obj, i: int) -> str:
        """Create ``<template>-<sts>-<i>`` unless it exists (retained claims are reused), bind it to a dir."""
        ns = sts["metadata"]["namespace"]
        pvc = f"{template['metadata']['name']}-{sts['metadata']['name']}-{i}"
        host = self.pvc_dir(ns, pvc)
        host.mkdir(parents=True, exist_ok=True)
        self.pvc_dirs[f"{ns}/{pvc}"] = host
        try:
            self._res["PersistentVolumeClaim"].get(name=pvc, namespace=ns)
            return pvc
        except NotFoundError:
            pass
        policy = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        labels = {**(template["metadata"].get("labels") or {}), **sts["spec"]["selector"].get("matchLabels", {})}
        meta = {"name": pvc, "namespace": ns, "labels": labels, "annotations": {HOST_PATH_ANNOTATION: str(host)}}
        if policy.get("whenDeleted") == "Delete":
            meta["ownerReferences"] = [{**self._owner(sts), "controller": False}]
        res = self._res["PersistentVolumeClaim"]
        res.create(body={"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
                         "spec": template.get("spec") or {}}, namespace=ns)  # fmt: skip
        capacity = ((template.get("spec") or {}).get("resources") or {}).get("requests") or {}
        bound = {"phase": "Bound", "accessModes": template["spec"].get("accessModes"), "capacity": capacity}
        res.status.patch(body={"status": bound}, name=pvc, namespace=ns, content_type=MERGE)
        return pvc

    def _write_sts_status(self, sts: Obj, live: dict[tuple[str, str], Obj]) -> None:
        ns, name, uid = sts["metadata"]["namespace"], sts["metadata"]["name"], sts["metadata"]["uid"]
        owned = [p for (pns, _), p in live.items() if pns == ns and
                 any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])]  # fmt: skip
        old = sts.get("status") or {}
        update = revision(sts)
        revs = [p["metadata"]["labels"].get(REVISION_LABEL) for p in owned]
        replicas = sts["spec"].get("replicas", 1)
        current = update if revs.count(update) == replicas == len(revs) else old.get("currentRevision", update)
        ready = sum(1 for (pns, pname) in self.pods if pns == ns and self.pods[(pns, pname)].ready and
                    live.get((pns, pname), {}).get("metadata", {}).get("uid") == self.pods[(pns, pname)].uid and
                    pname.rsplit("-", 1)[0] == name)  # fmt: skip
        status = {
            "observedGeneration": sts["metadata"].get("generation"),
            "replicas": len(owned),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": revs.count(current),
            "updatedReplicas": revs.count(update),
            "currentRevision": current,
            "updateRevision": update,
        }
        if any(old.get(k, 0) != v for k, v in status.items()):
            with contextlib.suppress(NotFoundError):
                self._res["StatefulSet"].status.patch(
                    body={"status": status}, name=name, namespace=ns, content_type=MERGE
                )

    # -- the kubelet ----------------------------------------------------------------------------
    def _volume_dirs(self, pod: Obj, run_dir: Path) -> dict[str, Path]:
        ns, dirs = pod["metadata"]["namespace"], {}
        for v in pod["spec"].get("volumes") or []:
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                dirs[v["name"]] = self.pvc_dirs.setdefault(f"{ns}/{claim}", self.pvc_dir(ns, claim))
            elif "hostPath" in v:
                dirs[v["name"]] = Path(v["hostPath"]["path"])
            else:  # emptyDir and anything else: a fresh directory per pod
                dirs[v["name"]] = run_dir / "volumes" / v["name"]
            dirs[v["name"]].mkdir(parents=True, exist_ok=True)
        return dirs

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        record = self.record(ns, name)
        record.incarnations += 1
        run_dir = self.root / ".pods" / ns / f"{name}-{record.incarnations}"
        ip = self._ips.take(http_port(pod))
        procs = PodProcesses(pod, ip, self._volume_dirs(pod, run_dir), self._secrets, self._spawner, run_dir,
                             self.engine_args, self._engine_env)  # fmt: skip
        live = LivePod(ns, name, meta["uid"], procs, record)
        record.ips.append(ip)
        record.note(f"scheduled uid={meta['uid']} ip={ip}")
        self.pods[(ns, name)] = live
        live.starter = threading.Thread(target=self._boot, args=(live,), name=f"boot-{name}", daemon=True)
        live.starter.start()

    def _boot(self, pod: LivePod) -> None:
        """Pending with an IP, init containers, then the engine: Running, not yet Ready."""
        self._patch_pod(pod, phase="Pending")
        failure = pod.procs.run_init()
        if pod.state == "terminating":
            return
        if failure is not None:
            pod.state = "init-failed"
            pod.record.init_failures.append(f"{failure['name']}: exit {failure['exitCode']}")
            pod.record.note(f"init container {failure['name']} failed with {failure['exitCode']}")
            self._patch_pod(pod, phase="Pending", init_failure=failure)
            return
        pod.procs.start_engine()
        pod.record.starts += 1
        pod.state = "running"
        self._patch_pod(pod, phase="Running")

    def _probe(self) -> None:
        for pod in list(self.pods.values()):
            if pod.state != "running":
                continue
            proc = pod.procs.proc
            if proc is not None and proc.poll() is not None:
                self._restart(pod, proc.returncode)
                continue
            ready = pod.procs.ready()
            if ready != pod.ready:
                pod.ready = ready
                pod.record.note(f"ready={ready}")
                self._patch_pod(pod, phase="Running")

    def _restart(self, pod: LivePod, code: int) -> None:
        """The engine died on its own: the kubelet restarts the container (no backoff here)."""
        pod.record.exit_codes.append(code)
        pod.record.note(f"engine exited {code}; restarting")
        pod.ready = False
        pod.restarts += 1
        pod.procs.start_engine()
        pod.record.starts += 1
        self._patch_pod(pod, phase="Running")

    def _terminate(self, pod: LivePod) -> None:
        """preStop within the grace period, SIGTERM, SIGKILL at its end; then the name is free again."""
        if pod.starter:
            pod.starter.join()
        grace = float(pod.procs.spec.get("terminationGracePeriodSeconds", 30))
        grace = min(grace, self.max_grace) if self.max_grace is not None else grace
        began = time.monotonic()
        if pod.procs.proc is not None:
            hook = pod.procs.run_prestop(grace)
            if hook is not None:
                pod.record.prestop_runs += 1
                pod.record.prestop_exit_codes.append(hook[0])
                pod.record.prestop_output.append(hook[1][-2000:])
                pod.record.note(f"preStop exited {hook[0]}")
        code, killed = pod.procs.stop_engine(max(grace - (time.monotonic() - began), 2.0))
        if code is not None:
            pod.record.exit_codes.append(code)
        pod.record.sigkilled += int(killed)
        pod.record.note(f"engine stopped: exit {code}{' (SIGKILL)' if killed else ''}")
        self._ips.release(pod.procs.ip)
        self.pods.pop((pod.namespace, pod.name), None)

    def _patch_pod(self, pod: LivePod, phase: str, init_failure: Obj | None = None) -> None:
        status = pod_status(pod.procs, pod.state, pod.ready, phase, init_failure, pod.restarts)
        try:
            self._res["Pod"].status.patch(body={"status": status}, name=pod.name, namespace=pod.namespace,
                                          content_type=MERGE)  # fmt: skip
        except (NotFoundError, ApiException) as exc:
            pod.record.note(f"status not written: {getattr(exc, 'status', exc)}")
