"""Fixtures for operator integration tests: the CRD installed, the operator running (Kopf, in-thread)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner
from qwen_hicache.handlers import register
from resources import operator_settings


@pytest.fixture(scope="module")
def operator(crd: None, devcluster: Any) -> Iterator[KopfRunner]:
    """The operator, cluster-wide and standalone, for the whole test module."""
    argv = ["run", "--standalone", "--all-namespaces"]
    with KopfRunner(argv, timeout=60, registry=register(operator_settings(), kopf.OperatorRegistry())) as runner:
        time.sleep(1.0)  # let the watch streams start before the first test creates objects
        yield runner
    assert runner.exception is None, runner.output

