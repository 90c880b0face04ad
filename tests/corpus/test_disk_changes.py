"""Disk-tier changes on the real control plane (StatefulSet, garbage-collector and PV controllers running).

Growing expands each cache claim and re-creates the StatefulSet without its pods (same pod uids, no
restart); shrinking is refused with the reason and changes nothing; enabling the tier later re-creates the
set with volume claims, adopts the running pods and starts the rollout that moves them onto the volumes.
"""

from __future__ import annotations

from typing import Any

import pytest
from cases import DIGEST
from kubehelpers import condition, eventually, get_server
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity
from qwen_hicache.constants import CONFIG_HASH_ANNOTATION
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import variant

pytestmark = pytest.mark.integration
NAME = "disk"


@pytest.fixture
def control_plane(kube_api: client.ApiClient) -> client.V1StorageClass:
    """The default StorageClass; skips on an API server without controllers (none to orphan or bind)."""
    try:
        classes = client.StorageV1Api(kube_api).list_storage_class().items
    except ApiException:
        classes = []
    default = [c for c in classes if (c.metadata.annotations or {}).get(
        "storageclass.kubernetes.io/is-default-class") == "true"]
    if not default:
        pytest.skip("needs the real control plane (controllers and a default StorageClass)")
    return default[0]


def _server(ns: str, **changes: Any) -> dict:
    doc = variant(**{"spec.replicas": 1, "spec.runtime.image": DIGEST, "spec.hicache.disk.size": "2Gi", **changes})
    doc["metadata"].update(name=NAME, namespace=ns)
    return doc


def _create(custom: client.CustomObjectsApi, doc: dict) -> None:
    ns = doc["metadata"]["namespace"]
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc, field_validation="Strict")


def _patch(custom: client.CustomObjectsApi, ns: str, spec: dict) -> int:
    obj = custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME, {"spec": spec})
    return obj["metadata"]["generation"]


def _observed(custom: client.CustomObjectsApi, ns: str, generation: int | None = None) -> dict | None:
    obj = get_server(custom, ns, NAME)
    want = generation or obj["metadata"]["generation"]
    return obj if (obj.get("status") or {}).get("observedGeneration") == want else None


def _sts(kube_api: client.ApiClient, ns: str) -> Any:
    try:
        return client.AppsV1Api(kube_api).read_namespaced_stateful_set(NAME, ns)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _pod(kube_api: client.ApiClient, ns: str) -> Any:
    pods = client.CoreV1Api(kube_api).list_namespaced_pod(ns).items
    return next((p for p in pods if p.metadata.name == f"{NAME}-0" and not p.metadata.deletion_timestamp), None)


def _claim(kube_api: client.ApiClient, ns: str) -> Any:
    return client.CoreV1Api(kube_api).read_namespaced_persistent_volume_claim(f"hicache-{NAME}-0", ns)


def _template_size(sts: Any) -> int:
    return int(parse_quantity(sts.spec.volume_claim_templates[0].spec.resources.requests["storage"]))


@pytest.mark.timeout(300)
def test_growing_the_disk_expands_claims_without_restarting_pods(
    operator_log: Any, control_plane: client.V1StorageClass, provisioner: None, kube_api: client.ApiClient,
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    _create(custom, _server(namespace))
    eventually(lambda: _observed(custom, namespace))
    pod = eventually(lambda: _pod(kube_api, namespace), timeout=60)
    eventually(lambda: _claim(kube_api, namespace).status.phase == "Bound", timeout=60)
    old_sts = _sts(kube_api, namespace)
    generation = _patch(custom, namespace, {"hicache": {"disk": {"size": "3Gi"}}})
    if not control_plane.allow_volume_expansion:
        obj = eventually(lambda: _observed(custom, namespace, generation))
        assert condition(obj, "SpecValid")["reason"] == "DiskExpansionRefused", obj["status"]["conditions"]
        assert _sts(kube_api, namespace).metadata.uid == old_sts.metadata.uid
        return
    new_sts = eventually(lambda: (s := _sts(kube_api, namespace)) and s.metadata.uid != old_sts.metadata.uid and s,
                         timeout=90)
    assert _template_size(new_sts) == 3 * 2**30
    assert parse_quantity(_claim(kube_api, namespace).spec.resources.requests["storage"]) == 3 * 2**30
    adopted = eventually(lambda: (p := _pod(kube_api, namespace)) and p.metadata.owner_references
                         and p.metadata.owner_references[0].uid == new_sts.metadata.uid and p, timeout=60)
    assert adopted.metadata.uid == pod.metadata.uid  # the same pod: not restarted
    obj = eventually(lambda: _observed(custom, namespace, generation))
    assert condition(obj, "SpecValid")["status"] == "True"
    assert not operator_log.bad, operator_log.report()


@pytest.mark.timeout(300)
def test_shrinking_the_disk_is_refused_and_changes_nothing(
    operator_log: Any, control_plane: client.V1StorageClass, provisioner: None, kube_api: client.ApiClient,
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    _create(custom, _server(namespace, **{"spec.hicache.disk.size": "3Gi"}))
    applied = eventually(lambda: _observed(custom, namespace))["status"]
    sts = eventually(lambda: _sts(kube_api, namespace))
    generation = _patch(custom, namespace, {"hicache": {"disk": {"size": "2Gi"}}})
    obj = eventually(lambda: _observed(custom, namespace, generation))
    spec_valid = condition(obj, "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "DiskShrinkRefused")
    assert "at least 3Gi" in spec_valid["message"]
    for key in ("launch", "sizing", "cache"):  # status describes the 3Gi server that runs, not the refused 2Gi
        assert obj["status"].get(key) == applied.get(key), key
    assert "keeps running" in condition(obj, "Degraded")["message"]
    events = eventually(lambda: [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
                                 if e.reason == "DiskShrinkRefused" and e.type == "Warning"])
    assert events
    now = _sts(kube_api, namespace)
    assert now.metadata.uid == sts.metadata.uid and _template_size(now) == 3 * 2**30
    assert not operator_log.bad, operator_log.report()


@pytest.mark.timeout(300)
def test_enabling_the_disk_tier_later_recreates_the_set_and_rolls_pods(
    operator_log: Any, control_plane: client.V1StorageClass, provisioner: None, kube_api: client.ApiClient,
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    _create(custom, _server(namespace, **{"spec.hicache.disk": {"enabled": False}}))
    eventually(lambda: _observed(custom, namespace))
    pod = eventually(lambda: _pod(kube_api, namespace), timeout=60)
    old_sts = _sts(kube_api, namespace)
    assert not old_sts.spec.volume_claim_templates
    generation = _patch(custom, namespace, {"hicache": {"disk": {"enabled": True, "size": "2Gi"}}})
    new_sts = eventually(lambda: (s := _sts(kube_api, namespace)) and s.metadata.uid != old_sts.metadata.uid and s,
                         timeout=90)
    assert _template_size(new_sts) == 2 * 2**30
    obj = eventually(lambda: _observed(custom, namespace, generation))
    assert condition(obj, "SpecValid")["status"] == "True"
    restart = eventually(lambda: (get_server(custom, namespace, NAME).get("status") or {}).get("restart"))
    assert restart["id"].split("/")[0] == new_sts.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    # the running pod is adopted first, then replaced by the rollout onto a pod with the cache volume
    eventually(lambda: (p := _pod(kube_api, namespace)) and (p.metadata.uid != pod.metadata.uid or (
        p.metadata.owner_references and p.metadata.owner_references[0].uid == new_sts.metadata.uid)), timeout=60)
    assert not operator_log.bad, operator_log.report()


@pytest.fixture
def fixed_class(kube_api: client.ApiClient, control_plane: client.V1StorageClass, namespace: str) -> Any:
    """A StorageClass of the same provisioner that does not allow expansion."""
    storage = client.StorageV1Api(kube_api)
    name = f"fixed-{namespace[-6:]}"
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": name}, "provisioner": control_plane.provisioner,
                                  "allowVolumeExpansion": False, "reclaimPolicy": "Delete"})
    yield name
    storage.delete_storage_class(name)


@pytest.mark.timeout(300)
def test_growing_on_a_class_without_expansion_is_refused_with_the_servers_reason(
    operator_log: Any, fixed_class: str, provisioner: None, kube_api: client.ApiClient,
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    _create(custom, _server(namespace, **{"spec.hicache.disk.storageClassName": fixed_class}))
    eventually(lambda: _observed(custom, namespace))
    eventually(lambda: _claim(kube_api, namespace).status.phase == "Bound", timeout=60)
    sts = _sts(kube_api, namespace)
    generation = _patch(custom, namespace, {"hicache": {"disk": {"size": "3Gi"}}})
    obj = eventually(lambda: _observed(custom, namespace, generation))
    spec_valid = condition(obj, "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "DiskExpansionRefused"), spec_valid
    assert "allowVolumeExpansion" in spec_valid["message"]
    assert _sts(kube_api, namespace).metadata.uid == sts.metadata.uid  # nothing re-created
    assert parse_quantity(_claim(kube_api, namespace).spec.resources.requests["storage"]) == 2 * 2**30
    assert not operator_log.bad, operator_log.report()
