"""Pure builders of the objects the operator owns for one QwenHiCacheServer (crate-operator style `get_*`).

No I/O: given the resource's metadata and what `derive` derived from its spec, return plain dicts ready for
server-side apply. Rendering the same inputs always yields the same bytes, so a no-op reconcile is a
no-op, and `RENDER_VERSION` marks the pod template so an operator upgrade never rolls pods by itself.
"""

from __future__ import annotations

from typing import Any

from . import diskusage, launch, podlifecycle, render_lws, render_router
from .constants import (  # noqa: F401 - re-exported
    ANNOTATION_PREFIX,
    CACHE_VOLUME,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    RENDER_VERSION,
    RENDER_VERSION_ANNOTATION,
    admin_secret_name,
    labels,
    owner_reference,
    selector,
    standard_labels,
)
from .derive import Derived
from .drift import with_hashes
from .rollout import CONFIG_HASH_ANNOTATION, FINGERPRINT_ANNOTATION, RESTART_ANNOTATION
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]

HTTP_PORT_NAME = "http"


def _metadata(meta: Obj, name: str) -> Obj:
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels(meta["name"]),
        "ownerReferences": [owner_reference(meta)],
    }


def get_admin_secret(meta: Obj, api_key: str) -> Obj:
    """The runtime's admin API key (guards /flush_cache and storage clear); created once, never read back."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(meta, admin_secret_name(meta["name"])),
        "type": "Opaque",
        "stringData": {launch.ADMIN_SECRET_KEY: api_key},
    }


def headless_service_name(name: str) -> str:
    return f"{name}-headless"


def _service(meta: Obj, spec: QwenHiCacheServerSpec, name: str, kind_spec: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(meta, name),
        "spec": {
            **kind_spec,
            "selector": selector(meta["name"]),
            "ports": [{"name": HTTP_PORT_NAME, "port": spec.runtime.port, "targetPort": HTTP_PORT_NAME}],
        },
    }


def get_headless_service(meta: Obj, spec: QwenHiCacheServerSpec) -> Obj:
    """Stable per-pod DNS names for the StatefulSet (`<pod>.<name>-headless`), ready or not."""
    return _service(meta, spec, headless_service_name(meta["name"]),
                    {"clusterIP": "None", "publishNotReadyAddresses": True})


def get_client_service(meta: Obj, spec: QwenHiCacheServerSpec) -> Obj:
    """The address clients use: ready pods only, on the runtime's HTTP port."""
    return _service(meta, spec, meta["name"], {"type": "ClusterIP"})


def _probes(startup_failures: int) -> Obj:
    def http(path: str, period: int, failures: int) -> Obj:
        return {
            "httpGet": {"path": path, "port": HTTP_PORT_NAME},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": http("/health", launch.STARTUP_PROBE_PERIOD, startup_failures),
        "readinessProbe": http("/ready", 5, 3),
        "livenessProbe": http("/health", 15, 4),
    }


def _resources(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> Obj:
    gpus = str(spec.runtime.tensor_parallel_size)
    return {
        "requests": {spec.runtime.gpu_resource_name: gpus, "memory": str(sizing.pod_memory_request_bytes)},
        "limits": {spec.runtime.gpu_resource_name: gpus, "memory": str(sizing.pod_memory_limit_bytes)},
    }


def _volume_mounts(spec: QwenHiCacheServerSpec) -> list[Obj]:
    mounts = [
        {"name": "model", "mountPath": launch.MODEL_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if spec.hicache.disk.enabled:
        mounts.append({"name": CACHE_VOLUME, "mountPath": launch.CACHE_MOUNT})
    return mounts


def _volumes(spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> list[Obj]:
    return [
        {"name": "model", "persistentVolumeClaim": {"claimName": spec.model.weights.claim_name, "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(sizing.shm_bytes)}},
    ]


def get_cache_guard(d: Derived) -> Obj:
    """Init container that owns the cache directory layout (see podlifecycle)."""
    spec, layout = d.spec, d.layout
    return {
        "name": "cache-guard",
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["sh", "-c", podlifecycle.GUARD_SCRIPT],
        "env": [
            {"name": "QWEN_HICACHE_CACHE_ROOT", "value": launch.CACHE_MOUNT},
            {"name": "QWEN_HICACHE_FINGERPRINT", "value": layout.fingerprint},
            {"name": "QWEN_HICACHE_KEEP_OLD", "value": str(spec.hicache.disk.keep_old_namespaces)},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": launch.CACHE_MOUNT}],
    }


def get_cache_usage_sidecar(d: Derived) -> Obj:
    """Sidecar that measures the pod's disk tier for Prometheus and `status.replicaCache` (see diskusage)."""
    spec, sizing, layout = d.spec, d.launch, d.layout
    env = [
        {"name": "QWEN_HICACHE_CACHE_ROOT", "value": launch.CACHE_MOUNT},
        {"name": "QWEN_HICACHE_FINGERPRINT", "value": layout.fingerprint},
        {"name": "QWEN_HICACHE_TP_SIZE", "value": str(spec.runtime.tensor_parallel_size)},
    ]
    if sizing.disk_cap_bytes_per_rank:
        env.append({"name": launch.MAX_SIZE_ENV, "value": str(sizing.disk_cap_bytes_per_rank)})
    return {
        "name": "cache-usage",
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["python3", "-c", diskusage.SCRIPT],
        "env": env,
        "ports": [{"name": diskusage.PORT_NAME, "containerPort": diskusage.PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": launch.CACHE_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }


def get_container(meta: Obj, d: Derived) -> Obj:
    """The runtime container, started with the derived SGLang flags."""
    spec, sizing = d.spec, d.launch
    container = {
        "name": "sglang",
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": list(launch.ENTRYPOINT),
        "args": list(d.args),
        "env": [dict(e) for e in d.command.env],
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": spec.runtime.port, "protocol": "TCP"}],
        "resources": _resources(spec, sizing),
        "volumeMounts": _volume_mounts(spec),
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", podlifecycle.PRESTOP_SCRIPT]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",  # a crash's last log lines reach status
        **_probes(d.command.startup_failures),
    }
    return container


def get_pod_template(meta: Obj, d: Derived) -> Obj:
    """Pod template; versioned so a different rendering by a newer operator is visible, not silent."""
    spec, layout = d.spec, d.layout
    pod_spec: Obj = {
        "containers": [get_container(meta, d)],
        "volumes": _volumes(spec, d.launch),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": layout.drain.grace_seconds,
    }
    if spec.hicache.disk.enabled:
        pod_spec["initContainers"] = [get_cache_guard(d)]
        pod_spec["containers"].append(get_cache_usage_sidecar(d))
    if spec.runtime.node_selector:
        pod_spec["nodeSelector"] = dict(spec.runtime.node_selector)
    if spec.runtime.tolerations:
        pod_spec["tolerations"] = [t.wire() for t in spec.runtime.tolerations]
    return {
        "metadata": {
            "labels": labels(meta["name"]),
            "annotations": {
                RENDER_VERSION_ANNOTATION: RENDER_VERSION,
                CONFIG_HASH_ANNOTATION: d.config_hash,
                RESTART_ANNOTATION: spec.restart or "",
                **({FINGERPRINT_ANNOTATION: layout.fingerprint} if spec.hicache.disk.enabled else {}),
            },
        },
        "spec": pod_spec,
    }


def _claim_templates(meta: Obj, spec: QwenHiCacheServerSpec, sizing: launch.LaunchSizing) -> list[Obj]:
    disk = spec.hicache.disk
    if not disk.enabled:
        return []
    claim_spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(sizing.disk_volume_bytes)}},
    }
    if disk.storage_class_name:
        claim_spec["storageClassName"] = disk.storage_class_name
    return [{"metadata": {"name": CACHE_VOLUME, "labels": labels(meta["name"])}, "spec": claim_spec}]


def get_statefulset(meta: Obj, d: Derived) -> Obj:
    """One pod per replica with its own cache volume; `OnDelete` because the operator owns restarts."""
    spec = d.spec
    retention = spec.hicache.disk.retention
    sts_spec: Obj = {
        "replicas": spec.replicas,
        "serviceName": headless_service_name(meta["name"]),
        "selector": {"matchLabels": selector(meta["name"])},
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "OnDelete"},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": retention, "whenScaled": "Retain"},
        "template": get_pod_template(meta, d),
    }
    claims = _claim_templates(meta, spec, d.launch)
    if claims:
        sts_spec["volumeClaimTemplates"] = claims
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _metadata(meta, meta["name"]),
            "spec": sts_spec}


def get_pdb(meta: Obj, d: Derived) -> Obj:
    """The rollout's promise for everyone else too: a node drain (the eviction API) takes down no more pods at
    once than a rolling restart would (`rollout.allowed_down`: maxUnavailable, never the last of several
    replicas; a single replica may go, or nothing could ever drain its node). The operator's own restarts are
    evictions as well. A pod that is not ready may always be evicted: it serves nothing, and a budget that
    protected it would block the restart that fixes it."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(meta, meta["name"]),
        "spec": {
            "maxUnavailable": d.allowed_down,
            "selector": {"matchLabels": selector(meta["name"])},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_all(meta: Obj, d: Derived, manifest: bool = True) -> list[Obj]:
    """Every object the operator applies for one resource, in apply order, each stamped with its hash: a
    StatefulSet of one pod per replica, or LeaderWorkerSet groups across nodes (render_lws).
    `manifest=False`: without the router's worker manifest, which the reconciler renders once per pass with the
    rollout's drained pods (router.py); `qwen-hicache render` shows it with none drained."""
    objects = unstamped(meta, d, manifest)
    if d.spec.nodes > 1:
        objects = render_lws.in_groups(objects, d.spec, meta["name"], d.allowed_down)
    return with_hashes(objects)


def unstamped(meta: Obj, d: Derived, manifest: bool = True) -> list[Obj]:
    """The single-node form of `render_all`, before the hash stamp."""
    spec = d.spec
    objects = [
        get_headless_service(meta, spec),
        get_client_service(meta, spec),
        get_statefulset(meta, d),
        get_pdb(meta, d),
    ]
    if spec.router_on:
        client, *router = render_router.router_objects(objects[1], meta, spec, owner_reference(meta), manifest)
        objects[1] = client
        objects += router
    return objects
