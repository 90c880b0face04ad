"""The rollout's router seam (qwen_hicache.router): which pods are out of the manifest, and when a pod may go."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakekube import FakeKube
from qwen_hicache import render_router, router
from qwen_hicache.gather import Live
from qwen_hicache.status_model import Restart, Router

from harness.sim.routerlab import lab_spec

META = {"name": "chat", "namespace": "lab", "uid": "u-1"}


class Harness:
    """The router seam against the fake API server: the gathered children (`live`) and the router's pods."""

    def __init__(self, router_pods: list[dict] | None = None) -> None:
        self.kube, self.live = FakeKube(), Live()
        self.router_pods = router_pods or []

    def listed(self) -> list[str]:
        cm = self.kube.find("ConfigMap", render_router.manifest_name("chat"), "lab")
        return [w["id"] for w in json.loads(cm["data"][render_router.MANIFEST_KEY])["workers"]]

    def ready_to_delete(self, spec: object, rs: Restart, pod: str) -> bool:
        return router.ready_to_delete(self.kube, self.live, META, spec, rs, pod, self.router_pods)

    def sync(self, spec: object, rs: Restart | None, previous: Router | None = None) -> Router | None:
        return router.sync(self.kube, self.live, META, spec, rs, self.router_pods, previous)


def _rs(*in_flight: tuple[str, str], done: tuple[str, ...] = ()) -> Restart:
    """A rolling restart with these (pod, step) in flight."""
    return Restart.model_validate({"id": "h/1", "phase": "Rolling", "done": list(done),
                                   "inFlight": [{"pod": pod, "step": step} for pod, step in in_flight]})


def _router_pod(ip: str) -> dict[str, Any]:
    return {"metadata": {"name": "chat-router-abc"},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_drained_pods_are_those_past_their_canary() -> None:
    rs = _rs(("chat-0", "Canary"), ("chat-1", "Delete"), ("chat-2", "WaitingReady"), ("chat-3", "Verify"))
    assert router.drained_pods(rs) == {"chat-1", "chat-2", "chat-3"}
    assert router.drained_pods(None) == frozenset()


def test_before_delete_writes_the_manifest_without_the_pod_and_waits_for_every_router(monkeypatch) -> None:
    spec = lab_spec(3)
    h = Harness([_router_pod("10.0.0.9")])
    answers = {"chat-0": "ready", "chat-1": "ready", "chat-2": "ready"}
    monkeypatch.setattr(router, "router_workers", lambda ip, port: dict(answers))
    rs = _rs(("chat-2", "Delete"))
    assert not h.ready_to_delete(spec, rs, "chat-2")  # the router has not re-read the file yet
    assert h.listed() == ["chat-0", "chat-1"]
    answers["chat-2"] = "draining"
    assert h.ready_to_delete(spec, rs, "chat-2")
    answers.pop("chat-2")
    assert h.ready_to_delete(spec, rs, "chat-2")
    assert [c[0] for c in h.kube.writes] == ["apply"]  # the manifest once: later passes compare what was applied


def test_a_router_that_does_not_answer_blocks_the_delete(monkeypatch) -> None:
    h = Harness([_router_pod("10.0.0.9")])
    monkeypatch.setattr(router, "router_workers", lambda ip, port: None)
    assert not h.ready_to_delete(lab_spec(2), _rs(), "chat-1")


@pytest.mark.parametrize("enabled", [False, None])
def test_no_router_no_wait(enabled: bool | None) -> None:
    spec = lab_spec(1).model_copy(update={"router": lab_spec(1).router.model_copy(update={"enabled": enabled})})
    h = Harness()
    assert h.ready_to_delete(spec, _rs(), "chat-0")
    assert h.sync(spec, None) is None and not h.kube.objects and not h.kube.calls


def test_after_warm_check_the_pod_is_listed_again_and_status_says_so(monkeypatch) -> None:
    h = Harness([_router_pod("10.0.0.9")])
    monkeypatch.setattr(router, "router_workers", lambda ip, port: {"chat-0": "ready", "chat-1": "ready"})
    status = h.sync(lab_spec(2), _rs(done=("chat-1",))).wire()
    assert h.listed() == ["chat-0", "chat-1"]
    assert status["policy"] == "prefix_hash" and status["drained"] == [] and status["readyRouters"] == 1
    assert status["workers"][1] == {"pod": "chat-1", "routers": {"chat-router-abc": "ready"}}
    assert status["endpoint"] == "http://chat.lab.svc.cluster.local:30000"


def test_router_is_on_by_default_only_with_several_replicas() -> None:
    from qwen_hicache.spec import RouterSpec

    assert not RouterSpec().active(1) and RouterSpec().active(2)
    assert RouterSpec(enabled=True).active(1) and not RouterSpec(enabled=False).active(4)


def test_a_router_no_longer_wanted_is_scaled_to_zero_once() -> None:
    spec = lab_spec(1).model_copy(update={"router": lab_spec(1).router.model_copy(update={"enabled": False})})
    h = Harness()
    assert h.sync(spec, None, previous=None) is None and not h.kube.objects
    assert h.sync(spec, None, previous=Router(policy="prefix_hash")) is None
    assert h.kube.find("Deployment", "chat-router", "lab")["spec"]["replicas"] == 0
