"""Node events on the real control plane: `kubectl drain` (cordon + the eviction API) and a node that vanishes
(heartbeats stop; the node lifecycle controller taints it and the taint-eviction controller evicts its pods).
Either way the pod comes back on the other node and warm-starts from its own cache volume."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

import pytest
from kubehelpers import eventually
from kubernetes import client
from test_warm_restart import NAME, _up

from harness.devcluster import ensure_kubectl

pytestmark = pytest.mark.integration
PROMPT = "a long shared system prompt that must come back from disk after a node event. " * 40


def _generate(sim: Any, ns: str, pod: str) -> dict:
    body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}).encode()
    req = urllib.request.Request(f"http://{sim.pod_ip(ns, pod)}:30000/generate", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["meta_info"]["cached_tokens_details"]


def _info(sim: Any, ns: str, pod: str) -> dict:
    with urllib.request.urlopen(f"http://{sim.pod_ip(ns, pod)}:30000/sim/info", timeout=10) as r:
        return json.loads(r.read())


def _node_of(core: client.CoreV1Api, ns: str, pod: str) -> str:
    return core.read_namespaced_pod(pod, ns).spec.node_name


def _warm_prefix_on_disk(sim: Any, ns: str, pod: str) -> None:
    """Serve the prompt twice (device hit), so write-through puts its pages on disk before the node event."""
    _generate(sim, ns, pod)
    assert _generate(sim, ns, pod)["device"] > 0


def _replaced_elsewhere(core: client.CoreV1Api, sim: Any, ns: str, pod: str, old_node: str) -> str:
    def moved() -> str | None:
        node = _node_of(core, ns, pod)
        return node if node and node != old_node and pod in sim.ready_pods(ns, NAME) else None

    return eventually(moved, timeout=180)


def test_drain_evicts_through_the_eviction_api_and_the_pod_warms_elsewhere(
    operator: None, sim: Any, devcluster: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    core = client.CoreV1Api(kube_api)
    _up(custom, sim, namespace, 2)
    pod = f"{NAME}-0"
    _warm_prefix_on_disk(sim, namespace, pod)
    node = _node_of(core, namespace, pod)
    drain = subprocess.run(
        [str(ensure_kubectl()), "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=170s"],
        capture_output=True, text=True, timeout=180, env={"KUBECONFIG": str(devcluster.kubeconfig), "PATH": "/usr/bin"},
    )  # fmt: skip
    assert drain.returncode == 0, drain.stdout + drain.stderr
    assert f"evicting pod {namespace}/{pod}" in drain.stdout + drain.stderr
    assert core.read_node(node).spec.unschedulable  # cordoned first
    _replaced_elsewhere(core, sim, namespace, pod, node)
    record = sim.record(namespace, pod)
    assert record.prestop_runs >= 1 and record.sigkilled == 0, record.events  # graceful: preStop flushed
    assert _generate(sim, namespace, pod)["storage"] > 0  # the same volume, now mounted on the other node


def test_lost_node_is_tainted_evicted_and_recovered_after_the_node_is_deleted(
    operator: None, sim: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    _up(custom, sim, namespace, 2)
    pod = f"{NAME}-0"
    _warm_prefix_on_disk(sim, namespace, pod)
    eventually(lambda: _info(sim, namespace, pod)["pending_writes"] == 0, timeout=30)  # write-through on disk
    node = _node_of(core, namespace, pod)
    assert pod in sim.lose_node(node)  # a crash: SIGKILL, nothing drains

    def unreachable() -> bool:
        taints = core.read_node(node).spec.taints or []
        return any(t.key == "node.kubernetes.io/unreachable" and t.effect == "NoExecute" for t in taints)

    eventually(unreachable, timeout=120)
    eventually(lambda: core.read_namespaced_pod(pod, namespace).metadata.deletion_timestamp, timeout=120)
    # No kubelet confirms the deletion, so the StatefulSet keeps its at-most-one promise and waits; the admin
    # (or a cloud's node controller) deletes the dead Node, the pod GC removes its pods, the set recreates it.
    core.delete_node(node)
    _replaced_elsewhere(core, sim, namespace, pod, node)
    assert _generate(sim, namespace, pod)["storage"] > 0  # write-through had put the prefix on disk


def _evict(core: client.CoreV1Api, ns: str, pod: str) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=ns))
    core.create_namespaced_pod_eviction(pod, ns, body)


def test_the_budget_refuses_a_second_eviction_while_a_replica_is_down(
    operator: None, sim: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    """A node drain evicts pod by pod through this API: the server's PodDisruptionBudget (the real disruption
    controller keeps its status) lets one replica go, refuses the next with 429 until the first is back."""
    core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)
    _up(custom, sim, namespace, 2)

    def allowed() -> int:
        return policy.read_namespaced_pod_disruption_budget(NAME, namespace).status.disruptions_allowed

    eventually(lambda: allowed() == 1, timeout=60)
    _evict(core, namespace, f"{NAME}-0")
    with pytest.raises(client.ApiException) as refused:
        _evict(core, namespace, f"{NAME}-1")
    assert refused.value.status == 429, refused.value.body
    assert "disruption budget" in refused.value.body
    eventually(lambda: sim.record(namespace, f"{NAME}-0").incarnations == 2 and allowed() == 1, timeout=180)
    _evict(core, namespace, f"{NAME}-1")  # the first is back and Ready: the next may go
    sim.wait_ready(namespace, NAME, 2, timeout=180)
