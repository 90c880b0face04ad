"""Chaos fixtures: one namespace, kubelet stand-ins and a killable operator process shared by a whole module
(creating servers and pods is what costs time; each test rolls the module's servers to a new target)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from resources import operator_settings

from harness.sim.cluster import SimCluster

sys.path.insert(0, str(Path(__file__).parent))
from chaoslib import Fleet  # noqa: E402

from harness.operator_process import OperatorProcess  # noqa: E402


@pytest.fixture(scope="module")
def chaos_ns(kube_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"chaos-{request.module.__name__.rsplit('_', 1)[-1][:20]}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def chaos_sim(kube_api: client.ApiClient, chaos_ns: str, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[SimCluster]:
    with SimCluster(kube_api, tmp_path_factory.mktemp("chaos") / "volumes", chaos_ns, nodes=4) as cluster:
        cluster.weights_claim(chaos_ns)
        yield cluster


@pytest.fixture(scope="module")
def chaos_operator(crd: None, devcluster: Any, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[OperatorProcess]:
    op = OperatorProcess(devcluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log",
                         env=operator_settings().env())
    op.start()
    yield op
    op.stop()


@pytest.fixture
def fleet(kube_api: client.ApiClient, chaos_ns: str, chaos_sim: SimCluster, chaos_operator: OperatorProcess
          ) -> Fleet:
    """The module's servers; the operator runs (again, if the previous test left it killed)."""
    chaos_operator.ensure()
    return Fleet(kube_api, chaos_ns, chaos_sim)
