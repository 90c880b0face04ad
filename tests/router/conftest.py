"""Fixtures for the router tests: the real `smg` (pinned in pyproject's test extra) in front of engine stand-ins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.sim.nameshim import unshare_available
from harness.sim.routerlab import RouterLab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Callable[..., RouterLab]]:
    """Start labs (replicas, engine args, router spec fields); all are stopped afterwards."""
    if not unshare_available():
        pytest.skip("the cluster-DNS stand-in needs root and `unshare -m` (a private mount namespace)")
    labs: list[RouterLab] = []

    def start(replicas: int = 2, *engine_args: str, **router) -> RouterLab:
        lab = RouterLab(tmp_path / f"lab{len(labs)}", replicas, list(engine_args), **router)
        labs.append(lab)
        return lab.start()

    yield start
    for lab in labs:
        lab.stop()
