"""Fixtures for operator integration tests: the CRD installed, the operator running (Kopf, in-thread)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner


@pytest.fixture(scope="module")
def operator(crd: None, devcluster: Any) -> Iterator[KopfRunner]:
    """The operator, cluster-wide and standalone, for the whole test module."""
    argv = ["run", "--standalone", "--all-namespaces", "-m", "qwen_hicache.handlers"]
    with KopfRunner(argv, timeout=60) as runner:
        time.sleep(1.0)  # let the watch streams start before the first test creates objects
        yield runner
    assert runner.exception is None, runner.output

