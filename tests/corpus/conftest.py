"""The operator for the corpus module, with every log record it writes kept so the test can demand no tracebacks."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner
from qwen_hicache.handlers import register
from resources import operator_settings


class Records(logging.Handler):
    """Keeps records with a traceback, and errors other than Kopf's retried API requests and writes refused
    because a namespace (another module's, or this one's after its test) is being deleted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        retried = record.name.startswith("kopf.") and "will retry" in message  # e.g. a 429 at start, an event post
        retried = retried or "NamespaceTerminating" in message  # Kopf's event poster, for a namespace being deleted
        if record.exc_info or "Traceback" in message or (record.levelno >= logging.ERROR and not retried):
            self.bad.append(record)

    def report(self) -> str:
        return "\n".join(f"{r.name}: {r.getMessage()}" + (f"\n{self.format(r)}" if r.exc_info else "")
                         for r in self.bad)


@pytest.fixture(scope="module")
def operator_log(crd: None, devcluster: Any) -> Iterator[Records]:
    """The operator, cluster-wide, for the whole module; yields its bad log records (must stay empty)."""
    records = Records()
    logging.getLogger().addHandler(records)
    argv = ["run", "--standalone", "--all-namespaces"]
    try:
        with KopfRunner(argv, timeout=60, registry=register(operator_settings(), kopf.OperatorRegistry())) as runner:
            time.sleep(1.0)  # let the watch streams start before the first object is created
            yield records
    finally:
        logging.getLogger().removeHandler(records)
    assert runner.exception is None, runner.output
    assert "Traceback" not in runner.output, runner.output


@pytest.fixture
def provisioner(kube_api: Any, tmp_path: Any) -> Iterator[None]:
    """The volume provisioner and resizer for `local-dir` alone (no nodes: pods stay Pending, claims bind)."""
    import threading

    from harness.sim.provisioner import Provisioner

    prov, stop = Provisioner(kube_api, tmp_path / "volumes"), threading.Event()

    def loop() -> None:
        while not stop.wait(0.2):
            try:
                prov.tick()
            except Exception as err:  # noqa: BLE001 - a transient API error: the next tick retries
                logging.getLogger("provisioner").info("tick failed: %s", err)

    thread = threading.Thread(target=loop, name="provisioner", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=5)
