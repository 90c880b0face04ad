"""End-to-end fixtures: the local API server + the GPU-free harness (kubelet, StatefulSet controller, engine)
+ the operator. Everything runs on loopback; every process stops with the test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.inprocess import operator_thread
from harness.sim.cluster import SimCluster


@pytest.fixture
def sim(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[SimCluster]:
    """Pods for this test's namespace, their volumes under tmp_path/volumes."""
    with SimCluster(kube_api, tmp_path / "volumes", namespace) as cluster:
        cluster.weights_claim(namespace)
        yield cluster


@pytest.fixture
def operator(crd: None, devcluster: Any) -> Iterator[None]:
    """The operator in this process (Kopf in a thread), for one test."""
    with operator_thread():
        yield


class OperatorProcess:
    """The operator as its own process (`qwen-hicache run`), so a test can SIGKILL it."""

    def __init__(self, kubeconfig: Path, log: Path):
        self.kubeconfig, self.log = kubeconfig, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        out = self.log.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "qwen_hicache.cli", "run", "--standalone"],
                                     env=env, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def operator_process(crd: None, devcluster: Any, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(devcluster.kubeconfig, tmp_path / "operator.log")
    yield op
    op.kill()
