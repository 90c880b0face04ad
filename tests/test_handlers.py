"""The Kopf shell's own pieces: the serving-pod index the rollout poll reads instead of a pod list, how a
failed pass is retried (by the operator, never by Kopf: Kopf's retry writes to the resource), and the workload
watches (StatefulSets and LeaderWorkerSets) that refresh a server's status when its workload's readiness changes."""

from __future__ import annotations

import asyncio
import copy
import logging

import kopf
import pytest
from fakekube import FakeKube
from kubernetes.client.exceptions import ApiException
from qwen_hicache import driver, handlers, reconciler
from qwen_hicache.constants import MANAGED_BY_LABEL, MANAGER, labels, router_labels
from qwen_hicache.handlers import Operator, register
from qwen_hicache.settings import Settings
from resources import example
from test_reconciler import NAME, Runtime
from test_reconciler import runtime as runtime  # noqa: F401 - the fixture
from test_workload import Groups


def test_the_rollout_poll_marks_the_servers_serving_pods_from_the_one_pod_index() -> None:
    """One pod index (whole pods, serving and router): the poll's mark takes the serving pods' name, uid and
    resourceVersion from it; router pods carry another name label and stay out."""
    def pod(name: str, labelled: dict[str, str], rv: str) -> dict:
        body = {"metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv, "labels": labelled,
                             "managedFields": [{"manager": "x"}]}}  # fmt: skip
        return handlers.instance_pods(body, "ns", labelled)

    entries = [pod("chat-1", labels("chat"), "7"), pod("chat-router-x", router_labels("chat"), "9")]
    index = {("ns", "chat"): [e[("ns", "chat")] for e in entries]}
    assert "managedFields" not in index[("ns", "chat")][0]["metadata"]
    server = {"metadata": {"resourceVersion": "3"}}
    marked = driver.world_mark(server, handlers.serving_pods(index, "ns", "chat"))
    assert marked == ("3", (("chat-1", "u-chat-1", "7"),))
    assert handlers.serving_pods(index, "ns", "other") == [] == handlers.serving_pods(None, "ns", "chat")


def test_pods_are_indexed_once() -> None:
    registry = register(Settings(), kopf.OperatorRegistry())
    (index,) = registry._indexing.get_all_handlers()
    assert index.id == "instance_pods" and index.labels[MANAGED_BY_LABEL] == MANAGER


def _operator(monkeypatch: pytest.MonkeyPatch, kube: FakeKube) -> Operator:
    """An Operator on the fake API server, its events dropped (no Kopf poster outside a running operator)."""
    monkeypatch.setattr(handlers, "post_event", lambda *a: None)
    op = Operator(Settings())
    op._kube = kube  # type: ignore[assignment] - the fake speaks the same KubeClient protocol
    return op


BODY = {"metadata": {"namespace": "ns", "name": "srv"}}


@pytest.mark.parametrize("trigger", ["create", "update"])
def test_a_failed_pass_is_retried_by_the_operator_and_never_fails_the_kopf_handler(
        trigger: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A create/update handler that raises makes Kopf write its retry state onto the resource (a progress patch,
    a touch when the delay ends, a last one on success): writes of a resource whose children are fine. The handler
    returns instead and the operator retries the same level-based pass itself."""
    kube = FakeKube({**example(), "metadata": {**BODY["metadata"], "generation": 1}})
    kube.fail[("apply", "Service")] = ApiException(status=429, reason="Too Many Requests")
    op = _operator(monkeypatch, kube)
    logger = logging.getLogger("test")

    async def scenario() -> None:
        await op.configure(kopf.OperatorSettings())
        asyncio.get_running_loop().call_later(0.2, kube.fail.clear)  # the API server recovers
        if trigger == "create":
            await op.create_resource(BODY, logger)  # returns once a retry succeeded; never raises
        else:
            await asyncio.to_thread(op.reconcile_resource, BODY, logger)  # never raises; the retry runs later
        for _ in range(100):
            if kube.find("StatefulSet", "srv") is not None and (kube.server().get("status") or {}):
                break
            await asyncio.sleep(0.05)

    try:
        asyncio.run(scenario())
    finally:
        op.stopped()
    applies = [c for c in kube.calls if c[:2] == ("apply", "Service")]
    assert len(applies) >= 2, "the refused pass was tried again"
    assert kube.find("StatefulSet", "srv") is not None and kube.server()["status"]["observedGeneration"] == 1


def test_statefulsets_and_leaderworkersets_we_manage_are_watched_by_the_same_handler() -> None:
    """A multi-node server's readiness arrives as LeaderWorkerSet events (its StatefulSets are LWS's, unlabelled
    by us), a single-node server's as StatefulSet events: one handler, one own-apply skip, for both."""
    registry = register(Settings(), kopf.OperatorRegistry())
    watched = {h.id: h for h in registry._watching.get_all_handlers()}
    for handler_id, (group, version, plural) in handlers.WORKLOADS.items():
        selector = watched[handler_id].selector
        assert (selector.group, selector.version, selector.any_name) == (group, version, plural)
        assert watched[handler_id].labels == {MANAGED_BY_LABEL: MANAGER}
        assert watched[handler_id].fn.__func__ is Operator.child_changed  # type: ignore[attr-defined]
    assert set(handlers.WORKLOADS) == {"child_changed", "group_changed"}
    assert handlers.WORKLOADS["group_changed"] == ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")


@pytest.mark.fake
def test_a_leaderworkerset_event_runs_a_pass_only_when_a_group_s_readiness_changed(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Our own apply's event (the LWS as the last pass left it) costs no request; a group going down (LWS's
    readyReplicas) runs a pass at once, which reports it in status (replicas, status.groups)."""
    world = Groups(runtime).converged()
    op = _operator(monkeypatch, world.kube)
    logger = logging.getLogger("test")

    async def event(obj: dict) -> None:
        await op.configure(kopf.OperatorSettings())
        await op.child_changed(copy.deepcopy(obj), logger, type="MODIFIED")

    try:
        seen = copy.deepcopy(world.lws())
        seen["metadata"]["resourceVersion"] = "other"  # LWS's own bookkeeping: nothing a pass reads
        seen["status"]["conditions"] = [{"type": "Available", "status": "True"}]
        assert reconciler.workload_seen(seen)
        world.kube.reset()
        asyncio.run(event(seen))
        assert world.kube.calls == []
        assert world.status()["replicasSummary"] == "2/2"

        worker = world.kube.find("Pod", f"{NAME}-1-1")
        worker["status"]["conditions"][0]["status"] = "False"  # group 1's worker fails its probe
        world.controller()  # LWS: readyReplicas 1
        assert not reconciler.workload_seen(world.lws())
        world.kube.reset()
        asyncio.run(event(world.lws()))
    finally:
        op.stopped()
    assert ("patch_status", "QwenHiCacheServer", NAME) in world.kube.writes
    status = world.status()
    assert status["replicasSummary"] == "1/2"
    assert [(g["group"], g["readyNodes"]) for g in status["groups"]] == [(0, 2), (1, 1)]
    assert reconciler.workload_seen(world.lws())  # the next event of this state is skipped again
