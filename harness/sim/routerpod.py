"""SIMULATION ONLY: the router pods of the real control plane, run by the kubelet stand-in with the real `smg`.

`RouterPods(api_client, sim_root)` (a context manager, next to a `SimCluster`):

- the router pods run the router image (images/router, built locally) like any pod (harness.sim.containers);
  their /etc/hosts, and every other pod's, is the DNS stand-in's file while this is entered;
- plays cluster DNS for StatefulSet pods: `<hostname>.<subdomain>.<ns>.svc.cluster.local` -> pod IP, for
  every pod that has an IP and is not being deleted (a headless Service with publishNotReadyAddresses), and
  nothing else: a deleted pod's name does not resolve, a restarted pod resolves to its new IP;
- plays the kubelet's ConfigMap volume refresh for router pods (the kubelet stand-in writes volumes once, at
  pod start): the worker manifest is rewritten from the API every `refresh_seconds`, atomically, as the
  kubelet swaps a ConfigMap volume's `..data` link; a real kubelet is slower (up to its sync period).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.sim.kubelet import CLUSTER_HOSTS
from harness.sim.nameshim import NameShim

ROUTER_IMAGE = "qwen-hicache-router"
ROUTER_COMPONENT = "app.kubernetes.io/component=router"


class RouterPods:
    def __init__(self, api_client: Any, sim_root: Path | str, refresh_seconds: float = 0.5) -> None:
        self.core = client.CoreV1Api(api_client)
        self.root = Path(sim_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.refresh = refresh_seconds
        self.dns = NameShim(self.root / "cluster-hosts")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sim-router-pods", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> RouterPods:
        CLUSTER_HOSTS.append(self.dns.path)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        with contextlib.suppress(ValueError):
            CLUSTER_HOSTS.remove(self.dns.path)

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh):
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by").items
                self._dns(pods)
                self._configmaps([p for p in pods if (p.metadata.labels or {}).get("app.kubernetes.io/component")
                                  == "router"])
            except Exception as exc:  # noqa: BLE001 - keep playing; tests read the errors
                self.errors.append(repr(exc))

    def _dns(self, pods: list) -> None:
        want = {}
        for p in pods:
            if p.spec.hostname and p.spec.subdomain and p.status.pod_ip and not p.metadata.deletion_timestamp:
                want[f"{p.spec.hostname}.{p.spec.subdomain}.{p.metadata.namespace}.svc.cluster.local"] = p.status.pod_ip
        for host in set(self.dns.records) - set(want):
            self.dns.set(host, None)
        for host, ip in want.items():
            if self.dns.records.get(host) != ip:
                self.dns.set(host, ip)

    def _configmaps(self, pods: list) -> None:
        for p in pods:
            for v in p.spec.volumes or []:
                if not v.config_map:
                    continue
                try:
                    data = self.core.read_namespaced_config_map(v.config_map.name, p.metadata.namespace).data or {}
                except ApiException as exc:
                    if exc.status == 404:  # not applied yet: a kubelet keeps the pod waiting for it
                        continue
                    raise
                for d in self.root.glob(f".pods/{p.metadata.namespace}/{p.metadata.name}-*/volumes/{v.name}"):
                    for key, value in data.items():
                        target = d / key
                        if not target.exists() or target.read_text() != value:
                            tmp = d / f".{key}.tmp"
                            tmp.write_text(value)
                            tmp.replace(target)
