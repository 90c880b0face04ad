"""The node stand-in under the real control plane: the real StatefulSet controller, scheduler and PV controller
create and place pods and claims; SimCluster runs them (preStop, warm recreation, retention, init failures)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.sim.cluster import SimCluster
from harness.sim.images import example_runtime_image

pytestmark = pytest.mark.integration

RUNTIME = example_runtime_image()  # served by the built runtime image with the engine stand-in (harness.sim.images)
MANAGED = {"app.kubernetes.io/managed-by": "qwen-hicache-operator", "app.kubernetes.io/instance": "demo"}
FP = "fp0123"
PREFLIGHT = 'test ! -e /var/cache/hicache/BAD || { echo "bad marker" >&2; exit 3; }; mkdir -p /var/cache/hicache/' + FP
PRESTOP = (
    "import os, urllib.request\n"
    "host = os.environ.get('QWEN_HICACHE_POD_HOST', '127.0.0.1')\n"
    "req = urllib.request.Request(f'http://{host}:30000/flush_cache?timeout=30', method='POST',\n"
    "    headers={'Authorization': 'Bearer ' + os.environ['QWEN_HICACHE_ADMIN_API_KEY']})\n"
    "print(urllib.request.urlopen(req).read().decode())\n"
)


def statefulset(replicas: int) -> dict:
    """Shaped like the operator's rendering (qwen_hicache.render.get_statefulset)."""
    container = {
        "name": "sglang",
        "image": RUNTIME,
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", "/models/m", "--served-model-name", "qwen-sim", "--host", "0.0.0.0",
                 "--port", "30000", "--tp-size", "2", "--page-size", "64", "--enable-hierarchical-cache",
                 "--hicache-storage-backend", "file", "--enable-metrics", "--enable-cache-report",
                 "--admin-api-key=$(QWEN_HICACHE_ADMIN_API_KEY)"],
        "env": [{"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "value": f"/var/cache/hicache/{FP}"},
                {"name": "QWEN_HICACHE_ADMIN_API_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "demo-admin", "key": "key"}}}],
        "ports": [{"name": "http", "containerPort": 30000}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "model", "mountPath": "/models"},
                         {"name": "hicache", "mountPath": "/var/cache/hicache"}],
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", PRESTOP]}}},
    }  # fmt: skip
    init = {"name": "preflight", "image": RUNTIME, "command": ["sh", "-c", PREFLIGHT],
            "volumeMounts": [{"name": "hicache", "mountPath": "/var/cache/hicache"}]}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo", "labels": MANAGED},
        "spec": {
            "replicas": replicas,
            "serviceName": "demo-headless",
            "selector": {"matchLabels": {"app.kubernetes.io/instance": "demo"}},
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "template": {
                "metadata": {"labels": MANAGED, "annotations": {"qwenhicache.io/render-version": "1"}},
                "spec": {"containers": [container], "initContainers": [init], "terminationGracePeriodSeconds": 30,
                         "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "weights"}}]},
            },
            "volumeClaimTemplates": [{"metadata": {"name": "hicache", "labels": MANAGED},
                                      "spec": {"accessModes": ["ReadWriteOnce"],
                                               "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }  # fmt: skip


@pytest.fixture
def sim(kube_api: client.ApiClient, namespace: str, tmp_path: Path, sglang_tree: Path) -> Iterator[SimCluster]:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "demo-admin"}, "stringData": {"key": "k3y"}})
    with SimCluster(kube_api, tmp_path / "volumes", namespace, max_grace_seconds=10) as harness:
        harness.weights_claim(namespace, "weights")
        yield harness


def prestop_failures(core: client.CoreV1Api, namespace: str, pod: str) -> list:
    """The FailedPreStopHook events on `pod`."""
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items
    return [e for e in events if e.reason == "FailedPreStopHook"]


def post(ip: str, path: str, body: dict | None = None, key: str | None = None) -> dict | str:
    req = urllib.request.Request(f"http://{ip}:30000{path}", data=json.dumps(body or {}).encode(), method="POST")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return json.loads(text) if path == "/generate" else text


def generate(ip: str, text: str) -> dict:
    return post(ip, "/generate", {"text": text})["meta_info"]["cached_tokens_details"]


def test_pods_claims_prestop_and_warm_recreation(sim: SimCluster, kube_api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    apps.create_namespaced_stateful_set(namespace, statefulset(2))
    assert sim.wait_ready(namespace, "demo", 2) == ["demo-0", "demo-1"]
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    ips = {p.status.pod_ip for p in pods.values()}
    assert len(ips) == 2 and all(ip.startswith("127.") for ip in ips)
    assert all(p.status.phase == "Running" and p.metadata.labels["statefulset.kubernetes.io/pod-name"] == n
               for n, p in pods.items())  # fmt: skip
    sim.wait_for(lambda: (apps.read_namespaced_stateful_set(namespace=namespace, name="demo").status.ready_replicas
                          == 2), 10, "readyReplicas")  # fmt: skip
    pvc_dir = sim.pvc_dir(namespace, "hicache-demo-0")
    assert (pvc_dir / FP).is_dir()  # the init container ran with the claim mounted at its host dir

    ip0 = sim.pod_ip(namespace, "demo-0")
    prompt = "warm restarts keep the prefix. " * 20
    generate(ip0, prompt)
    assert generate(ip0, prompt)["device"] > 0
    core.delete_namespaced_pod("demo-0", namespace, _preload_content=False)
    sim.wait_for(lambda: sim.history[f"{namespace}/demo-0"].incarnations == 2 and
                 sim.ready_pods(namespace, "demo") == ["demo-0", "demo-1"], 20, "demo-0 recreated")  # fmt: skip
    record = sim.history[f"{namespace}/demo-0"]
    assert record.prestop_ran and record.prestop_exit_codes == [0], record.prestop_output
    assert "Cache flushed" in record.prestop_output[0]
    assert record.exit_codes == [0] and record.starts == 2 and record.sigkilled == 0
    assert sim.pvc_dir(namespace, "hicache-demo-0") == pvc_dir
    assert not prestop_failures(core, namespace, "demo-0")  # a hook that exited 0
    assert generate(sim.pod_ip(namespace, "demo-0"), prompt)["storage"] > 0  # pages survived the restart


def test_a_failing_prestop_gets_the_kubelets_warning(sim: SimCluster, kube_api: client.ApiClient,
                                                     namespace: str) -> None:  # fmt: skip
    """As the kubelet: FailedPreStopHook (Warning, on the container, without the hook's output), then SIGTERM."""
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    sts = statefulset(1)
    sts["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] = [
        "sh", "-c", "echo flush: 400 secret-token; exit 1"]  # fmt: skip
    apps.create_namespaced_stateful_set(namespace, sts)
    sim.wait_ready(namespace, "demo", 1)
    uid = core.read_namespaced_pod("demo-0", namespace).metadata.uid
    core.delete_namespaced_pod("demo-0", namespace, _preload_content=False)
    events = sim.wait_for(lambda: prestop_failures(core, namespace, "demo-0"), 20, "FailedPreStopHook")
    record = sim.history[f"{namespace}/demo-0"]
    assert record.prestop_exit_codes == [1] and "secret-token" in record.prestop_output[0]
    (event,) = events
    ref = event.involved_object
    assert (event.type, event.message, event.source.component) == ("Warning", "PreStopHook failed", "kubelet")
    assert (ref.kind, ref.uid, ref.field_path) == ("Pod", uid, "spec.containers{sglang}")
    assert event.source.host in sim.node_names
    sim.wait_for(lambda: record.exit_codes, 20, "engine stopped")
    assert record.exit_codes == [0] and record.sigkilled == 0  # SIGTERM followed as after a success


def test_scale_down_and_delete_keep_retained_claims(
    sim: SimCluster, kube_api: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    apps.create_namespaced_stateful_set(namespace, statefulset(2))
    sim.wait_ready(namespace, "demo", 2)
    apps.patch_namespaced_stateful_set("demo", namespace, {"spec": {"replicas": 1}})
    sim.wait_for(lambda: sim.ready_pods(namespace, "demo") == ["demo-0"] and (namespace, "demo-1") not in sim.pods,
                 20, "scale down")  # fmt: skip
    assert sim.history[f"{namespace}/demo-1"].prestop_ran
    apps.delete_namespaced_stateful_set("demo", namespace, _preload_content=False)
    sim.wait_for(lambda: not [k for k in sim.pods if k[0] == namespace], 30, "pods gone after the set")  # real GC
    claims = {c.metadata.name: c for c in core.list_namespaced_persistent_volume_claim(namespace).items}
    claims.pop("weights")
    assert set(claims) == {"hicache-demo-0", "hicache-demo-1"}
    assert all(not c.metadata.owner_references and c.status.phase == "Bound" for c in claims.values())


def test_failing_init_container_blocks_the_engine(sim: SimCluster, kube_api: client.ApiClient, namespace: str,
                                                   tmp_path: Path) -> None:  # fmt: skip
    bad = tmp_path / "volumes" / namespace / "hicache-demo-0"
    bad.mkdir(parents=True)
    (bad / "BAD").write_text("x")
    client.AppsV1Api(kube_api).create_namespaced_stateful_set(namespace, statefulset(1))
    record = sim.wait_for(lambda: sim.history.get(f"{namespace}/demo-0"), 10, "pod record")
    sim.wait_for(lambda: record.init_failures, 10, "init failure")

    def terminated() -> object:
        pod = client.CoreV1Api(kube_api).read_namespaced_pod("demo-0", namespace)
        statuses = pod.status.init_container_statuses or []
        return statuses and statuses[0].state.terminated and pod  # the record is written before the status

    pod = sim.wait_for(terminated, 10, "init container status")
    term = pod.status.init_container_statuses[0].state.terminated
    assert pod.status.phase == "Pending" and term.exit_code == 3 and "bad marker" in term.message
    assert record.starts == 0
