"""End-to-end fixtures: the local API server + the GPU-free harness (kubelet, StatefulSet controller, engine)
+ the operator. Everything runs on loopback; every process stops with the test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from resources import operator_settings

from harness.inprocess import operator_thread
from harness.operator_process import OperatorProcess


@pytest.fixture
def operator(crd: None, devcluster: Any) -> Iterator[None]:
    """The operator in this process (Kopf in a thread), for one test."""
    with operator_thread(settings=operator_settings()):
        yield


@pytest.fixture
def operator_process(crd: None, devcluster: Any, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(devcluster.kubeconfig, tmp_path / "operator.log", env=operator_settings().env())
    yield op
    op.kill()
