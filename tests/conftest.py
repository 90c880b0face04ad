"""Session-wide fixtures for a real local Kubernetes API server (see harness.devcluster).

The server is built once per machine (2-5 min cold, progress printed live) and started once per
test session. A build or start failure makes every test that uses it ERROR with the reason.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from harness.devcluster import DevCluster
from harness.sim.cluster import SimCluster

# -- Test tiers ------------------------------------------------------------------------------------------
# Every test gets exactly one tier marker, assigned here from what it uses, so a new test can never be filed in
# the wrong tier by forgetting a decorator: `make check` runs `unit or fake` (seconds), `make test` runs all.
TIERS = ("unit", "fake", "runtime", "tools", "integration")
CLUSTER_FIXTURES = frozenset({"devcluster"})
"""A test whose fixture closure reaches the real control plane is `integration`."""
RUNTIME_FIXTURES = frozenset({"tree", "parser", "sglang_tree", "wheel", "parent_tree", "patched_tree", "tree_copy",
                              "run_probe", "probes"})
"""Fixtures that unpack or execute sglang 0.5.23's own code (the wheel tree, CPU torch): `runtime`."""
RUNTIME_DIRS = frozenset({"runtime", "conformance"})
TOOLS_DIRS = frozenset({"chart", "observability", "router", "sim", "devcluster", "rbac", "corpus", "e2e", "chaos",
                        "integration", "bench", "gpu"})
"""Directories whose tests run real binaries (helm, promtool, prometheus, smg, engine stand-ins) or processes."""


def tier_of(item: pytest.Item) -> str:
    """The one tier of a test: an explicit tier marker, else from its fixtures, else from its directory."""
    explicit = [name for name in TIERS if item.get_closest_marker(name)]
    if explicit:
        return explicit[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & CLUSTER_FIXTURES:
        return "integration"
    parts = Path(str(item.path)).relative_to(Path(__file__).parent).parts
    sub = parts[0] if len(parts) > 1 else ""
    if fixtures & RUNTIME_FIXTURES or sub in RUNTIME_DIRS:
        return "runtime"
    if sub in TOOLS_DIRS:
        return "tools"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))


def _live_logger(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Print past pytest's output capture, so a slow first build shows its progress."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")

    def log(msg: str) -> None:
        if capman is None:
            print(msg, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled():
            print(msg, file=sys.stderr, flush=True)

    return log


@pytest.fixture(scope="session")
def devcluster(pytestconfig: pytest.Config) -> Iterator[DevCluster]:
    """The running cluster; KUBECONFIG points at it for the whole session."""
    with DevCluster(log=_live_logger(pytestconfig)) as cluster, pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(cluster.kubeconfig))
        yield cluster


@pytest.fixture(scope="session")
def kube_api(devcluster: DevCluster) -> Iterator[client.ApiClient]:
    """A kubernetes.client.ApiClient for the session's cluster (certificate-verified TLS)."""
    api = config.new_client_from_config(config_file=str(devcluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def namespace(kube_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test; deleting it afterwards also removes its contents (server-side GC)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"t-{stem}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="session")
def crd(kube_api: client.ApiClient) -> None:
    """The generated CRD, installed and Established."""
    from harness.demo import install_crd

    install_crd(kube_api)


@pytest.fixture
def custom(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


@pytest.fixture
def sim(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[SimCluster]:
    """Kubelet stand-ins for this test's namespace (with the admin's weights claim), volumes under tmp_path."""
    with SimCluster(kube_api, tmp_path / "volumes", namespace) as cluster:
        cluster.weights_claim(namespace)
        yield cluster
