"""The kubelet stand-in's node side under the real control plane: registration and heartbeats, service-account
credentials through the real TokenRequest API (RBAC enforced), crash-loop back-off with the container's last
message, images without a stand-in, and a lost node tainted and its pods evicted by the real controllers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.sim.cluster import SimCluster
from harness.sim.images import built

pytestmark = pytest.mark.integration
WHOAMI = """
from kubernetes import client, config
config.load_incluster_config()  # the token, CA and namespace files at the real in-cluster paths
api = client.ApiClient()
review = client.AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1",
                                                                     "kind": "SelfSubjectReview"})
print("user", review.status.user_info.username, flush=True)
ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
print("pods", len(client.CoreV1Api(api).list_namespaced_pod(ns).items), flush=True)
try:
    client.CoreV1Api(api).list_namespaced_secret(ns)
except client.ApiException as exc:
    print("secrets", exc.status, flush=True)
import time; time.sleep(300)
"""


@pytest.fixture(scope="module")
def shell() -> str:
    """Any image with a shell: the local Debian base (harness.images)."""
    return built("base").pinned


@pytest.fixture
def nodes(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[SimCluster]:
    with SimCluster(kube_api, tmp_path / "volumes", namespace, backoff_seconds=1) as sim:
        yield sim


def _pod(name: str, image: str, command: list[str], **spec: object) -> dict:
    container = {"name": "main", "image": image, "command": command,
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
    return {"metadata": {"name": name}, "spec": {"containers": [container], "terminationGracePeriodSeconds": 2, **spec}}


def _status(core: client.CoreV1Api, ns: str, name: str) -> client.V1ContainerStatus | None:
    statuses = core.read_namespaced_pod(name, ns).status.container_statuses or []
    return statuses[0] if statuses else None


def test_nodes_are_ready_with_gpu_capacity(nodes: SimCluster, kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)

    def ready() -> bool:
        objs = [core.read_node(n) for n in nodes.node_names]
        return all(any(c.type == "Ready" and c.status == "True" for c in o.status.conditions) and not o.spec.taints
                   for o in objs)  # fmt: skip

    nodes.wait_for(ready, 30, "nodes Ready and untainted by the node lifecycle controller")
    node = core.read_node(nodes.node_names[0])
    assert node.status.allocatable["nvidia.com/gpu"] == "8" and node.metadata.labels["nvidia.com/gpu.present"] == "true"


def test_operator_image_runs_with_its_service_account_token(
    nodes: SimCluster, kube_api: client.ApiClient, namespace: str
) -> None:
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})  # fmt: skip
    core.create_namespaced_pod(namespace, _pod("op", built("operator").pinned,
                                               ["python", "-c", WHOAMI], serviceAccountName="reader"))
    log = nodes.wait_for(lambda: nodes.pods.get((namespace, "op")), 30, "pod started").procs.run_dir / "main.log"
    nodes.wait_for(lambda: log.exists() and "secrets" in log.read_text(), 60, f"the pod's output in {log}")
    out = log.read_text()
    assert f"user system:serviceaccount:{namespace}:reader" in out and "pods 1" in out
    assert "secrets 403" in out  # RBAC is enforced: nothing beyond the Role


def test_crash_loop_back_off_reports_the_last_message(
    shell: str, nodes: SimCluster, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_pod(namespace, _pod("crash", shell, ["sh", "-c", "echo out of memory >&2; exit 7"]))

    def looping() -> client.V1ContainerStatus | None:
        st = _status(core, namespace, "crash")
        return st if st and st.restart_count >= 2 and st.state.waiting else None

    st = nodes.wait_for(looping, 30, "two restarts")
    assert st.state.waiting.reason == "CrashLoopBackOff"
    assert st.last_state.terminated.exit_code == 7 and "out of memory" in st.last_state.terminated.message
    core.create_namespaced_pod(namespace, _pod("unknown", "example.com/some/other:1", ["/app"]))
    def pull_error() -> client.V1ContainerStatus | None:
        st = _status(core, namespace, "unknown")
        return st if st and st.state.waiting and st.state.waiting.reason == "ErrImagePull" else None

    message = nodes.wait_for(pull_error, 30, "ErrImagePull").state.waiting.message
    assert 'image "example.com/some/other:1" is not in the node\'s image store' in message and "make images" in message


def test_lost_node_is_tainted_and_its_pod_evicted(
    shell: str, nodes: SimCluster, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    target = nodes.node_names[0]
    pod = _pod("victim", shell, ["sh", "-c", "sleep 300"], nodeSelector={"kubernetes.io/hostname": target})
    core.create_namespaced_pod(namespace, pod)
    nodes.wait_for(lambda: nodes.pods.get((namespace, "victim")) and nodes.pods[(namespace, "victim")].ready, 30,
                   "victim running")  # fmt: skip
    assert nodes.lose_node(target) == ["victim"]

    def tainted() -> bool:
        taints = core.read_node(target).spec.taints or []
        return any(t.key == "node.kubernetes.io/unreachable" and t.effect == "NoExecute" for t in taints)

    nodes.wait_for(tainted, 120, "the node lifecycle controller's unreachable taint")
    ready = next(c for c in core.read_node(target).status.conditions if c.type == "Ready")
    assert ready.status == "Unknown" and ready.reason == "NodeStatusUnknown"
    # the taint-eviction controller deletes it once the 5 s default toleration runs out; no kubelet confirms it
    nodes.wait_for(lambda: core.read_namespaced_pod("victim", namespace).metadata.deletion_timestamp, 120, "eviction")
