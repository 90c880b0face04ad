"""Rollouts under the ways production breaks them, on the real control plane with the GPU-free harness: the
operator SIGKILLed at each step, the API server restarted, a second restart mid-rollout, someone else deleting
a pod, a scale change mid-rollout, many servers at once. The sampler (chaoslib) checks the invariants all
along; each test then requires the rollout Complete and counts the restarts the kubelet stand-in ran.

Two servers for the module: `solo` (2 replicas) and `trio` (3 replicas); each test rolls one to a new target."""

from __future__ import annotations

import time
from typing import Any

import pytest
from chaoslib import Fleet, Sampler, engine_info
from kubernetes import client

from harness.operator_process import OperatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
SOLO, TRIO = "solo", "trio"


def _in_flight(fleet: Fleet, name: str, pod: str, step: str) -> bool:
    rs = fleet.restart_status(name)
    return any(e["pod"] == pod and e["step"] == step for e in rs.get("inFlight") or [])


def _received(fleet: Fleet, pod: str) -> tuple[str | None, int]:
    ip = fleet.sim.pod_ip(fleet.namespace, pod)
    info = engine_info(ip) or {}
    return ip, int(info.get("received", -1))


def _sampler(kube_api: client.ApiClient, fleet: Fleet, *servers: str) -> Sampler:
    return Sampler(kube_api, fleet.namespace, list(servers), pod_ip=lambda p: fleet.sim.pod_ip(fleet.namespace, p))


def _assert_clean(sampler: Sampler, rs: dict) -> None:
    assert not sampler.violations, sampler.report()
    assert rs["phase"] == "Complete", (rs, sampler.report())


def _kill_trigger(fleet: Fleet, step: str) -> Any:
    """A check that is true at the moment the operator is inside `step` for solo-1 (the first pod to go)."""
    pod = f"{SOLO}-1"
    old_ip, before = _received(fleet, pod)
    if step == "Canary":  # the canary reached the old pod; its result is not yet written
        return lambda: _received(fleet, pod)[1] > before
    if step == "Verify":  # the replacement answered the warm check; the result is not yet written
        return lambda: (got := _received(fleet, pod))[0] not in (None, old_ip) and got[1] >= 1
    return lambda: _in_flight(fleet, SOLO, pod, step)


@pytest.mark.parametrize("step", ["Canary", "Delete", "WaitingReady", "Verify"])
def test_operator_sigkill_at_each_step(step: str, fleet: Fleet, chaos_operator: OperatorProcess,
                                       kube_api: client.ApiClient) -> None:
    fleet.up(SOLO, 2)
    before = fleet.incarnations(SOLO, 2)
    with _sampler(kube_api, fleet, SOLO) as sampler:
        trigger = _kill_trigger(fleet, step)
        value = fleet.restart(SOLO)
        fleet.wait_for(f"{SOLO}-1 at {step}", trigger)
        chaos_operator.kill()
        time.sleep(1)
        chaos_operator.start()
        rs = fleet.wait_phase(SOLO, value)
    _assert_clean(sampler, rs)
    after = fleet.incarnations(SOLO, 2)
    assert {p: after[p] - before[p] for p in after} == {f"{SOLO}-0": 1, f"{SOLO}-1": 1}, rs
    assert all(r["warm"] for r in rs["results"]), rs["results"]


def _ready_replacement(kube_api: client.ApiClient, fleet: Fleet, pod: str, old_uid: str) -> bool:
    """The API server reports a new incarnation of `pod` Ready."""
    got = client.CoreV1Api(kube_api).read_namespaced_pod(pod, fleet.namespace)
    return got.metadata.uid != old_uid and any(c.type == "Ready" and c.status == "True"
                                               for c in got.status.conditions or [])


def test_apiserver_restart_mid_rollout(fleet: Fleet, devcluster: Any, kube_api: client.ApiClient) -> None:
    """Besides the invariants: once the API server is back and the replacement is Ready, the operator's next
    step (the warm check reaching the new engine) comes within seconds (poll 2 s + a retry of at most 4 s),
    not after a 60 s back-off. The kubelet stand-in's own recovery is not counted."""
    pod = f"{SOLO}-1"
    fleet.up(SOLO, 2)
    before = fleet.incarnations(SOLO, 2)
    old_uid = client.CoreV1Api(kube_api).read_namespaced_pod(pod, fleet.namespace).metadata.uid
    old_ip = fleet.sim.pod_ip(fleet.namespace, pod)
    with _sampler(kube_api, fleet, SOLO) as sampler:
        value = fleet.restart(SOLO)
        fleet.wait_for("solo-1 waiting for its replacement", lambda: _in_flight(fleet, SOLO, pod, "WaitingReady"))
        devcluster.restart_apiserver(down_seconds=3)
        back = time.monotonic()
        fleet.wait_for("the replacement Ready", lambda: _ready_replacement(kube_api, fleet, pod, old_uid))
        ready = time.monotonic()
        fleet.wait_for("the warm check at the replacement",
                       lambda: (got := _received(fleet, pod))[0] not in (None, old_ip) and got[1] >= 1)
        reaction = time.monotonic() - max(ready, back)
        rs = fleet.wait_phase(SOLO, value)
    _assert_clean(sampler, rs)
    assert sampler.gaps > 0  # the sampler did see the outage
    assert reaction < 10, f"the operator's next step came {reaction:.1f}s after the API server and the pod were back"
    after = fleet.incarnations(SOLO, 2)
    assert all(after[p] - before[p] == 1 for p in after), (before, after)


def test_second_restart_right_after_a_delete(fleet: Fleet, kube_api: client.ApiClient) -> None:
    fleet.up(SOLO, 2)
    before = fleet.incarnations(SOLO, 2)
    with _sampler(kube_api, fleet, SOLO) as sampler:
        fleet.restart(SOLO)
        fleet.wait_for("solo-1 deleted", lambda: _in_flight(fleet, SOLO, f"{SOLO}-1", "WaitingReady"))
        second = fleet.restart(SOLO)
        rs = fleet.wait_phase(SOLO, second)
    _assert_clean(sampler, rs)
    after = fleet.incarnations(SOLO, 2)
    assert after[f"{SOLO}-0"] - before[f"{SOLO}-0"] == 1  # went once, straight to the newest target
    assert after[f"{SOLO}-1"] - before[f"{SOLO}-1"] in (1, 2)  # its replacement may have come back outdated


def test_external_pod_delete_mid_rollout(fleet: Fleet, kube_api: client.ApiClient) -> None:
    fleet.up(TRIO, 3)
    before = fleet.incarnations(TRIO, 3)
    with _sampler(kube_api, fleet, TRIO) as sampler:
        value = fleet.restart(TRIO)
        fleet.wait_for("trio-2 deleted", lambda: _in_flight(fleet, TRIO, f"{TRIO}-2", "WaitingReady"))
        sampler.external(f"{TRIO}-0")  # someone else takes a pending pod down while trio-2 is away
        rs = fleet.wait_phase(TRIO, value)
    _assert_clean(sampler, rs)
    after = fleet.incarnations(TRIO, 3)
    assert {p: after[p] - before[p] for p in after} == {f"{TRIO}-0": 1, f"{TRIO}-1": 1, f"{TRIO}-2": 1}, rs


def test_scale_down_then_up_mid_rollout(fleet: Fleet, kube_api: client.ApiClient) -> None:
    fleet.up(TRIO, 3)
    with _sampler(kube_api, fleet, TRIO) as sampler:
        value = fleet.restart(TRIO)
        fleet.wait_for("trio-2 deleted", lambda: _in_flight(fleet, TRIO, f"{TRIO}-2", "WaitingReady"))
        fleet.patch(TRIO, {"replicas": 2})  # the in-flight pod will never come back
        t0 = time.monotonic()
        rs = fleet.wait_phase(TRIO, value, timeout=100)  # well before podTimeoutSeconds (120)
        down_s = time.monotonic() - t0
        _assert_clean(sampler, rs)
        assert down_s < 90, f"scale-down rollout took {down_s:.0f}s"

        value = fleet.restart(TRIO)
        fleet.wait_for("trio-1 deleted", lambda: _in_flight(fleet, TRIO, f"{TRIO}-1", "WaitingReady"))
        fleet.patch(TRIO, {"replicas": 3})  # a new pod starts mid-rollout, already at the new target
        rs = fleet.wait_phase(TRIO, value)
        fleet.sim.wait_ready(fleet.namespace, TRIO, 3, timeout=120)
    _assert_clean(sampler, rs)


def test_many_servers_restarted_at_once(fleet: Fleet, kube_api: client.ApiClient) -> None:
    """Every server of a namespace restarted in the same second (a fleet-wide config push): each rollout keeps
    its own promises, and all complete (bench/rollouts.py measures 50 at once)."""
    names = [f"many-{i}" for i in range(4)]
    for name in names:
        fleet.up(name, 2)
    before = {name: fleet.incarnations(name, 2) for name in names}
    with _sampler(kube_api, fleet, *names) as sampler:
        values = {name: fleet.restart(name) for name in names}
        results = {name: fleet.wait_phase(name, value, timeout=300) for name, value in values.items()}
    for rs in results.values():
        _assert_clean(sampler, rs)
    for name in names:
        after = fleet.incarnations(name, 2)
        assert all(after[p] - before[name][p] == 1 for p in after), (name, before[name], after)
