"""The real LeaderWorkerSet controller (v0.9.0) under the session's control plane, with kubelet stand-ins.

It builds groups from LeaderWorkerSets (leader StatefulSet, one worker StatefulSet per group, a headless Service),
its pod webhook gives the pods their index labels and LWS_* env, workers resolve the leader by its DNS name (the
stand-in's cluster DNS), each pod gets its own claim from the claim templates, and a worker's restart recreates
its whole group (RecreateGroupOnPodRestart).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.devcluster import DevCluster, ensure_lws_built, lws
from harness.sim.cluster import SimCluster
from harness.sim.dns import lookup, records
from harness.sim.images import built  # the pods run from an image: the local Debian base has python3

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
# A leader answers /health on 8080 and records what it sees; a worker resolves the leader, calls it, then serves.
POD = r"""
import http.server, json, os, socket, threading, time, urllib.request
env = {k: v for k, v in os.environ.items() if k.startswith("LWS_")}
seen = sorted(os.listdir("/cache"))
open(f"/cache/boot.{os.environ['HOSTNAME']}.{len(seen)}", "w").close()
if env["LWS_WORKER_INDEX"] != "0":
    # The leader may still be starting (LeaderCreated): wait for it, as a rendezvous does, instead of exiting,
    # which RecreateGroupOnPodRestart would answer by recreating the whole group again.
    for attempt in range(600):
        try:
            ip = socket.gethostbyname(env["LWS_LEADER_ADDRESS"])
            env["leader_says"] = urllib.request.urlopen(f"http://{ip}:8080/health", timeout=5).read().decode()
            break
        except OSError:
            time.sleep(0.1)
    env["leader_ip"] = ip
print(json.dumps({"env": env, "seen": seen}), flush=True)
def crash_on_request():
    while not os.path.exists("/cache/crash"):
        time.sleep(0.1)
    os.remove("/cache/crash")
    os._exit(3)
threading.Thread(target=crash_on_request, daemon=True).start()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(os.environ["HOSTNAME"].encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def lws_object(name: str, replicas: int = 2, size: int = 2) -> dict:
    container = {
        "name": "main", "image": built("base", log=lambda _: None).pinned, "command": ["python3", "-c", POD],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    }  # fmt: skip
    template = {"spec": {"containers": [container], "terminationGracePeriodSeconds": 5}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": template,
                "volumeClaimTemplates": [{"metadata": {"name": "cache"}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            },
        },
    }  # fmt: skip


# ---- unit tests: the objects built from the module's own files ----


def test_webhooks_point_at_the_local_server_and_keep_upstreams_rules() -> None:
    build = ensure_lws_built(log=lambda _: None)
    configs = {c["kind"]: c for c in lws.webhook_configurations(build, "https://127.0.0.1:9", b"CA")}
    mutating, validating = configs["MutatingWebhookConfiguration"], configs["ValidatingWebhookConfiguration"]
    hooks = {h["name"]: h for c in configs.values() for h in c["webhooks"]}
    assert set(hooks) >= {"mleaderworkerset.kb.io", "mpod.kb.io", "vleaderworkerset.kb.io", "vpod.kb.io"}
    assert hooks["mpod.kb.io"]["clientConfig"] == {"url": "https://127.0.0.1:9/mutate--v1-pod",
                                                   "caBundle": base64.b64encode(b"CA").decode()}  # fmt: skip
    for name in ("mpod.kb.io", "vpod.kb.io"):  # config/webhook's kustomize patches: only LWS pods
        selector = hooks[name]["objectSelector"]["matchExpressions"]
        assert selector == [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
    assert all(h["failurePolicy"] == "Fail" for h in hooks.values())
    assert mutating["metadata"]["name"] == "lws-mutating-webhook-configuration"
    assert validating["metadata"]["name"] == "lws-validating-webhook-configuration"


def test_dns_publishes_pods_of_a_headless_service_by_hostname_and_subdomain() -> None:
    def pod(name: str, ready: bool, ns: str = "a", deleting: bool = False) -> dict:
        meta = {"name": name, "namespace": ns, "labels": {"app": "x"}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"hostname": name, "subdomain": "svc1"},
                "status": {"podIP": f"127.9.0.{len(name)}",
                           "conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip

    def service(publish: bool, cluster_ip: str = "None") -> dict:
        return {"metadata": {"name": "svc1", "namespace": "a"},
                "spec": {"clusterIP": cluster_ip, "selector": {"app": "x"}, "publishNotReadyAddresses": publish}}

    pods = [pod("p", True), pod("pp", False), pod("ppp", True, deleting=True), pod("q", True, ns="b")]
    assert records(pods, [service(False)]) == {"p.svc1.a": "127.9.0.1"}
    assert records(pods, [service(True)]) == {"p.svc1.a": "127.9.0.1", "pp.svc1.a": "127.9.0.2"}
    assert records(pods, [service(True, cluster_ip="10.0.0.1")]) == {}
    table = records(pods, [service(True)])
    for name in ("p.svc1.a", "p.svc1.a.svc", "p.svc1.a.svc.cluster.local", "p.svc1.a.svc.cluster.local."):
        assert lookup(table, name, "z") == "127.9.0.1"
    assert lookup(table, "p.svc1", "a") == "127.9.0.1"  # the pod's own namespace is first on its search path
    assert lookup(table, "p.svc1", "b") is None


# ---- integration: the controller itself ----


@pytest.fixture
def lws_sim(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[SimCluster]:
    with SimCluster(kube_api, tmp_path / "volumes", namespace, nodes=2, max_grace_seconds=5) as sim:
        yield sim


def _pods(core: client.CoreV1Api, ns: str) -> dict[str, client.V1Pod]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(ns).items if not p.metadata.deletion_timestamp}


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _report(sim: SimCluster, ns: str, pod: str) -> dict:
    live = sim.pods[(ns, pod)]
    log = (live.procs.run_dir / "main.log").read_text()
    return json.loads(log.splitlines()[0])


@pytest.mark.integration
def test_the_manager_runs_from_the_cache_with_its_crds(devcluster: DevCluster, kube_api: client.ApiClient) -> None:
    assert devcluster._procs["lws-manager"].poll() is None
    ext = client.ApiextensionsV1Api(kube_api)
    for crd in lws.CRDS:
        name = yaml.safe_load(ensure_lws_built(log=lambda _: None).file(crd).read_text())["metadata"]["name"]
        conds = {c.type: c.status for c in ext.read_custom_resource_definition(name).status.conditions}
        assert conds["Established"] == "True"


@pytest.mark.integration
def test_groups_get_their_labels_env_dns_and_own_claims(
    kube_api: client.ApiClient, namespace: str, lws_sim: SimCluster
) -> None:
    core, custom = client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, lws_object("sgl"))
    names = ["sgl-0", "sgl-0-1", "sgl-1", "sgl-1-1"]
    lws_sim.wait_for(lambda: all(_ready(p) for p in _pods(core, namespace).values())
                     and sorted(_pods(core, namespace)) == names, 90, "4 ready pods of 2 groups")  # fmt: skip
    pods = _pods(core, namespace)
    assert {n: pods[n].metadata.labels[INDEX] for n in names} == {"sgl-0": "0", "sgl-0-1": "1", "sgl-1": "0",
                                                                 "sgl-1-1": "1"}  # fmt: skip
    worker = _report(lws_sim, namespace, "sgl-1-1")
    assert worker["env"]["LWS_LEADER_ADDRESS"] == f"sgl-1.sgl.{namespace}"
    assert worker["env"]["LWS_GROUP_SIZE"] == "2" and worker["env"]["LWS_WORKER_INDEX"] == "1"
    assert worker["env"]["leader_ip"] == pods["sgl-1"].status.pod_ip
    assert worker["env"]["leader_says"] == "sgl-1"  # it reached its own group's leader, by name
    claims = sorted(c.metadata.name for c in core.list_namespaced_persistent_volume_claim(namespace).items)
    assert claims == [f"cache-{n}" for n in names]


@pytest.mark.integration
def test_a_worker_restart_recreates_its_group_on_the_same_claims(
    kube_api: client.ApiClient, namespace: str, lws_sim: SimCluster
) -> None:
    core, custom = client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, lws_object("g", replicas=1))
    lws_sim.wait_for(lambda: len(p := _pods(core, namespace)) == 2 and all(map(_ready, p.values())), 90, "group 0")
    before = {n: p.metadata.uid for n, p in _pods(core, namespace).items()}
    (lws_sim.pvc_dir(namespace, "cache-g-0-1") / "crash").touch()  # the worker's container exits 3
    lws_sim.wait_for(lambda: len(p := _pods(core, namespace)) == 2 and all(map(_ready, p.values()))
                     and all(p[n].metadata.uid != before[n] for n in before), 120, "group 0 recreated")  # fmt: skip
    reasons = {e.reason for e in core.list_namespaced_event(namespace).items}
    assert "RecreateGroup" in reasons, reasons
    worker = _report(lws_sim, namespace, "g-0-1")
    assert {f.split(".")[1] for f in worker["seen"] if f.startswith("boot.")} == {"g-0-1"}  # its own claim, kept
    assert len([f for f in worker["seen"] if f.startswith("boot.")]) >= 1
    bad = lws_object("bad")
    bad["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] = {"maxUnavailable": 0, "maxSurge": 0}
    with pytest.raises(ApiException) as err:  # the LWS validating webhook is live
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, bad)
    assert "must not be 0 when `maxSurge` is 0" in err.value.body
