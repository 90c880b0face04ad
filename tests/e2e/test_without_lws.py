"""The operator on a control plane without the LeaderWorkerSet CRD (the chart needs none; a cluster serving only
single-node servers may have none): it starts, serves a single-node server (its readiness through the StatefulSet
watch: the resync is out of the way), says once that the LeaderWorkerSet watch is not served, and reports a
multi-node server's missing API in that server's status instead of failing its passes with a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubehelpers import condition, eventually, get_server
from kubernetes import client, config
from qwen_hicache.spec import GROUP, PLURAL, VERSION
from resources import operator_settings, variant

from harness.demo import install_crd
from harness.devcluster import DevCluster
from harness.inprocess import operator_thread
from harness.sim.cluster import SimCluster

pytestmark = pytest.mark.integration
NS, SINGLE, GROUPS = "no-lws", "one-node", "two-nodes"
UNSERVED = "Unresolved resources cannot be served"
"""Kopf's one warning at start-up for a handler's resource the API server does not serve."""


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch) -> Iterator[client.ApiClient]:
    """A control plane of its own without the LeaderWorkerSet controller and CRDs; KUBECONFIG points at it."""
    with DevCluster(lws=False, log=lambda _: None) as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        # A CRD just made Established can still answer 429 "storage is (re)initializing" for a moment; Kopf logs
        # that as an ERROR and retries. The operator starts once the resource lists, so the log below is its own.
        eventually(lambda: client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL))
        yield api
        api.close()


def _create(custom: client.CustomObjectsApi, name: str, **changes: Any) -> None:
    doc = variant(**{"metadata.name": name, "metadata.namespace": NS, "spec.router": {"enabled": False},
                     "spec.runtime.maxRequestSeconds": 5, **changes})  # fmt: skip
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)


def test_without_the_leaderworkerset_crd_single_node_servers_work_and_multi_node_ones_say_why(
        bare: client.ApiClient, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    custom = client.CustomObjectsApi(bare)
    caplog.set_level(logging.INFO)
    with SimCluster(bare, tmp_path / "volumes", NS) as sim, \
            operator_thread(settings=operator_settings(resync_seconds=600)):  # fmt: skip
        sim.weights_claim(NS)
        _create(custom, SINGLE, **{"spec.replicas": 1})
        sim.wait_ready(NS, SINGLE, 1, timeout=180)

        def ready() -> dict | None:
            obj = get_server(custom, NS, SINGLE)
            return obj if (condition(obj, "Ready") or {}).get("status") == "True" else None

        obj = eventually(ready, timeout=60)  # no resync within the test: the StatefulSet's event ran this pass
        assert obj["status"]["replicasSummary"] == "1/1"
        single_node = list(caplog.records)

        _create(custom, GROUPS, **{"spec.nodesPerReplica": 2, "spec.replicas": 1})

        def refused() -> dict | None:
            c = condition(get_server(custom, NS, GROUPS), "Ready") or {}
            return c if c.get("reason") == "ApplyFailed" else None

        c = eventually(refused, timeout=60)
        assert c["status"] == "False" and "does not serve LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)" in c[
            "message"], c  # fmt: skip
        assert sim.record(NS, f"{SINGLE}-0").incarnations == 1  # the single-node server is untouched
    unserved = [r for r in caplog.records if UNSERVED in r.getMessage()]
    assert len(unserved) == 1 and "leaderworkersets" in unserved[0].getMessage(), unserved
    assert unserved[0].levelno == logging.WARNING
    assert not [r for r in single_node if r.levelno >= logging.ERROR], [r.getMessage() for r in single_node]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
