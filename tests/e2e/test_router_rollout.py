"""The router in the real control plane: the operator's Deployment runs the real `smg` (kubelet stand-in, strict
DNS stand-in for the headless Service), clients go through it, and a rolling restart drains each pod from the
router before deleting it and lists it again after its warm check: conversations stay on their replica."""

from __future__ import annotations

from typing import Any

import pytest
from kubehelpers import eventually, get_server
from kubernetes import client
from qwen_hicache.router import router_workers
from test_warm_restart import NAME, ROLLOUT_TIMEOUT, _patch, _restart_phase, _up

from harness.polling import wait_for
from harness.sim.routerlab import landing_replicas
from harness.sim.routerpod import RouterPods

pytestmark = pytest.mark.integration
SYSTEM = ("You are the support assistant of a large online shop; answer briefly and politely. " * 12)[:900]


def texts(first: int, n: int = 8) -> list[str]:
    return [f"{SYSTEM}\nuser-{c:03d}: my order {c * 7919} has not arrived, what now?" for c in range(first, first + n)]


def spread_landing(router_url: str, model: str, engine_urls: list[str]) -> tuple[list[str], list[int]]:
    """Conversations sent through the router, eight at a time (up to 64), until every replica holds some, and the
    replica each landed on. Where one lands is a hash of its prefix on a ring placed by the pods' addresses, which
    differ run to run: eight all landed on one of two replicas once. A replica the router never uses still shows."""
    sent: list[str] = []
    landed: list[int] = []
    while len(sent) < 64 and sorted(set(landed)) != list(range(len(engine_urls))):
        more = texts(len(sent))
        landed += landing_replicas(router_url, model, more, engine_urls)
        sent += more
    return sent, landed


def _router_ip(kube_api: client.ApiClient, ns: str) -> str | None:
    pods = client.CoreV1Api(kube_api).list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=router")
    for p in pods.items:
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        if ready and p.status.pod_ip and not p.metadata.deletion_timestamp:
            return p.status.pod_ip
    return None


def test_rolling_restart_through_the_router_keeps_conversations_on_their_replica(
    operator: None, sim: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    with RouterPods(kube_api, sim.root) as routers:
        server = _up(custom, sim, namespace, 2)
        model = server["spec"]["model"]["servedName"]
        ip = wait_for(lambda: _router_ip(kube_api, namespace), "a ready router pod", timeout=120)
        url = f"http://{ip}:8000"
        wait_for(lambda: router_workers(ip, 8000) == {f"{NAME}-0": "ready", f"{NAME}-1": "ready"},
                 "both pods routable (by name) in the router", timeout=120)

        def engines() -> list[str]:
            return [f"http://{sim.pod_ip(namespace, f'{NAME}-{i}')}:30000" for i in range(2)]

        sent, before = spread_landing(url, model, engines())
        assert sorted(set(before)) == [0, 1], before
        _patch(custom, namespace, {"restart": "r1"})
        obj = eventually(lambda: _restart_phase(custom, namespace, "Complete", "Paused"), timeout=ROLLOUT_TIMEOUT)
        rs = obj["status"]["restart"]
        assert rs["phase"] == "Complete" and all(r["warm"] for r in rs["results"]), rs
        sim.wait_ready(namespace, NAME, 2, timeout=120)
        obj = eventually(lambda: (o := get_server(custom, namespace, NAME)) and all(
            set(w["routers"].values()) == {"ready"} for w in (o["status"].get("router") or {}).get("workers") or [{}]
        ) and o, timeout=60)
        assert obj["status"]["router"]["drained"] == [] and obj["status"]["router"]["policy"] == "prefix_hash"
        assert landing_replicas(url, model, sent, engines()) == before
        assert not routers.errors, routers.errors[:3]
