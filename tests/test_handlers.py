"""The Kopf shell's own pieces: the serving-pod index the rollout poll reads instead of a pod list."""

from __future__ import annotations

import kopf
from qwen_hicache import driver
from qwen_hicache.constants import NAME_LABEL, labels, router_labels
from qwen_hicache.handlers import register, server_pods
from qwen_hicache.settings import Settings


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
