"""Pods run as containers from their built images (harness.sim.containers): the memory limit is a real cgroup
limit (an over-limit container, or a Memory emptyDir filled past it, is OOM-killed), the securityContext holds
(user, read-only root, dropped capabilities, runAsNonRoot), sizeLimit bounds a Memory emptyDir, and the operator's
rendered server pod holds its host pool within the limit it sizes while a smaller limit kills it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from harness.sim.cluster import SimCluster
from harness.sim.images import built

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOUCH = "import time; b = bytearray({n}); b[::4096] = b'1' * len(range(0, {n}, 4096)); print('held', flush=True); " \
        "time.sleep(120)"  # fmt: skip


@pytest.fixture
def nodes(kube_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[SimCluster]:
    with SimCluster(kube_api, tmp_path / "volumes", namespace, backoff_seconds=1,
                    engine_args=["--sim-allocate-host-pool"]) as sim:  # fmt: skip
        yield sim


def _pod(name: str, command: list[str], memory: str | None = None, **extra: object) -> dict:
    container: dict = {"name": "main", "image": built("base", log=lambda _: None).pinned, "command": command, **extra}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    return {"metadata": {"name": name}, "spec": {"containers": [container], "terminationGracePeriodSeconds": 1}}


def _terminated(core: client.CoreV1Api, ns: str, name: str) -> client.V1ContainerStateTerminated | None:
    for st in core.read_namespaced_pod(name, ns).status.container_statuses or []:
        if st.last_state and st.last_state.terminated:
            return st.last_state.terminated
    return None


def _log(sim: SimCluster, ns: str, name: str, text: str) -> str:
    path = sim.wait_for(lambda: sim.pods.get((ns, name)), 30, f"{name} started").procs.run_dir / "main.log"
    return sim.wait_for(lambda: path.exists() and text in path.read_text() and path.read_text(), 60, f"{text!r}")


def test_memory_limit_oom_kills_and_memory_emptydir_counts(
    nodes: SimCluster, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_pod(namespace, _pod("fits", ["python3", "-c", TOUCH.format(n=64 << 20)], "256Mi"))
    core.create_namespaced_pod(namespace, _pod("over", ["python3", "-c", TOUCH.format(n=400 << 20)], "128Mi"))
    shm = _pod("shm", ["sh", "-c", "head -c 300000000 /dev/zero > /dev/shm/fill; echo filled; sleep 120"], "128Mi",
               volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}])  # fmt: skip
    shm["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    core.create_namespaced_pod(namespace, shm)
    for name in ("over", "shm"):
        st = nodes.wait_for(lambda n=name: _terminated(core, namespace, n), 60, f"{name} OOM-killed")
        assert (st.reason, st.exit_code) == ("OOMKilled", 137), st
    assert "held" in _log(nodes, namespace, "fits", "held") and _terminated(core, namespace, "fits") is None


def test_security_context_and_size_limit(nodes: SimCluster, kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    script = ("id -u; grep CapEff /proc/self/status; touch /rootfs-write 2>/dev/null && echo root-writable "
              "|| echo root-read-only; head -c 32000000 /dev/zero > /scratch/f 2>&1 || echo scratch-full; sleep 120")
    pod = _pod("locked", ["sh", "-c", script], securityContext={
        "runAsUser": 1234, "runAsGroup": 1234, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}}, volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}])  # fmt: skip
    pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
    core.create_namespaced_pod(namespace, pod)
    out = _log(nodes, namespace, "locked", "scratch-full")
    assert out.splitlines()[0] == "1234" and "CapEff:\t0000000000000000" in out and "root-read-only" in out
    core.create_namespaced_pod(namespace, _pod("rooted", ["sleep", "60"], securityContext={"runAsNonRoot": True}))

    def refused() -> str | None:
        sts = core.read_namespaced_pod("rooted", namespace).status.container_statuses or []
        waiting = sts[0].state.waiting if sts else None
        return waiting.message if waiting and waiting.reason == "CreateContainerConfigError" else None

    assert "runAsNonRoot and image will run as root" in nodes.wait_for(refused, 30, "CreateContainerConfigError")


def _server_pod(memory: str | None, tmp: Path) -> dict:
    """The operator's rendered server pod (`qwen-hicache render`) for a 1 GB-per-rank host pool, as a bare pod."""
    doc = yaml.safe_load((ROOT / "examples" / "qwenhicache-single-gpu.yaml").read_text())
    doc["spec"]["hicache"]["hostMemoryPerRankGB"] = 1
    (tmp / "small.yaml").write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "qwen_hicache.cli", "render", str(tmp / "small.yaml")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    sts = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    if memory:
        spec["containers"][0]["resources"]["limits"]["memory"] = memory
        spec["containers"][0]["resources"]["requests"]["memory"] = memory
    return {"metadata": {"name": "pool-small" if memory else "pool-sized"}, "spec": spec}


def test_the_sized_pod_holds_its_host_pool_and_a_smaller_limit_kills_it(
    nodes: SimCluster, kube_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    nodes.weights_claim(namespace)
    for memory in (None, "600M"):
        pod = _server_pod(memory, tmp_path)
        for e in pod["spec"]["containers"][0].get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref and memory is None:  # the admin key Secret the operator would create
                core.create_namespaced_secret(namespace, {"metadata": {"name": ref["name"]},
                                                          "stringData": {ref["key"]: "k"}})  # fmt: skip
        core.create_namespaced_pod(namespace, pod)
    nodes.wait_for(lambda: nodes.pods.get((namespace, "pool-sized")) and nodes.pods[(namespace, "pool-sized")].ready,
                   90, "the operator-sized pod Ready with its 1 GB pool resident")  # fmt: skip
    st = nodes.wait_for(lambda: _terminated(core, namespace, "pool-small"), 90, "the 600M pod OOM-killed")
    assert (st.reason, st.exit_code) == ("OOMKilled", 137), st
