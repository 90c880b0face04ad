"""Running rollouts hold none of Kopf's handler threads: with more rollouts waiting than handler threads, a
new resource still gets its StatefulSet within seconds (a synchronous daemon would never let it).

Real API server and controllers, the kubelet stand-ins: each server's pod runs and is Ready, then the
replacement the rollout makes never turns ready (the engine waits an hour before /ready), so every rollout
waits in WaitingReady (podTimeoutSeconds: 3600) and its daemon stays alive for the whole test. (Pods that never
ran are restarted by just replacing them: a rollout of Pending pods completes at once.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubehelpers import eventually, get_server
from kubernetes import client
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import example, operator_settings

from harness.inprocess import operator_thread
from harness.sim.cluster import SimCluster

pytestmark = pytest.mark.integration
HANDLER_THREADS = 3
ROLLOUTS = HANDLER_THREADS + 1


@pytest.fixture
def few_threads_operator(crd: None, devcluster: Any) -> Iterator[set[int]]:
    """The operator with fewer Kopf handler threads than the rollouts this test keeps running; yields the threads
    that ran before it (other tests' operators in this process), which are not its own."""
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    with operator_thread(settings=operator_settings(workers=HANDLER_THREADS)):
        yield before


def _create(custom: client.CustomObjectsApi, ns: str, name: str) -> None:
    doc = example()
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"]["replicas"] = 1
    doc["spec"]["hicache"]["disk"] = {"enabled": False}  # no torch in the stand-in engines
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def _has_sts(apps: client.AppsV1Api, ns: str, name: str) -> bool:
    return any(s.metadata.name == name for s in apps.list_namespaced_stateful_set(ns).items)


def _rolling(custom: client.CustomObjectsApi, ns: str, name: str) -> bool:
    rs = (get_server(custom, ns, name).get("status") or {}).get("restart") or {}
    return rs.get("phase") == "Rolling" and rs.get("id", "").endswith("/r1") and \
        any(e["step"] == "WaitingReady" for e in rs.get("inFlight") or [])


def test_new_resource_gets_its_statefulset_while_rollouts_wait(
    few_threads_operator: set[int], sim: SimCluster, kube_api: client.ApiClient, custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    apps = client.AppsV1Api(kube_api)
    busy = [f"busy-{i}" for i in range(ROLLOUTS)]
    for name in busy:
        _create(custom, namespace, name)
    for name in busy:
        sim.wait_ready(namespace, name, 1, timeout=180)
    sim.engine_args.append("--sim-startup-seconds=3600")  # replacements never turn ready
    for name in busy:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"restart": "r1"}})
    for name in busy:
        eventually(lambda n=name: _rolling(custom, namespace, n), timeout=120)
    time.sleep(3)  # every daemon is now in its polling loop
    rollout_threads = [t.name for t in threading.enumerate()
                       if t.name.startswith("rollout-step") and t.ident not in few_threads_operator]
    assert len(rollout_threads) <= 8, rollout_threads  # the bounded step pool, not one thread per rollout

    started = time.monotonic()
    _create(custom, namespace, "fresh")
    eventually(lambda: _has_sts(apps, namespace, "fresh"), timeout=60, interval=0.1)
    latency = time.monotonic() - started
    assert latency < 15, f"new resource waited {latency:.1f}s for its StatefulSet"  # seconds, on a loaded CI box
    assert all(_rolling(custom, namespace, n) for n in busy)  # and the rollouts are still being driven
