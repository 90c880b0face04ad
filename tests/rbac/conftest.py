"""Fixtures for the RBAC tests (helpers live in installlib.py, so no test imports a conftest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from installlib import (
    OPERATOR_NS,
    WORKLOAD_NS,
    admin_api,
    audited_cluster,
    exercise,
    install,
    running_operator,
    stop_operator,
)
from rbaclib import Recorded, calls_from, grants_for

MODES = {  # cluster-wide also exercises the optional node read; namespaced mode runs without it
    "cluster-wide": ["nodeSizingCheck.enabled=true"],
    "namespaced": [f"watch.namespaces={{{WORKLOAD_NS}}}"],
}


@pytest.fixture(params=list(MODES), scope="module")
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """The chart installed in one mode, the operator run through `exercise`, what it was granted and called."""
    with audited_cluster(tmp_path_factory.mktemp("rbac")) as (cluster, sim):
        inst = install((cluster, sim), sets=MODES[request.param])
        with running_operator(inst) as op:
            exercise(admin_api(cluster))
            status, metrics = op.get(op.metrics)
            assert status == 200 and "# TYPE qwen_hicache_reconciles_total counter" in metrics
            stop_operator(inst, op)
        assert op.exit_codes == [0], op.output()  # stopped by SIGTERM; Kopf's shutdown calls count too
        calls, urls = calls_from(cluster.requests(user=inst.user))
        assert calls, "no calls recorded: is the request log attributing the operator's identity?"
        yield grants_for(inst.api, OPERATOR_NS, inst.service_account), calls, urls
