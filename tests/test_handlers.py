"""The Kopf shell's own pieces: the serving-pod index the rollout poll reads instead of a pod list, and how a
failed pass is retried (by the operator, never by Kopf: Kopf's retry writes to the resource)."""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
from fakekube import FakeKube
from kubernetes.client.exceptions import ApiException
from qwen_hicache import driver, handlers
from qwen_hicache.constants import NAME_LABEL, labels, router_labels
from qwen_hicache.handlers import Operator, register, server_pods
from qwen_hicache.settings import Settings
from resources import example


def test_the_index_keys_serving_pods_by_server_with_what_the_poll_compares() -> None:
    entry = server_pods(name="chat-1", namespace="ns", labels=labels("chat"), uid="u1", meta={"resourceVersion": "7"})
    assert entry == {("ns", "chat"): ("chat-1", "u1", "7")}
    pods = [{"metadata": {"name": n, "uid": u, "resourceVersion": rv}} for n, u, rv in entry.values()]
    server = {"metadata": {"resourceVersion": "3"}}
    assert driver.world_mark(server, pods) == ("3", (("chat-1", "u1", "7"),))


def test_the_index_watches_only_serving_pods() -> None:
    registry = register(Settings(), kopf.OperatorRegistry())
    (index,) = [h for h in registry._indexing.get_all_handlers() if h.id == "server_pods"]
    assert index.labels[NAME_LABEL] == labels("chat")[NAME_LABEL] != router_labels("chat")[NAME_LABEL]


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
