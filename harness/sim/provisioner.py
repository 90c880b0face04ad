"""SIMULATION ONLY: an external volume provisioner and resizer for the ``local-dir`` StorageClass.

It plays what a CSI driver's external-provisioner and external-resizer sidecars do, against the real PV
controller: for a claim the PV controller has marked ``volume.kubernetes.io/storage-provisioner:
qwen-hicache.io/local-dir`` it creates a hostPath PersistentVolume (``<root>/<namespace>/<claim>``) pre-bound
to the claim, which the PV controller then binds; a claim whose request grows past its capacity gets the PV
and then the claim's status capacity raised (the StorageClass's ``allowVolumeExpansion`` is enforced by the
real admission plugin); a Released volume with reclaim policy Delete has its directory and PV removed.
Volumes are like network storage: any node can mount any of them.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

Obj = dict[str, Any]
PROVISIONER = "qwen-hicache.io/local-dir"
_PROVISIONER_KEYS = ("volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner")
_BY = "pv.kubernetes.io/provisioned-by"


class Provisioner:
    """One reconcile pass per `tick()` (the SimCluster loop calls it)."""

    def __init__(self, api: client.ApiClient, root: Path) -> None:
        self.core, self.root = client.CoreV1Api(api), Path(root)
        self.api = api

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.root / namespace / claim

    def tick(self) -> None:
        claims = self.api.sanitize_for_serialization(self.core.list_persistent_volume_claim_for_all_namespaces())
        volumes = self.api.sanitize_for_serialization(self.core.list_persistent_volume())
        pvs = {v["metadata"]["name"]: v for v in volumes.get("items") or []}
        for pvc in claims.get("items") or []:
            annotations = pvc["metadata"].get("annotations") or {}
            if not any(annotations.get(k) == PROVISIONER for k in _PROVISIONER_KEYS):
                continue
            name = pvc["spec"].get("volumeName") or f"pvc-{pvc['metadata']['uid']}"
            if name not in pvs and not pvc["spec"].get("volumeName"):
                self._provision(pvc, name)
            elif name in pvs and (pvc.get("status") or {}).get("phase") == "Bound":
                self._resize(pvc, pvs[name])
        for pv in pvs.values():
            self._reclaim(pv)

    def _provision(self, pvc: Obj, name: str) -> None:
        meta, spec = pvc["metadata"], pvc["spec"]
        path = self.claim_dir(meta["namespace"], meta["name"])
        path.mkdir(parents=True, exist_ok=True)
        sc = client.StorageV1Api(self.api).read_storage_class(spec.get("storageClassName", ""))
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"]},
                "persistentVolumeReclaimPolicy": sc.reclaim_policy or "Delete",
                "storageClassName": spec.get("storageClassName"),
                "volumeMode": spec.get("volumeMode") or "Filesystem",
            },
        }  # fmt: skip
        with contextlib.suppress(ApiException):  # 409: provisioned by an earlier pass
            self.core.create_persistent_volume(body)

    def _resize(self, pvc: Obj, pv: Obj) -> None:
        want = pvc["spec"]["resources"]["requests"]["storage"]
        have = ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
        if have is None or _bytes(want) <= _bytes(have):
            return
        meta = pvc["metadata"]
        if _bytes(pv["spec"]["capacity"]["storage"]) < _bytes(want):
            self.core.patch_persistent_volume(pv["metadata"]["name"], {"spec": {"capacity": {"storage": want}}})
        status = {"capacity": {"storage": want}, "allocatedResources": {"storage": want}, "conditions": None,
                  "allocatedResourceStatuses": None}  # fmt: skip
        self.core.patch_namespaced_persistent_volume_claim_status(meta["name"], meta["namespace"], {"status": status})

    def _reclaim(self, pv: Obj) -> None:
        spec, meta = pv["spec"], pv["metadata"]
        released = (pv.get("status") or {}).get("phase") in ("Released", "Failed")
        ours = (meta.get("annotations") or {}).get(_BY) == PROVISIONER
        if released and ours and spec.get("persistentVolumeReclaimPolicy") == "Delete":
            shutil.rmtree(spec["hostPath"]["path"], ignore_errors=True)
            with contextlib.suppress(ApiException):
                self.core.delete_persistent_volume(meta["name"])


def _bytes(quantity: str) -> int:
    from kubernetes.utils import parse_quantity

    return int(parse_quantity(quantity))
