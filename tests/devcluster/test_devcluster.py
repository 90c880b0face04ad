"""The local API server is a real Kubernetes API server: validation, apply, watch, GC, real CLIs."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubehelpers import eventually
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from harness.demo import install_crd
from harness.devcluster import (
    BuildError,
    DevCluster,
    build,
    ensure_built,
    ensure_helm,
    ensure_kubectl,
    free_ports,
    write_kubeconfig,
)

GROUP, VERSION, PLURAL = "devcluster.example.com", "v1", "probes"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "probe", "kind": "Probe", "listKind": "ProbeList"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["replicas"],
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer"},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.replicas <= self.maxReplicas",
                                        "message": "replicas above max",
                                    }
                                ],
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}

integration = pytest.mark.integration


def probe(name: str, replicas: object = 1, max_replicas: int = 3) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Probe",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "maxReplicas": max_replicas},
    }


def exists(read: Callable[[], object]) -> bool:
    try:
        read()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.fixture(scope="module")
def crd(kube_api: client.ApiClient) -> Iterator[None]:
    install_crd(kube_api, CRD)
    yield


@pytest.fixture
def crs(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


# ---- unit tests: no server needed ----


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_kubeconfig_verifies_the_server_with_a_ca(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / n for n in ("ca.crt", "admin.crt", "admin.key"))
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1234", ca, cert, key, namespace="ns1")
    doc = yaml.safe_load(path.read_text())
    cluster = doc["clusters"][0]["cluster"]
    assert cluster == {"server": "https://127.0.0.1:1234", "certificate-authority": str(ca)}
    assert doc["users"][0]["user"] == {"client-certificate": str(cert), "client-key": str(key)}
    loader = config.kube_config.KubeConfigLoader(config_dict=doc)
    assert loader.current_context["context"]["namespace"] == "ns1"


def test_failed_build_raises_with_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "go"
    (src / "etcd").mkdir(parents=True)
    (src / "go.mod").write_text("module broken.local/kube\n\ngo 1.26.0\n")
    (src / "etcd" / "main.go").write_text("package main\n\nfunc main() { undefinedCall() }\n")
    monkeypatch.setattr(build, "GO_DIR", src)
    monkeypatch.setattr(build, "PACKAGES", {"etcd": "./etcd"})
    seen: list[str] = []
    with pytest.raises(BuildError) as err:
        ensure_built(tmp_path / "cache", log=seen.append)
    assert "go build exit status 1" in str(err.value)
    assert "undefined: undefinedCall" in str(err.value)
    assert str(tmp_path / "cache") in str(err.value)  # names the log file
    assert any("building Kubernetes v1.36.3" in line for line in seen)


def test_built_binaries_are_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    bins = build.binaries(cache)
    for path in vars(bins).values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    (bins.etcd.parent / ".verified").write_text("ok\n")
    monkeypatch.setattr(build, "_build", lambda *a: pytest.fail("rebuilt although cached"))
    assert ensure_built(cache, log=lambda m: None) == bins


def test_a_binary_of_another_version_is_refused(tmp_path: Path) -> None:
    for name, line in (*((n, f"Kubernetes {build.KUBERNETES_VERSION}") for n in build.PACKAGES),
                       ("etcd", "etcd Version: 3.5.1")):  # fmt: skip
        (tmp_path / name).write_text(f"#!/bin/sh\necho '{line}'\n")
        (tmp_path / name).chmod(0o755)
    with pytest.raises(BuildError, match="expected 'etcd Version: 3.6.8'"):
        build._verify(tmp_path, tmp_path / "log")


@integration
def test_the_cached_binaries_report_the_pinned_versions(devcluster: DevCluster) -> None:
    bins = ensure_built(log=lambda m: None)
    for name, path in (("kube-apiserver", bins.apiserver), ("kube-controller-manager", bins.controller_manager),
                       ("kube-scheduler", bins.scheduler)):  # fmt: skip
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
        assert out.strip() == f"Kubernetes {build.KUBERNETES_VERSION}", name
    out = subprocess.run([str(bins.etcd), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert f"etcd Version: {build.ETCD_VERSION}" in out


# ---- integration tests: a real server ----


@integration
def test_crd_schema_and_cel_validation(crd: None, crs: client.CustomObjectsApi, namespace: str) -> None:
    with pytest.raises(ApiException) as err:
        crs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe("cel", 5, 3))
    assert err.value.status == 422 and "replicas above max" in err.value.body
    with pytest.raises(ApiException) as err:
        crs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe("schema", "two"))
    assert err.value.status == 422 and "spec.replicas" in err.value.body and "integer" in err.value.body
    obj = crs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe("good"))
    assert obj["metadata"]["generation"] == 1


@integration
def test_status_subresource_does_not_bump_generation(
    crd: None, crs: client.CustomObjectsApi, namespace: str
) -> None:
    crs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe("st"))
    patched = crs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "st", {"status": {"phase": "Ready"}}
    )
    assert patched["status"] == {"phase": "Ready"} and patched["metadata"]["generation"] == 1


@integration
def test_server_side_apply_is_idempotent(kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}}

    def apply() -> str:
        obj = core.patch_namespaced_config_map(
            "ssa", namespace, body, field_manager="test", _content_type="application/apply-patch+yaml"
        )
        return obj.metadata.resource_version

    first = apply()
    assert apply() == first
    body["data"] = {"a": "2"}
    assert apply() != first


@integration
def test_watch_sees_a_created_object(kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    start_rv = core.list_namespaced_config_map(namespace).metadata.resource_version
    threading.Timer(
        0.5, lambda: core.create_namespaced_config_map(namespace, {"metadata": {"name": "w"}})
    ).start()
    stream = watch.Watch().stream(
        core.list_namespaced_config_map, namespace, resource_version=start_rv, timeout_seconds=10
    )
    events = [(e["type"], e["object"].metadata.name) for e in stream]
    assert ("ADDED", "w") in events


def _owned_children(kube_api: client.ApiClient, namespace: str, owner: dict) -> list[Callable[[], object]]:
    """A ConfigMap, Service and StatefulSet owned by `owner`; returns readers for each."""
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = {"name": "child", "ownerReferences": [ref]}
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    core.create_namespaced_config_map(namespace, {"metadata": meta})
    core.create_namespaced_service(namespace, {"metadata": meta, "spec": {"ports": [{"port": 80}]}})
    pod = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    sts_spec = {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "child", "template": pod}
    apps.create_namespaced_stateful_set(namespace, {"metadata": meta, "spec": sts_spec})
    return [
        lambda: core.read_namespaced_config_map("child", namespace),
        lambda: core.read_namespaced_service("child", namespace),
        lambda: apps.read_namespaced_stateful_set("child", namespace),
    ]


@integration
@pytest.mark.parametrize("policy", ["Background", "Foreground"])
def test_owned_children_are_garbage_collected(
    kube_api: client.ApiClient, crd: None, crs: client.CustomObjectsApi, namespace: str, policy: str
) -> None:
    owner = crs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe("owner"))
    readers = _owned_children(kube_api, namespace, owner)
    core = client.CoreV1Api(kube_api)
    pvc = {"metadata": {"name": "data"},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    core.create_namespaced_persistent_volume_claim(namespace, pvc)  # no owner reference: must survive
    time.sleep(1.5)  # a GC pass or more with the owner alive must keep the children
    assert all(exists(r) for r in readers)

    crs.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owner", propagation_policy=policy)
    # The garbage collector watches a resource type from its discovery sync on, every 30 s in
    # kube-controller-manager: an owner of a CRD installed since then waits for the next one.
    gc = 45.0
    eventually(
        lambda: (
            not exists(lambda: crs.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owner"))
        ),
        timeout=gc,
    )
    eventually(lambda: not any(exists(r) for r in readers), timeout=gc)
    assert exists(lambda: core.read_namespaced_persistent_volume_claim("data", namespace))


@integration
def test_deleting_a_namespace_removes_its_contents(kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    ns = f"gone-{time.monotonic_ns() % 10**8}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "left"}})
    time.sleep(1.5)  # let the server's GC see the namespace alive
    core.delete_namespace(ns)
    eventually(lambda: not exists(lambda: core.read_namespaced_config_map("left", ns)))


@integration
def test_nodes_and_pod_disruption_budgets_are_served(kube_api: client.ApiClient, namespace: str) -> None:
    core, policy = client.CoreV1Api(kube_api), client.PolicyV1Api(kube_api)
    node = {"metadata": {"name": f"node-{namespace}"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}
    core.create_node(node)
    core.patch_node_status(node["metadata"]["name"], {"status": node["status"]})
    assert core.read_node(node["metadata"]["name"]).status.capacity == {"nvidia.com/gpu": "8"}
    core.delete_node(node["metadata"]["name"])
    pdb = {"metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}}}
    policy.create_namespaced_pod_disruption_budget(namespace, pdb)
    assert policy.read_namespaced_pod_disruption_budget("pdb", namespace).spec.min_available == 1


@integration
def test_kubectl_get(devcluster: DevCluster, kube_api: client.ApiClient, namespace: str) -> None:
    client.CoreV1Api(kube_api).create_namespaced_config_map(namespace, {"metadata": {"name": "k"}})
    res = subprocess.run(
        [str(ensure_kubectl()), "get", "configmaps", "-n", namespace, "-o", "name"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KUBECONFIG": str(devcluster.kubeconfig), "HOME": str(devcluster.run_dir)},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["configmap/k", "configmap/kube-root-ca.crt"]  # the latter: root-CA publisher


@integration
def test_helm_installs_a_chart(
    devcluster: DevCluster, kube_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    helm = str(ensure_helm())
    env = {"KUBECONFIG": str(devcluster.kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    version = subprocess.run(
        [helm, "version", "--short"], capture_output=True, text=True, env=env, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("v4."), version
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-helm}\ndata: {x: {{ .Values.x | quote }}}\n"
    )
    (chart / "values.yaml").write_text("x: hello\n")
    res = subprocess.run(
        [helm, "install", "rel", str(chart), "-n", namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("from-helm", namespace)
    assert cm.data == {"x": "hello"}


@integration
def test_built_in_kinds_are_validated_as_a_real_cluster_does(kube_api: client.ApiClient, namespace: str) -> None:
    """What the old stand-in stored and a real cluster refuses: now refused here too."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_service(namespace, {"metadata": {"name": "not.a.label"},
                                                   "spec": {"ports": [{"port": 80}]}})  # fmt: skip
    assert err.value.status == 422 and "metadata.name" in err.value.body
    sts = {"metadata": {"name": "s"}, "spec": {
        "selector": {"matchLabels": {"a": "b"}}, "serviceName": "s",
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "d"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}  # fmt: skip
    apps.create_namespaced_stateful_set(namespace, sts)
    grown = {"spec": {"volumeClaimTemplates": [{"metadata": {"name": "d"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}}]}}  # fmt: skip
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_stateful_set("s", namespace, grown)
    assert err.value.status == 422 and "Forbidden" in err.value.body
    bad_toleration = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                      "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}  # fmt: skip
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, bad_toleration)
    assert err.value.status == 422


@integration
def test_rbac_is_enforced_for_other_identities(devcluster: DevCluster, namespace: str) -> None:
    kubeconfig = devcluster.add_user("someone", groups=("team-a",))
    api = config.new_client_from_config(config_file=str(kubeconfig))
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_pod(namespace)
    assert err.value.status == 403
    admin = config.new_client_from_config(config_file=str(devcluster.kubeconfig))
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "r"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": "r"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}]})  # fmt: skip
    eventually(lambda: client.CoreV1Api(api).list_namespaced_pod(namespace).items == [])


@integration
def test_a_component_that_exits_is_started_again(devcluster: DevCluster) -> None:
    """As the kubelet restarts static pods: the scheduler exits by design when its cache turns inconsistent."""
    old = devcluster._procs["kube-scheduler"]
    old.kill()
    eventually(lambda: (new := devcluster._procs.get("kube-scheduler")) is not None and new is not old
               and new.poll() is None, timeout=30)  # fmt: skip
