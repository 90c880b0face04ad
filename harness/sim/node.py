"""SIMULATION ONLY: Node objects and their heartbeats, as a kubelet keeps them.

Each node registers with capacity and allocatable CPU, memory, pods and ``nvidia.com/gpu``, then renews its
Lease in ``kube-node-lease`` every 2 s and posts its Ready condition every 10 s, so the real node lifecycle
controller sees a healthy node (and taints it unreachable when the heartbeats stop: ``lose()``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from .podstatus import stamp

Obj = dict[str, Any]
LEASE_SECONDS = 2.0
STATUS_SECONDS = 10.0
KUBELET_VERSION = "v1.36.3"


@dataclass
class NodeShape:
    """What one simulated machine offers; the default is an 8-GPU H200 server."""

    cpu: str = "192"
    memory: str = "2Ti"
    gpus: int = 8
    pods: int = 110
    # the label NVIDIA's GPU feature discovery puts on GPU nodes (the operator's default node selector)
    labels: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    taints: list[Obj] = field(default_factory=list)

    def resources(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "nvidia.com/gpu": str(self.gpus),
                "ephemeral-storage": "4Ti"}  # fmt: skip


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """Registers nodes and keeps their heartbeats going in a background thread."""

    def __init__(self, api: client.ApiClient, names: list[str], shape: NodeShape) -> None:
        self.core, self.coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.names, self.shape = list(names), shape
        self.lost: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for name in self.names:
            self._register(name)
        self._thread = threading.Thread(target=self._loop, name="sim-node-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, delete: bool = True) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if delete:
            for name in self.names:
                self._delete(name)

    def _delete(self, name: str, timeout: float = 15.0) -> None:
        """Delete the node and wait until it is gone: a node left behind stays Ready for the grace period and
        the scheduler binds the next test's pods to it (pods no kubelet runs, evicted and recreated)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.delete_node(name)
            except ApiException as exc:
                if exc.status == 404:
                    return
            except Exception:  # noqa: BLE001, S110 - the API may blink; try again
                pass
            time.sleep(0.2)

    def lose(self, name: str) -> None:
        """Stop this node's heartbeats (the machine is gone; its processes are stopped by the caller)."""
        self.lost.add(name)

    def _register(self, name: str) -> None:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  **self.shape.labels}  # fmt: skip
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {"taints": self.shape.taints} if self.shape.taints else {}}  # fmt: skip
        node = self.core.create_node(body)
        self._post_status(name)
        self._renew(name, node.metadata.uid)

    def _post_status(self, name: str) -> None:
        now = stamp()
        conditions = [
            {"type": t, "status": "False", "reason": r, "lastHeartbeatTime": now, "lastTransitionTime": now}
            for t, r in (("MemoryPressure", "KubeletHasSufficientMemory"), ("DiskPressure", "KubeletHasNoDiskPressure"),
                         ("PIDPressure", "KubeletHasSufficientPID"))
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet stand-in is posting",
              "lastHeartbeatTime": now, "lastTransitionTime": now}]  # fmt: skip
        status = {
            "capacity": self.shape.resources(),
            "allocatable": self.shape.resources(),
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "containerRuntimeVersion":
                         "sim://1", "operatingSystem": "linux", "architecture": "amd64", "osImage": "qwen-hicache sim",
                         "kernelVersion": "", "machineID": name, "systemUUID": name, "bootID": name},
        }  # fmt: skip
        self.core.patch_node_status(name, {"status": status})

    def _renew(self, name: str, uid: str | None = None) -> None:
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _micro_now()}
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
        except ApiException as exc:
            if exc.status != 404:
                raise
            owner = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}] if uid else []
            body = {"metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": owner},
                    "spec": spec}  # fmt: skip
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def _loop(self) -> None:
        last_status = time.monotonic()
        while not self._stop.wait(LEASE_SECONDS):
            post = time.monotonic() - last_status >= STATUS_SECONDS
            for name in self.names:
                if name in self.lost:
                    continue
                with contextlib.suppress(Exception):  # the API may blink (restarts in chaos tests)
                    self._renew(name)
                    if post:
                        self._post_status(name)
            if post:
                last_status = time.monotonic()
