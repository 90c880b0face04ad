"""Thin Kubernetes I/O: get, server-side apply under one field manager, status patch, evictions.

`KubeClient` is everything the operator asks of the API server; `Kube` speaks to a real one and the tests'
fake client (tests/fakekube.py) records the same calls. Each method is a single API call; the decisions live
in the pure modules.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.discovery import LazyDiscoverer
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError

from .constants import API_VERSION, KIND, MANAGER

Obj = dict[str, Any]


class NotServed(Exception):
    """The API server does not serve a kind the operator needs (its CRD is not installed: a multi-node server's
    LeaderWorkerSet without the LWS controller). Refused like a call, so the pass reports it in status."""

    reason = "NotServed"

    def __init__(self, api_version: str, kind: str) -> None:
        self.body = (f"the API server does not serve {kind} ({api_version}): is its CustomResourceDefinition "
                     "installed?")  # fmt: skip
        super().__init__(self.body)


API_ERRORS = (ApiException, DynamicApiError, NotServed)
"""What a refused or failed call raises (a fake client raises ApiException too)."""


def namespace_terminating(err: Exception) -> bool:
    """The API server refused a create because the namespace is being deleted: nothing to converge, no error."""
    return getattr(err, "status", None) == 403 and "NamespaceTerminating" in str(getattr(err, "body", "") or "")


def load_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG (read now, not at import time)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))


class KubeClient(Protocol):
    """The operator's door to the API server (see `Kube` for what each call does)."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...
    def list(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]: ...
    def list_nodes(self, selector: dict[str, str]) -> list[Obj]: ...
    def get_server(self, namespace: str, name: str) -> Obj | None: ...
    def apply(self, obj: Obj) -> Obj: ...
    def create_if_absent(self, obj: Obj) -> bool: ...
    def patch_status(self, namespace: str, name: str, status: Obj) -> Obj | None: ...
    def annotate(self, api_version: str, kind: str, namespace: str, name: str,
                 annotations: dict[str, str]) -> None: ...  # fmt: skip
    def resize_claim(self, namespace: str, name: str, storage: str) -> None: ...
    def evict_pod(self, namespace: str, name: str, uid: str, dependents_first: bool = False) -> bool | None: ...
    def delete_orphaning(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool: ...
    def set_owners(self, api_version: str, kind: str, namespace: str, name: str, owners: list[Obj]) -> None: ...


class MemoryDiscoverer(LazyDiscoverer):
    """API discovery kept in memory only. The library's default shares one JSON file per API server in /tmp,
    written in place: a second process starting meanwhile reads it half-written and logs an error."""

    NO_FILE = os.path.join(os.sep, "nonexistent", "qwen-hicache-discovery.json")

    def __init__(self, dynamic_client: Any, cache_file: str | None = None):
        super().__init__(dynamic_client, self.NO_FILE)

    def _write_cache(self) -> None:
        """Never written: every process discovers for itself (lazily, one group at a time)."""


def plain(_client: Any, instance: Obj) -> Obj:
    """The API server's JSON as the plain dicts it decoded to (the `serializer` of every call). The library's
    default wraps every nested dict in an object and `to_dict()` copies it back: about 0.5 ms of CPU per 25 KB
    response, most of a pass's client time. A list's items get their kind, as the library's own do."""
    kind = instance.get("kind", "")
    if kind.endswith("List") and "items" in instance:
        instance["items"] = instance["items"] or []
        for item in instance["items"]:
            item.setdefault("apiVersion", instance.get("apiVersion"))
            item.setdefault("kind", kind[:-4])
    return instance


class Kube:
    """The operator's only door to the API server."""

    def __init__(self, api_client: client.ApiClient, node_cache_seconds: float = 30.0,
                 node_sizing_check: bool = True) -> None:  # fmt: skip
        """`node_cache_seconds`, `node_sizing_check`: see settings.Settings."""
        self.api_client = api_client
        self.dyn = DynamicClient(api_client, discoverer=MemoryDiscoverer)
        self.node_cache_seconds, self.node_sizing_check = node_cache_seconds, node_sizing_check
        self._nodes: dict[str, tuple[float, list[Obj]]] = {}

    @cache  # noqa: B019 - one Kube per process; discovery results never change for it
    def _resource(self, api_version: str, kind: str) -> Any:
        """The kind's API (a kind not served is not cached: a CRD installed later is found by the next call)."""
        try:
            return self.dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise NotServed(api_version, kind) from None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """The live object, or None when it does not exist."""
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace, serializer=plain)
        except NotFoundError:
            return None

    def apply(self, obj: Obj) -> Obj:
        """Server-side apply, taking ownership of conflicting fields (we are the controller)."""
        res = self._resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        return res.server_side_apply(
            body=obj, name=meta["name"], namespace=meta.get("namespace"), field_manager=MANAGER, force_conflicts=True,
            serializer=plain,
        )

    def patch_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        """One merge patch of the resource's status subresource; the resource as the server stored it."""
        res = self._resource(API_VERSION, KIND)
        return res.status.patch(
            body={"status": status}, name=name, namespace=namespace, content_type="application/merge-patch+json",
            serializer=plain,
        )

    def list(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]:
        """Objects of a kind in a namespace matching labels."""
        sel = ",".join(f"{k}={v}" for k, v in selector.items())
        return self._resource(api_version, kind).get(namespace=namespace, label_selector=sel, serializer=plain)["items"]

    def list_nodes(self, selector: dict[str, str]) -> list[Obj]:
        """Nodes matching labels, cached for `node_cache_seconds` (nodes change rarely; every resync asks);
        empty when the operator may not read nodes (the chart makes that permission optional)."""
        if not self.node_sizing_check:
            return []
        sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        hit = self._nodes.get(sel)
        if hit and time.monotonic() - hit[0] < self.node_cache_seconds:
            return hit[1]
        try:
            nodes = self._resource("v1", "Node").get(label_selector=sel, serializer=plain)["items"]
        except DynamicApiError as err:
            # 400/422: a selector the API server cannot parse (the CRD refuses those; an object stored under an
            # older CRD may still carry one): skip the node check, the spec check names the field.
            if err.status not in (400, 403, 404, 422):
                raise
            nodes = []
        self._nodes[sel] = (time.monotonic(), nodes)
        return nodes

    def evict_pod(self, namespace: str, name: str, uid: str, dependents_first: bool = False) -> bool | None:
        """Evict exactly this incarnation of a pod through the eviction API, so the PodDisruptionBudget
        applies to the operator's own restarts too. True: evicted; False: already gone or replaced;
        None: the budget allows no disruption now (429), try again later. `dependents_first`: foreground
        propagation, the pod object stays until the garbage collector has deleted what it owns (a group
        leader's worker StatefulSet and its pods), as LeaderWorkerSet deletes a leader itself."""
        preconditions = client.V1Preconditions(uid=uid) if uid else None
        options = client.V1DeleteOptions(preconditions=preconditions,
                                          propagation_policy="Foreground" if dependents_first else None)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                 delete_options=options)
        try:
            client.CoreV1Api(self.api_client).create_namespaced_pod_eviction(name, namespace, body)
            return True
        except ApiException as err:
            if err.status in (404, 409):  # gone, or the uid precondition failed: a successor runs under this name
                return False
            if err.status == 429:
                return None
            raise

    def delete_orphaning(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
        """Delete exactly this incarnation, leaving its dependents (pods) running for a successor to adopt."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan",
                "preconditions": {"uid": uid}}
        try:
            self._resource(api_version, kind).delete(name=name, namespace=namespace, body=body)
            return True
        except NotFoundError:
            return False
        except DynamicApiError as err:
            if err.status == 409:  # already replaced
                return False
            raise

    def resize_claim(self, namespace: str, name: str, storage: str) -> None:
        """Raise a claim's storage request (volume expansion; the API server checks the StorageClass)."""
        self._resource("v1", "PersistentVolumeClaim").patch(
            body={"spec": {"resources": {"requests": {"storage": storage}}}}, name=name, namespace=namespace,
            content_type="application/merge-patch+json",
        )

    def create_if_absent(self, obj: Obj) -> bool:
        """Create-only (never read back: used for the admin Secret). False when it already exists."""
        try:
            self._resource(obj["apiVersion"], obj["kind"]).create(body=obj, namespace=obj["metadata"]["namespace"])
            return True
        except DynamicApiError as err:
            if err.status == 409:
                return False
            raise

    def annotate(self, api_version: str, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge-patch annotations onto an object the operator does not own (e.g. a volume claim)."""
        self._resource(api_version, kind).patch(
            body={"metadata": {"annotations": annotations}}, name=name, namespace=namespace,
            content_type="application/merge-patch+json",
        )

    def set_owners(self, api_version: str, kind: str, namespace: str, name: str, owners: list[Obj]) -> None:
        """Replace an object's owner references (a merge patch replaces the list whole: pass every one to keep),
        so the garbage collector deletes it with its owners (a group's cache claim under `retention: Delete`)."""
        self._resource(api_version, kind).patch(
            body={"metadata": {"ownerReferences": owners}}, name=name, namespace=namespace,
            content_type="application/merge-patch+json",
        )

    def get_server(self, namespace: str, name: str) -> Obj | None:
        """The QwenHiCacheServer itself."""
        return self.get(API_VERSION, KIND, namespace, name)
