"""A pass's pod list from the operator's pod watch instead of the API server.

Every pass lists its server's pods (serving and router pods, one list by the instance label). The operator
already watches pods (Kopf's index for the rollout poll), so the same watch keeps every server's pods in memory
(Kopf's index `instance_pods`) and `IndexedPods` answers that one list from it: one request fewer per pass.

Why it is safe: a pod list is a snapshot either way, and the watch trails the API server by the delivery of one
event; the pass never writes a pod from it. The one decision that needs the pods as they are now, a rollout's
eviction, re-reads them with its own selector (`gather.serving_pods`), which still goes to the API server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from .constants import INSTANCE_LABEL
from .kube import KubeClient

Obj = dict[str, Any]
PodsIndex = Mapping[tuple[str, str], Iterable[Obj]]
"""(namespace, server) -> that server's pods, whole (Kopf's index `instance_pods`)."""


def pod_entry(body: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> dict[tuple[str, str], Obj]:
    """One pod's entry in the index: the pod without its managedFields (the largest part, never read)."""
    pod = dict(body)
    pod["metadata"] = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    return {(namespace, labels[INSTANCE_LABEL]): pod}


class IndexedPods:
    """A KubeClient whose list of one server's pods (by the instance label alone, as `gather.pods` asks) comes
    from the index; every other call goes to `kube`."""

    def __init__(self, kube: KubeClient, pods: PodsIndex) -> None:
        self.kube, self.pods = kube, pods

    def list(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]:
        if (api_version, kind) == ("v1", "Pod") and set(selector) == {INSTANCE_LABEL}:
            return [copy.deepcopy(p) for p in self.pods.get((namespace, selector[INSTANCE_LABEL]), ())]
        return self.kube.list(api_version, kind, namespace, selector)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)
