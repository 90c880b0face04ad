"""Helpers for the install and RBAC tests: an audited control plane, the chart installed with the real helm,
and the operator running as the chart's Deployment pod from the operator image (built from images/operator by
harness.images, given to helm by digest; scheduled by the real scheduler, run by the kubelet stand-in as a
container with its ServiceAccount's token: RBAC is enforced by the real authorizer).

Each install gets its own DevCluster (a few seconds to start) so the request log holds that install only.
"""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chart.chartlib import CHART, RELEASE, helm_run, render
from kubehelpers import condition, eventually
from kubernetes import client, config
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import example, variant

from harness.devcluster import DevCluster
from harness.sim.cluster import SimCluster
from harness.sim.images import built

OPERATOR_NS = "qwen-hicache-system"
WORKLOAD_NS = "inference"


@dataclass
class Install:
    """The chart installed into an audited cluster, and the operator identity it created."""

    cluster: DevCluster
    sim: SimCluster
    api: client.ApiClient
    values: list[str]
    sets: list[str]
    service_account: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{OPERATOR_NS}:{self.service_account}"

    def helm(self, *args: str) -> str:
        env = {**os.environ, **self.cluster.env()}
        return helm_run(*args, "--kubeconfig", str(self.cluster.kubeconfig), env=env).stdout

    def install(self) -> None:
        """`helm install` exactly as docs/install.md says (CRD from crds/, then the templates)."""
        flags = [f for v in self.values for f in ("-f", v)] + [f for s in self.sets for f in ("--set", s)]
        self.helm("install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace", *flags)
        self.service_account = self._deployment()["spec"]["template"]["spec"]["serviceAccountName"]

    def _deployment(self) -> dict[str, Any]:
        docs = render(*map(Path, self.values), sets=tuple(self.sets), namespace=OPERATOR_NS)
        return next(d for d in docs if d["kind"] == "Deployment")

    def ports(self) -> dict[str, int]:
        container = self._deployment()["spec"]["template"]["spec"]["containers"][0]
        return {p["name"]: p["containerPort"] for p in container["ports"]}


@dataclass
class OperatorPod:
    """The operator's pod as the kubelet stand-in runs it: its endpoints on the pod IP, its log, its exits."""

    sim: SimCluster
    name: str
    health: str
    metrics: str
    log: Path

    def get(self, url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status, resp.read().decode()
        except OSError as err:
            return 0, str(err)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else "(no log)"

    @property
    def exit_codes(self) -> list[int]:
        return self.sim.record(OPERATOR_NS, self.name).exit_codes


@contextlib.contextmanager
def audited_cluster(root: Path) -> Iterator[tuple[DevCluster, SimCluster]]:
    """A fresh control plane that records every request (who, verb, resource, namespace), with two nodes (no
    LeaderWorkerSet controller: the chart needs none, and its requests would only fill the log)."""
    with DevCluster(request_log=True, lws=False, log=lambda _: None) as cluster, \
            SimCluster(admin_api(cluster), root / "volumes") as sim:
        yield cluster, sim


def admin_api(cluster: DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def install(bed: tuple[DevCluster, SimCluster], values: list[str] | None = None,
            sets: list[str] | None = None) -> Install:  # fmt: skip
    """The workload namespace (with the admin's weights claim), then `helm install` of the chart with these values
    files and --set strings; the deviations from the defaults: the locally built operator image (by digest) and the
    shortest resync the chart allows (5 s)."""
    cluster, sim = bed
    api = admin_api(cluster)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": WORKLOAD_NS}})
    sim.weights_claim(WORKLOAD_NS)
    image = built("operator")
    pinned = [f"image.repository={image.pinned.split('@')[0]}", f"image.digest={image.digest}"]
    inst = Install(cluster, sim, api, values or [], [*pinned, *(sets or []), "operator.resyncSeconds=5"])
    inst.install()
    return inst


@contextlib.contextmanager
def running_operator(inst: Install) -> Iterator[OperatorPod]:
    """Wait for the chart's operator pod to be Ready (its readiness probe is Kopf's health endpoint)."""
    core = client.CoreV1Api(inst.api)
    pods = lambda: core.list_namespaced_pod(OPERATOR_NS).items  # noqa: E731

    def ready() -> Any:
        live = [inst.sim.pods.get((OPERATOR_NS, p.metadata.name)) for p in pods()]
        return next((p for p in live if p is not None and p.ready), None)

    try:
        live = inst.sim.wait_for(ready, 90, "the operator pod Ready")
    except TimeoutError as err:
        logs = [p.procs.run_dir / "operator.log" for p in inst.sim.pods.values() if p.namespace == OPERATOR_NS]
        raise AssertionError(f"{err}\n" + "\n".join(f.read_text()[-3000:] for f in logs if f.exists())) from None
    ports = inst.ports()
    ip = live.procs.ip
    op = OperatorPod(inst.sim, live.name, f"http://{ip}:{ports['health']}/healthz",
                     f"http://{ip}:{ports.get('metrics', 0)}/metrics", live.procs.run_dir / "operator.log")
    yield op


def stop_operator(inst: Install, op: OperatorPod) -> None:
    """Scale the Deployment to zero: the pod is deleted gracefully and the kubelet stand-in sends SIGTERM."""
    apps = client.AppsV1Api(inst.api)
    name = inst.service_account  # the Deployment, ServiceAccount and ClusterRole share the fullname
    apps.patch_namespaced_deployment_scale(name, OPERATOR_NS, {"spec": {"replicas": 0}})
    inst.sim.wait_for(lambda: (OPERATOR_NS, op.name) not in inst.sim.pods, 60, "the operator pod stopped")


def _observed(custom: client.CustomObjectsApi, name: str, generation: int) -> dict | None:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, name)
    return obj if (obj.get("status") or {}).get("observedGeneration") == generation else None


def exercise(api: client.ApiClient) -> None:
    """What an admin does with the operator: create, update, break and delete resources."""
    custom, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    doc = example()
    doc["metadata"]["namespace"] = WORKLOAD_NS
    name = doc["metadata"]["name"]
    custom.create_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, doc)
    assert condition(eventually(lambda: _observed(custom, name, 1)), "SpecValid")["status"] == "True"
    sts = eventually(lambda: apps.read_namespaced_stateful_set(name, WORKLOAD_NS))
    template = sts.spec.volume_claim_templates[0].metadata.name
    claims = [f"{template}-{name}-{i}" for i in range(sts.spec.replicas)]  # made by the StatefulSet controller
    eventually(lambda: all(any(k.startswith(f"{GROUP}/") for k in (c.metadata.annotations or {}))
                           for c in map(lambda n: core.read_namespaced_persistent_volume_claim(n, WORKLOAD_NS),
                                        claims)))
    custom.patch_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, name, {"spec": {"replicas": 3}})
    eventually(lambda: apps.read_namespaced_stateful_set(name, WORKLOAD_NS).spec.replicas == 3)
    eventually(lambda: _observed(custom, name, 2))
    bad = variant(**{"spec.runtime.extraArgs": ["--tp-size", "8"], "metadata.name": "broken",
                     "metadata.namespace": WORKLOAD_NS})
    custom.create_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, bad)
    eventually(lambda: [e for e in core.list_namespaced_event(WORKLOAD_NS).items
                        if e.involved_object.name == "broken" and e.type == "Warning"])
    for n in (name, "broken"):
        custom.delete_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, n)
    eventually(lambda: not apps.list_namespaced_stateful_set(WORKLOAD_NS).items)
