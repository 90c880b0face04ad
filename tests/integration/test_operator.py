"""The operator against a real API server: schema rejection, children, status, updates, no-op, deletion."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from kubehelpers import condition, eventually, get_server
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from qwen_hicache import reconciler
from qwen_hicache.constants import MANAGER
from qwen_hicache.kube import Kube
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import BAD_SPECS, example, variant

from harness.devcluster import ensure_kubectl

pytestmark = pytest.mark.integration
NAME = "flash-next"


def _create(custom: client.CustomObjectsApi, ns: str, doc: dict) -> dict:
    doc["metadata"]["namespace"] = ns
    return custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc, field_validation="Strict")


def _sts(kube_api: client.ApiClient, ns: str, name: str = NAME) -> Any:
    return client.AppsV1Api(kube_api).read_namespaced_stateful_set(name, ns)


def _observed(custom: client.CustomObjectsApi, ns: str, name: str = NAME) -> dict | None:
    obj = get_server(custom, ns, name)
    status = obj.get("status") or {}
    return obj if status.get("observedGeneration") == obj["metadata"]["generation"] else None


@pytest.mark.parametrize(("case", "changes", "fragment"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_server_rejects_bad_specs_like_pydantic(
    crd: None, custom: client.CustomObjectsApi, namespace: str, case: str, changes: dict, fragment: str
) -> None:
    with pytest.raises(ApiException) as err:
        _create(custom, namespace, variant(**changes))
    assert err.value.status in (400, 422), err.value.body  # 400: strict decoding of an unknown field
    assert fragment in err.value.body


def test_server_applies_schema_defaults(crd: None, custom: client.CustomObjectsApi, namespace: str) -> None:
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "QwenHiCacheServer", "metadata": {"name": "tiny"},
           "spec": {"model": {"weights": {"claimName": "w"}, "servedName": "m", "revision": "abcdef0"},
                    "runtime": {"image": "img"}}}
    created = _create(custom, namespace, doc)
    assert created["spec"]["hicache"]["writePolicy"] == "write_through"
    assert created["spec"]["runtime"]["pageSize"] == 64 and created["spec"]["replicas"] == 1


def test_valid_resource_gets_children_status_and_events(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    created = _create(custom, namespace, example())
    obj = eventually(lambda: _observed(custom, namespace))
    assert condition(obj, "SpecValid")["status"] == "True"
    assert condition(obj, "SizingValid")["status"] == "True"
    assert condition(obj, "Ready")["reason"] == "ReplicasNotReady"  # no kubelet here: pods never run
    assert obj["status"]["sizing"]["hostKVTokensPerRank"] > 0
    assert "--enable-hierarchical-cache" in obj["status"]["launch"]["args"]
    sts = _sts(kube_api, namespace)
    assert sts.spec.update_strategy.type == "OnDelete"
    assert sts.metadata.owner_references[0].uid == created["metadata"]["uid"]
    limits = sts.spec.template.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "2" and limits["memory"] == str(obj["status"]["sizing"]["podMemoryLimitBytes"])
    services = client.CoreV1Api(kube_api).list_namespaced_service(namespace).items
    # the client Service, the pods' headless Service, and (replicas > 1: spec.router on) the router's own Service
    assert {s.metadata.name for s in services} == {NAME, f"{NAME}-headless", f"{NAME}-router"}
    events = eventually(lambda: [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
                                 if e.involved_object.name == NAME])
    accepted = [e for e in events if e.reason == "Accepted"]
    assert len(accepted) == 1 and "SpecValid=True" in accepted[0].message


def test_kubectl_get_shows_columns(operator: Any, custom: client.CustomObjectsApi, devcluster: Any,
                                   namespace: str) -> None:
    _create(custom, namespace, example())
    eventually(lambda: _observed(custom, namespace))
    out = subprocess.run([str(ensure_kubectl()), "--kubeconfig", str(devcluster.kubeconfig), "-n", namespace,
                          "get", "qhc"], capture_output=True, text=True, check=True).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "READY", "REPLICAS", "TP"]
    assert row.split()[:4] == [NAME, "False", "0/2", "2"]


def test_spec_change_updates_children(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _create(custom, namespace, example())
    eventually(lambda: _observed(custom, namespace))
    patch = {"spec": {"replicas": 3, "hicache": {"hostMemoryPerRankGB": 20}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, patch)
    eventually(lambda: _sts(kube_api, namespace).spec.replicas == 3)
    args = _sts(kube_api, namespace).spec.template.spec.containers[0].args
    assert args[args.index("--hicache-size") + 1] == "20"
    obj = eventually(lambda: _observed(custom, namespace))
    assert obj["status"]["observedGeneration"] == 2 and obj["status"]["replicas"] == 3


class CountingKube(Kube):
    """A real Kube that records every write it makes."""

    def __init__(self, api_client: client.ApiClient):
        super().__init__(api_client)
        self.writes: list[str] = []

    def apply(self, obj: dict) -> dict:
        self.writes.append(f"apply {obj['kind']}/{obj['metadata']['name']}")
        return super().apply(obj)

    def patch_status(self, namespace: str, name: str, status: dict) -> dict | None:
        self.writes.append(f"status {name}: {sorted(status)}")
        return super().patch_status(namespace, name, status)


def _versions(kube_api: client.ApiClient, custom: client.CustomObjectsApi, ns: str) -> dict[str, str]:
    core = client.CoreV1Api(kube_api)
    sts = _sts(kube_api, ns)
    ours = [(f.operation, f.time) for f in sts.metadata.managed_fields or [] if f.manager == MANAGER]
    return {  # the StatefulSet controller writes the set's status whenever its pods change: not ours to count
        "sts": f"generation {sts.metadata.generation}, {ours}",
        "svc": core.read_namespaced_service(NAME, ns).metadata.resource_version,
        "headless": core.read_namespaced_service(f"{NAME}-headless", ns).metadata.resource_version,
        "server": get_server(custom, ns, NAME)["metadata"]["resourceVersion"],
    }


def test_noop_resync_writes_nothing(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _create(custom, namespace, example())
    eventually(lambda: _observed(custom, namespace))
    before = eventually(lambda: (v := _versions(kube_api, custom, namespace)) == _versions(kube_api, custom, namespace)
                        and v)
    counting = CountingKube(kube_api)
    body = get_server(custom, namespace, NAME)
    outcome = reconciler.reconcile(counting, body, lambda *a: None)
    assert counting.writes == [] and not outcome.applied and not outcome.status_written
    import time

    time.sleep(2.5)  # more than one resync period of the running operator
    assert _versions(kube_api, custom, namespace) == before


def test_invalid_combination_blocks_apply_with_condition_and_event(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _create(custom, namespace, variant(**{"spec.runtime.extraArgs": ["--tp-size", "8"]}))
    obj = eventually(lambda: _observed(custom, namespace))
    assert condition(obj, "SpecValid")["reason"] == "ManagedFlagInExtraArgs"
    assert condition(obj, "Degraded")["status"] == "True"
    with pytest.raises(ApiException) as err:
        _sts(kube_api, namespace)
    assert err.value.status == 404
    events = eventually(lambda: [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
                                 if e.type == "Warning" and e.reason == "ManagedFlagInExtraArgs"])
    assert "--tp-size" in events[0].message


def test_delete_removes_children_but_keeps_cache_volumes(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _create(custom, namespace, example())
    eventually(lambda: _observed(custom, namespace))
    core = client.CoreV1Api(kube_api)
    # The real StatefulSet controller creates a claim per pod from the template under `whenDeleted: Retain`,
    # labelled and owned by nothing (so garbage collection never takes it); no node runs the pods here.
    sts = _sts(kube_api, namespace)
    assert sts.spec.persistent_volume_claim_retention_policy.when_deleted == "Retain"
    names = {f"{sts.spec.volume_claim_templates[0].metadata.name}-{NAME}-{i}" for i in range(sts.spec.replicas)}
    eventually(lambda: {c.metadata.name for c in core.list_namespaced_persistent_volume_claim(namespace).items}
               == names)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    apps = client.AppsV1Api(kube_api)
    # the real garbage collector resolves owner kinds from discovery it refreshes every 30 s: right after the CRD
    # is installed it may need one refresh before it sees the owner gone
    eventually(lambda: not apps.list_namespaced_stateful_set(namespace).items, timeout=90)
    eventually(lambda: not core.list_namespaced_service(namespace).items)
    claims = {c.metadata.name for c in core.list_namespaced_persistent_volume_claim(namespace).items}
    assert claims == {f"hicache-{NAME}-0", f"hicache-{NAME}-1"}


def test_pod_that_cannot_fit_the_matching_nodes_is_refused(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    node = f"gpu-{namespace}"[:60]
    core.create_node({"metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}}})
    try:
        core.patch_node_status(node, {"status": {"allocatable": {"memory": "100Gi", "nvidia.com/gpu": "8"}}})
        _create(custom, namespace, example())
        obj = eventually(lambda: _observed(custom, namespace))
        sizing = condition(obj, "SizingValid")
        assert sizing["status"] == "False" and "100Gi allocatable" in sizing["message"]
        assert "hostMemoryPerRankGB" in sizing["message"]
        assert condition(obj, "Degraded")["status"] == "True"
        with pytest.raises(ApiException):
            _sts(kube_api, namespace)
    finally:
        core.delete_node(node)


def test_write_back_with_a_disk_tier_warns_but_still_serves(
    operator: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _create(custom, namespace, variant(**{"spec.hicache.writePolicy": "write_back"}))
    obj = eventually(lambda: _observed(custom, namespace))
    persistent = condition(obj, "CachePersistent")
    assert persistent["status"] == "False" and persistent["reason"] == "WriteBackNotPersisted"
    assert _sts(kube_api, namespace).spec.replicas == 2  # a warning, not a block
    eventually(lambda: [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
                        if e.type == "Warning" and e.reason == "WriteBackNotPersisted"])
