"""An in-memory Kubernetes client for `reconcile()` tests (qwen_hicache.kube.KubeClient), in the style of
cert-manager's controller tests: objects in a dict, every call recorded, so a test states exactly which API
calls one pass makes (`calls`, `writes`, `reads`).

Stricter than kinder: a server-side apply stores exactly what was sent (with a uid and a resourceVersion) and
returns it, a get of what is absent is None, an eviction or an orphaning delete checks the uid precondition,
and an injected failure (`fail`) raises the ApiException a real server would.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from kubernetes.client.exceptions import ApiException
from qwen_hicache.spec import API_VERSION, KIND

Obj = dict[str, Any]
WRITES = frozenset({"apply", "create", "patch_status", "annotate", "resize", "evict", "delete_orphaning",
                    "set_owners"})
_versions = itertools.count(1)


def _labels_match(obj: Obj, selector: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class FakeKube:
    """The API server's objects of one test, and every call made to them."""

    def __init__(self, *objects: Obj, nodes: list[Obj] | None = None) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.nodes = nodes or []
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[tuple[str, str], ApiException] = {}
        """(verb, kind) -> the error that call raises."""
        self.evictions_blocked = False
        """True: the PodDisruptionBudget allows no disruption now (a 429)."""
        for obj in objects:
            self.put(obj)

    # -- test helpers --------------------------------------------------------------------------------------

    def put(self, obj: Obj) -> Obj:
        """Store an object as the server would (a uid and a resourceVersion); not a recorded call."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{obj['kind'].lower()}-{meta['name']}")
        meta["resourceVersion"] = str(next(_versions))
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def find(self, kind: str, name: str, namespace: str = "ns") -> Obj | None:
        return self.objects.get((kind, namespace, name))

    def server(self, name: str = "srv", namespace: str = "ns") -> Obj:
        return self.objects[(KIND, namespace, name)]

    def reset(self) -> None:
        self.calls.clear()

    @property
    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in WRITES]

    @property
    def reads(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] not in WRITES]

    def _call(self, verb: str, kind: str, *rest: str) -> None:
        self.calls.append((verb, kind, *rest))
        if (err := self.fail.get((verb, kind))) is not None:
            raise err

    # -- the KubeClient protocol ---------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        self._call("get", kind, name)
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def get_server(self, namespace: str, name: str) -> Obj | None:
        return self.get(API_VERSION, KIND, namespace, name)

    def list(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]:
        self._call("list", kind, ",".join(f"{k}={v}" for k, v in sorted(selector.items())))
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and ns == namespace and _labels_match(o, selector)]

    def list_nodes(self, selector: dict[str, str]) -> list[Obj]:
        self._call("list", "Node")
        return [copy.deepcopy(n) for n in self.nodes if _labels_match(n, selector)]

    def apply(self, obj: Obj) -> Obj:
        self._call("apply", obj["kind"], obj["metadata"]["name"])
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        before = self.objects.get(key)
        stored = copy.deepcopy(obj)
        if before is not None:
            stored["metadata"]["uid"] = before["metadata"]["uid"]
            if "status" in before:
                stored["status"] = before["status"]
        return copy.deepcopy(self.put(stored))

    def create_if_absent(self, obj: Obj) -> bool:
        self._call("create", obj["kind"], obj["metadata"]["name"])
        if self.find(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]) is not None:
            return False
        self.put(obj)
        return True

    def patch_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        self._call("patch_status", KIND, name)
        server = self.objects[(KIND, namespace, name)]
        server["status"] = merge_patch(server.get("status") or {}, status)
        server["metadata"]["resourceVersion"] = str(next(_versions))
        return copy.deepcopy(server)

    def annotate(self, api_version: str, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._call("annotate", kind, name)
        obj = self.objects[(kind, namespace, name)]
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **annotations}

    def resize_claim(self, namespace: str, name: str, storage: str) -> None:
        self._call("resize", "PersistentVolumeClaim", name, storage)
        claim = self.objects[("PersistentVolumeClaim", namespace, name)]
        claim["spec"]["resources"]["requests"]["storage"] = storage

    def evict_pod(self, namespace: str, name: str, uid: str, dependents_first: bool = False) -> bool | None:
        self._call("evict", "Pod", name, uid, *(["Foreground"] if dependents_first else []))
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None or (uid and pod["metadata"]["uid"] != uid):
            return False
        if self.evictions_blocked:
            return None
        del self.objects[("Pod", namespace, name)]
        return True

    def delete_orphaning(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
        self._call("delete_orphaning", kind, name)
        obj = self.objects.get((kind, namespace, name))
        if obj is None or obj["metadata"]["uid"] != uid:
            return False
        del self.objects[(kind, namespace, name)]
        return True

    def set_owners(self, api_version: str, kind: str, namespace: str, name: str, owners: list[Obj]) -> None:
        self._call("set_owners", kind, name)
        if (kind, namespace, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        self.objects[(kind, namespace, name)]["metadata"]["ownerReferences"] = copy.deepcopy(owners)
