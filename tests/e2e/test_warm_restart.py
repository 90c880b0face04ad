"""The disk cache lifecycle end to end: apply, cache-aware rolling restart, warm-start proof, resume after an
operator crash, a new cache namespace on a byte-changing spec change, a cold start pausing the rollout, and a
recreated resource finding its retained volumes. Real API server, real files, real HiCacheFile; no GPU."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubehelpers import condition, eventually, get_server
from kubernetes import client
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import variant

pytestmark = pytest.mark.integration
NAME = "flash-next"
ROLLOUT_TIMEOUT = 300


def _doc(**changes: Any) -> dict:
    fast = {"spec.runtime.maxRequestSeconds": 5, "spec.rollout": {"podTimeoutSeconds": 120}}
    return variant(**{**fast, **changes})


def _create(custom: client.CustomObjectsApi, ns: str, doc: dict) -> None:
    doc["metadata"]["namespace"] = ns
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def _patch(custom: client.CustomObjectsApi, ns: str, spec: dict) -> None:
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME, {"spec": spec})


def _ready(custom: client.CustomObjectsApi, ns: str) -> dict | None:
    obj = get_server(custom, ns, NAME)
    ok = (condition(obj, "Ready") or {}).get("status") == "True"
    return obj if ok and obj["status"].get("observedGeneration") == obj["metadata"]["generation"] else None


def _restart_phase(custom: client.CustomObjectsApi, ns: str, *phases: str) -> dict | None:
    obj = get_server(custom, ns, NAME)
    rs = (obj.get("status") or {}).get("restart") or {}
    return obj if rs.get("phase") in phases and rs.get("id", "").endswith(obj["spec"].get("restart") or "") else None


def _up(custom: client.CustomObjectsApi, sim: Any, ns: str, replicas: int = 2) -> dict:
    """Create the resource and wait until the harness runs its pods and the operator reports Ready."""
    _create(custom, ns, _doc(**{"spec.replicas": replicas}))
    sim.wait_ready(ns, NAME, replicas, timeout=180)  # generous: CI shares 2 cores with everything else
    return eventually(lambda: _ready(custom, ns), timeout=120)


def _restart(custom: client.CustomObjectsApi, ns: str, spec: dict, *phases: str) -> dict:
    """Change the spec and wait for the rollout it triggers to reach one of `phases`."""
    _patch(custom, ns, spec)
    return eventually(lambda: _restart_phase(custom, ns, *phases), timeout=ROLLOUT_TIMEOUT)


def _serve_some_traffic(sim: Any, ns: str) -> None:
    """Real prefixes on disk besides the canary, as a busy server would have."""
    import json
    import urllib.request

    for pod in sim.ready_pods(ns, NAME):
        body = json.dumps({"text": f"user traffic {pod} " * 200, "sampling_params": {"max_new_tokens": 1}})
        urllib.request.urlopen(urllib.request.Request(
            f"http://{sim.pod_ip(ns, pod)}:30000/generate", data=body.encode(), method="POST"), timeout=10).read()


def test_rolling_restart_is_one_pod_at_a_time_and_warm(
    operator: None, sim: Any, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _up(custom, sim, namespace)
    _serve_some_traffic(sim, namespace)
    obj = _restart(custom, namespace, {"restart": "r1"}, "Complete", "Paused")
    rs = obj["status"]["restart"]
    assert rs["phase"] == "Complete", rs
    assert [r["pod"] for r in rs["results"]] == [f"{NAME}-1", f"{NAME}-0"]
    assert all(r["warm"] and r["storageTokens"] > 0 for r in rs["results"]), rs["results"]
    assert all(r["metricStorageCachedTokens"] >= r["storageTokens"] for r in rs["results"]), rs["results"]
    assert condition(obj, "CacheWarm")["status"] == "True"
    for pod in (f"{NAME}-0", f"{NAME}-1"):
        rec = sim.record(namespace, pod)
        assert rec.incarnations == 2 and rec.prestop_runs == 1, rec
        assert any("flush: 200" in out for out in rec.prestop_output), rec.prestop_output
    # One at a time: the second pod was deleted only after the first one's successor was verified.
    assert rs["started"] <= rs["finished"]
    assert obj["status"]["cache"]["terminationGracePeriodSeconds"] > 0
    # The pods' cache-usage sidecars (the real script) measured each disk tier: per replica in status.
    cache = eventually(lambda: _replica_cache(custom, namespace), timeout=150)
    assert {e["pod"] for e in cache} == {f"{NAME}-0", f"{NAME}-1"}, cache
    assert all(e["lastRestoredTokens"] > 0 and e["diskUsedBytes"] > 0 for e in cache), cache
    summary = get_server(custom, namespace, NAME)["status"]["cacheSummary"]
    assert "2/2 warm" in summary, summary


def _replica_cache(custom: client.CustomObjectsApi, ns: str) -> list | None:
    entries = (get_server(custom, ns, NAME).get("status") or {}).get("replicaCache") or []
    return entries if len(entries) == 2 and all(e.get("diskPageFiles") for e in entries) else None


def test_operator_killed_mid_rollout_resumes_without_restarting_a_pod_twice(
    operator_process: Any, sim: Any, custom: client.CustomObjectsApi, namespace: str
) -> None:
    operator_process.start()
    _up(custom, sim, namespace, 3)
    _patch(custom, namespace, {"restart": "r1"})

    def one_done() -> bool:
        rs = (get_server(custom, namespace, NAME).get("status") or {}).get("restart") or {}
        return rs.get("id", "").endswith("r1") and len(rs.get("done", [])) >= 1

    eventually(one_done, timeout=ROLLOUT_TIMEOUT)
    operator_process.kill()
    time.sleep(2)
    operator_process.start()
    obj = eventually(lambda: _restart_phase(custom, namespace, "Complete", "Paused"), timeout=ROLLOUT_TIMEOUT)
    assert obj["status"]["restart"]["phase"] == "Complete", obj["status"]["restart"]
    assert len(obj["status"]["restart"]["results"]) == 3
    for i in range(3):
        assert sim.record(namespace, f"{NAME}-{i}").incarnations == 2


def test_kv_dtype_change_moves_to_a_new_namespace_and_never_reads_old_pages(
    operator: None, sim: Any, custom: client.CustomObjectsApi, namespace: str
) -> None:
    before = _up(custom, sim, namespace, 1)["status"]["cache"]["fingerprint"]
    _restart(custom, namespace, {"restart": "warm"}, "Complete")  # puts the canary on disk under the old fingerprint
    volume = sim.pvc_dir(namespace, f"hicache-{NAME}-0")
    old_pages = sorted(p.name for p in (volume / before).iterdir() if p.suffix == ".bin")
    assert old_pages
    obj = _restart(custom, namespace, {"runtime": {"kvCacheDtype": "bf16"}, "restart": "dtype"}, "Complete", "Paused")
    after = obj["status"]["cache"]["fingerprint"]
    assert after != before and obj["status"]["cache"]["previousFingerprints"] == [before]
    result = obj["status"]["restart"]["results"][-1]
    assert result["newCacheNamespace"] and result["storageTokens"] == 0  # the old pages were not read
    assert obj["status"]["restart"]["phase"] == "Complete"
    assert (volume / after / ".qwen-hicache-fingerprint").read_text().strip() == after
    assert sorted(p.name for p in (volume / before).iterdir() if p.suffix == ".bin") == old_pages  # kept, intact
    claim = client.CoreV1Api(custom.api_client).read_namespaced_persistent_volume_claim(f"hicache-{NAME}-0", namespace)
    notes = claim.metadata.annotations  # the claim outlives the resource: a recreated one reports this history
    assert notes["qwenhicache.io/fingerprint"] == after and notes["qwenhicache.io/previous-fingerprints"] == before


def test_cold_replacement_pauses_the_rollout_and_restarts_nothing_else(
    operator: None, sim: Any, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _up(custom, sim, namespace)
    obj = _restart(custom, namespace, {"runtime": {"env": [{"name": "QWEN_HICACHE_SIM_COLD", "value": "1"}]}}, "Paused")
    rs = obj["status"]["restart"]
    assert rs["reason"] == "ColdStart" and f"{NAME}-1" in rs["message"]
    assert condition(obj, "Degraded")["reason"] == "ColdStart"
    assert condition(obj, "CacheWarm")["status"] == "False"
    time.sleep(2)
    assert sim.record(namespace, f"{NAME}-0").incarnations == 1  # the other pod was never touched


def test_recreated_resource_reuses_retained_volumes_and_warms(
    operator: None, sim: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    _up(custom, sim, namespace, 1)
    _restart(custom, namespace, {"restart": "fill"}, "Complete")  # canary on disk, flushed by the preStop hook
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    apps = client.AppsV1Api(kube_api)
    # the operator's finalizer goes once its rollout daemon has stopped, then the real GC removes the set
    eventually(lambda: not apps.list_namespaced_stateful_set(namespace).items, timeout=120)
    eventually(lambda: not client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
               and not sim.ready_pods(namespace, NAME), timeout=120)
    claims = [c for c in client.CoreV1Api(kube_api).list_namespaced_persistent_volume_claim(namespace).items
              if c.metadata.name != "qwen-weights"]  # the admin's weights claim
    assert [c.metadata.name for c in claims] == [f"hicache-{NAME}-0"]
    assert claims[0].metadata.annotations["qwenhicache.io/fingerprint"].startswith("v1-")
    _up(custom, sim, namespace, 1)
    obj = _restart(custom, namespace, {"restart": "after-recreate"}, "Complete", "Paused")
    assert obj["status"]["restart"]["results"][-1]["warm"], obj["status"]["restart"]
