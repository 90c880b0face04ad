"""A pass's pod list from Kopf's pod index (indexed.py): the same pods a list by the instance label returns."""

from __future__ import annotations

import pytest
from fakekube import FakeKube
from qwen_hicache.constants import INSTANCE_LABEL, labels, router_labels, selector
from qwen_hicache.indexed import IndexedPods, pod_entry

pytestmark = pytest.mark.fake


def pod(name: str, pod_labels: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "status": {"podIP": "10.0.0.1"},
            "metadata": {"name": name, "namespace": "ns", "labels": pod_labels, "managedFields": [{"m": 1}]}}


def index_of(*pods: dict) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for p in pods:
        for key, value in pod_entry(p, "ns", p["metadata"]["labels"]).items():
            out.setdefault(key, []).append(value)
    return out


def test_the_instance_list_comes_from_the_index_without_managed_fields_and_as_copies() -> None:
    serving, router = pod("srv-0", labels("srv")), pod("srv-router-a", router_labels("srv"))
    kube = FakeKube()
    client = IndexedPods(kube, index_of(serving, router, pod("other-0", labels("other"))))
    found = client.list("v1", "Pod", "ns", {INSTANCE_LABEL: "srv"})
    assert [p["metadata"]["name"] for p in found] == ["srv-0", "srv-router-a"] and kube.calls == []
    assert "managedFields" not in found[0]["metadata"]
    found[0]["status"]["podIP"] = "changed"
    assert client.list("v1", "Pod", "ns", {INSTANCE_LABEL: "srv"})[0]["status"]["podIP"] == "10.0.0.1"
    assert client.list("v1", "Pod", "ns", {INSTANCE_LABEL: "gone"}) == []


def test_a_fresh_read_before_an_eviction_still_goes_to_the_api_server() -> None:
    kube = FakeKube(pod("srv-0", labels("srv")))
    client = IndexedPods(kube, {})
    assert [p["metadata"]["name"] for p in client.list("v1", "Pod", "ns", selector("srv"))] == ["srv-0"]
    assert kube.calls and kube.calls[0][:2] == ("list", "Pod")
    assert client.get_server("ns", "srv") is None  # everything else is the client's
