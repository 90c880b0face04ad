"""Helpers for the install and RBAC tests: an audited API server, the chart installed with the real helm,
and the operator run as the chart's Deployment would run it, under the chart's ServiceAccount identity.

Each install gets its own DevCluster (about 1 s to start) so the request log holds that install only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
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

from harness.devcluster import DevCluster, free_ports

OPERATOR_NS = "qwen-hicache-system"
WORKLOAD_NS = "inference"


@dataclass
class Install:
    """The chart installed into an audited cluster, and the operator identity it created."""

    cluster: DevCluster
    api: client.ApiClient
    values: list[str]
    sets: list[str]
    service_account: str = ""
    operator_log: Path | None = None
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
        deployment = self._deployment()
        self.service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]

    def _deployment(self) -> dict[str, Any]:
        docs = render(*map(Path, self.values), sets=tuple(self.sets), namespace=OPERATOR_NS)
        return next(d for d in docs if d["kind"] == "Deployment")

    def operator_command(self, health_port: int, metrics_port: int) -> list[str]:
        """The Deployment's command and args, pointed at loopback ports instead of the pod's."""
        container = self._deployment()["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][0] == "python"
        args = [a.replace("0.0.0.0:8080", f"127.0.0.1:{health_port}") for a in container["args"]]
        args = [f"--metrics-port={metrics_port}" if a.startswith("--metrics-port=") else a for a in args]
        return [sys.executable, *container["command"][1:], *args, "--metrics-address=127.0.0.1"]

    def operator_env(self) -> dict[str, str]:
        container = self._deployment()["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        env["QWEN_HICACHE_RESYNC_SECONDS"] = "1"  # the only deviation: resync fast so the test is short
        return env


@dataclass
class OperatorProcess:
    """`qwen-hicache run` in a subprocess with its own identity, health and metrics ports."""

    proc: subprocess.Popen[bytes]
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
        return self.log.read_text(errors="replace")[-6000:]


@contextlib.contextmanager
def audited_cluster() -> Iterator[DevCluster]:
    """A fresh API server that records every request (who, verb, resource, namespace)."""
    with DevCluster(request_log=True, log=lambda _: None) as cluster:
        yield cluster


def admin_api(cluster: DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def install(cluster: DevCluster, values: list[str] | None = None, sets: list[str] | None = None) -> Install:
    """The workload namespace, then `helm install` of the chart with these values files and --set strings."""
    api = admin_api(cluster)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": WORKLOAD_NS}})
    inst = Install(cluster, api, values or [], sets or [])
    inst.install()
    return inst


def make_claims(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """The cache volume claims the StatefulSet controller would create from the claim template under
    `whenDeleted: Retain` (no controller runs here): one per replica, labelled, owned by nothing."""
    sts = client.AppsV1Api(api).read_namespaced_stateful_set(name, namespace)
    template = sts.spec.volume_claim_templates[0]
    names = [f"{template.metadata.name}-{name}-{i}" for i in range(sts.spec.replicas)]
    for claim in names:
        client.CoreV1Api(api).create_namespaced_persistent_volume_claim(namespace, {
            "metadata": {"name": claim, "labels": template.metadata.labels},
            "spec": {"accessModes": template.spec.access_modes,
                     "resources": {"requests": template.spec.resources.requests}},
        })
    return names


@contextlib.contextmanager
def running_operator(inst: Install, log: Path) -> Iterator[OperatorProcess]:
    """The operator started the way the chart's Deployment does, as the chart's ServiceAccount."""
    health_port, metrics_port = free_ports(2)
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{OPERATOR_NS}")
    kubeconfig = inst.cluster.add_user(inst.user, groups=groups)
    env = {**os.environ, **inst.operator_env(), "KUBECONFIG": str(kubeconfig)}
    with log.open("wb") as out:
        proc = subprocess.Popen(inst.operator_command(health_port, metrics_port), env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    op = OperatorProcess(proc, f"http://127.0.0.1:{health_port}/healthz",
                         f"http://127.0.0.1:{metrics_port}/metrics", log)
    try:
        deadline = time.monotonic() + 30
        while op.get(op.health)[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the operator did not become healthy:\n{op.output()}")
            time.sleep(0.2)
        yield op
    finally:
        stop_operator(op)


def stop_operator(op: OperatorProcess) -> None:
    """SIGTERM (what the kubelet sends), then wait: Kopf's graceful shutdown makes calls of its own too."""
    if op.proc.poll() is None:
        op.proc.send_signal(signal.SIGTERM)
        try:
            op.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            op.proc.kill()
            op.proc.wait()


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
    claims = make_claims(api, WORKLOAD_NS, name)  # the operator records the cache fingerprint on them
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
