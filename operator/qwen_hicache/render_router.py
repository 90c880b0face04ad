"""Pure builders of the router objects (Shepherd Model Gateway, `smg launch`) for one QwenHiCacheServer.

The router discovers its workers from a JSON manifest (`--discovery-provider file`) that the operator writes
into a ConfigMap: one entry per serving pod, named by the pod's stable DNS name under the headless Service.
A pod that restarts on a new IP is the same worker, and `prefix_hash` builds its ring from these names alone,
so the routing decision for a prefix is the same before and after a pod or router restart. The manifest is
also the rollout's switch: a pod leaves it before it is deleted and returns after its warm-start check (see
`router.py`). File discovery needs no Kubernetes API access: the router pod has no service account token.
"""

from __future__ import annotations

import json
from typing import Any

from . import status_model, units
from .constants import router_labels, router_selector  # noqa: F401 - re-exported
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]

MANIFEST_KEY = "workers.json"
MANIFEST_DIR = "/etc/smg"
MANIFEST_VERSION = 1  # the only manifest version smg 1.13 reads
DISCOVERY_INTERVAL_SECONDS = 5
HEALTH_CHECK_INTERVAL_SECONDS = 5
ROUTER_HTTP_PORT_NAME = "http"
ROUTER_METRICS_PORT_NAME = "metrics"
SMG_VERSION = "1.13.0"


def router_name(name: str) -> str:
    return f"{name}-router"


def manifest_name(name: str) -> str:
    return f"{name}-router-workers"


def worker_host(name: str, namespace: str, ordinal: int, nodes: int = 1) -> str:
    """The serving pod's stable DNS name: `<pod>.<headless service>.<namespace>.svc.cluster.local`; with
    `nodes > 1` the group leader's, under the headless Service LWS makes per group (`subdomainPolicy:
    UniquePerReplica`: `<server>-<group>`)."""
    subdomain = f"{name}-{ordinal}" if nodes > 1 else f"{name}-headless"
    return f"{name}-{ordinal}.{subdomain}.{namespace}.svc.cluster.local"


def worker_url(name: str, namespace: str, ordinal: int, port: int, nodes: int = 1) -> str:
    return f"http://{worker_host(name, namespace, ordinal, nodes)}:{port}"


def manifest(meta: Obj, spec: QwenHiCacheServerSpec, drained: frozenset[str] = frozenset()) -> Obj:
    """The router's worker list: every serving pod except those the rollout took out (`drained`)."""
    name, ns = meta["name"], meta["namespace"]
    port, nodes = spec.runtime.port, spec.nodes
    workers = [
        {"id": f"{name}-{i}", "url": worker_url(name, ns, i, port, nodes), "model_id": spec.model.served_name}
        for i in range(spec.replicas)
        if f"{name}-{i}" not in drained
    ]
    return {"version": MANIFEST_VERSION, "workers": workers}


def manifest_text(doc: Obj) -> str:
    """Canonical bytes, so an unchanged list is an unchanged ConfigMap (no write, no reread)."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def router_args(spec: QwenHiCacheServerSpec) -> list[str]:
    """`smg launch` flags. tests/router checks every one against the installed smg's own parser."""
    r = spec.router
    args = [
        "--host", "0.0.0.0",
        "--port", str(r.port),
        "--policy", r.policy,
        "--discovery-provider", "file",
        "--discovery-file", f"{MANIFEST_DIR}/{MANIFEST_KEY}",
        "--discovery-check-interval-secs", str(DISCOVERY_INTERVAL_SECONDS),
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_SECONDS),
        "--worker-startup-check-interval", "2",
        # A pod that crashed and came back (same name, new IP) gets its prefixes back within seconds, not a minute.
        "--cb-timeout-duration-secs", "15",
        "--request-timeout-secs", str(spec.runtime.max_request_seconds),
        "--shutdown-grace-period-secs", str(min(spec.runtime.max_request_seconds, 600)),
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(r.metrics_port),
        "--log-level", "info",
    ]  # fmt: skip
    if r.policy == "prefix_hash":
        args += ["--prefix-token-count", str(r.prefix_tokens), "--prefix-hash-load-factor", str(r.load_factor),
                 "--prefix-hash-balance-abs-threshold", str(r.balance_abs_threshold)]
    elif r.policy == "cache_aware":
        args += ["--balance-abs-threshold", str(r.balance_abs_threshold)]
    return args


def _metadata(meta: Obj, name: str, owner: Obj) -> Obj:
    return {"name": name, "namespace": meta["namespace"], "labels": router_labels(meta["name"]),
            "ownerReferences": [owner]}


def get_manifest_configmap(meta: Obj, spec: QwenHiCacheServerSpec, owner: Obj,
                           drained: frozenset[str] = frozenset()) -> Obj:
    """The worker manifest the router re-reads on change (mounted as a directory: updates propagate)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(meta, manifest_name(meta["name"]), owner),
        "data": {MANIFEST_KEY: manifest_text(manifest(meta, spec, drained))},
    }


def _router_container(spec: QwenHiCacheServerSpec) -> Obj:
    r = spec.router

    def probe(path: str, period: int, failures: int) -> Obj:
        return {"httpGet": {"path": path, "port": ROUTER_HTTP_PORT_NAME}, "periodSeconds": period,
                "timeoutSeconds": 3, "failureThreshold": failures}

    return {
        "name": "smg",
        "image": r.image,
        "imagePullPolicy": r.image_pull_policy,
        "command": ["smg", "launch"],
        "args": router_args(spec),
        "ports": [
            {"name": ROUTER_HTTP_PORT_NAME, "containerPort": r.port, "protocol": "TCP"},
            {"name": ROUTER_METRICS_PORT_NAME, "containerPort": r.metrics_port, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": r.cpu, "memory": r.memory},
            "limits": {"cpu": _double(r.cpu), "memory": r.memory},
        },
        "volumeMounts": [{"name": "workers", "mountPath": MANIFEST_DIR, "readOnly": True}],
        "startupProbe": probe("/liveness", 2, 30),
        "livenessProbe": probe("/liveness", 10, 3),
        # /readiness is 503 until at least one worker is healthy: clients never reach an empty router.
        "readinessProbe": probe("/readiness", 5, 2),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }


def _double(cpu: str) -> str:
    """Twice `cpu`, written as the API server stores it (whole cores without a suffix)."""
    milli = int(units.quantity(cpu) * 2000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def get_router_deployment(meta: Obj, spec: QwenHiCacheServerSpec, owner: Obj) -> Obj:
    """The router pods. No service account token (file discovery reads no API); restarts are harmless."""
    name = meta["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(meta, router_name(name), owner),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": router_selector(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": router_labels(name)},
                "spec": {
                    "containers": [_router_container(spec)],
                    "volumes": [{"name": "workers", "configMap": {"name": manifest_name(name)}}],
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": min(spec.runtime.max_request_seconds, 600) + 10,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def get_router_service(meta: Obj, spec: QwenHiCacheServerSpec, owner: Obj) -> Obj:
    """`<server>-router`: the router pods' HTTP and metrics ports (the client Service also targets them)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(meta, router_name(meta["name"]), owner),
        "spec": {
            "type": "ClusterIP",
            "selector": router_selector(meta["name"]),
            "ports": [
                {"name": ROUTER_HTTP_PORT_NAME, "port": spec.router.port, "targetPort": ROUTER_HTTP_PORT_NAME},
                {"name": ROUTER_METRICS_PORT_NAME, "port": spec.router.metrics_port,
                 "targetPort": ROUTER_METRICS_PORT_NAME},
            ],
        },
    }


def route_client_service(client: Obj, meta: Obj, spec: QwenHiCacheServerSpec) -> Obj:
    """The client Service, re-pointed at the router pods (same name and port: clients change nothing)."""
    svc = json.loads(json.dumps(client))
    svc["spec"]["selector"] = router_selector(meta["name"])
    svc["spec"]["ports"] = [{"name": ROUTER_HTTP_PORT_NAME, "port": spec.runtime.port,
                             "targetPort": ROUTER_HTTP_PORT_NAME}]
    return svc


def router_objects(client: Obj, meta: Obj, spec: QwenHiCacheServerSpec, owner: Obj, manifest: bool) -> list[Obj]:
    """The client Service re-pointed at the router (`route_client_service`), then the router's own objects:
    the worker manifest (unless `manifest` is False), its Service and its Deployment."""
    return [route_client_service(client, meta, spec),
            *([get_manifest_configmap(meta, spec, owner)] if manifest else []),
            get_router_service(meta, spec, owner), get_router_deployment(meta, spec, owner)]


def router_status(spec: QwenHiCacheServerSpec, meta: Obj) -> status_model.Router:
    """The static half of `status.router` (worker health is added by the shell from the router's API)."""
    r = spec.router
    name, ns = meta["name"], meta["namespace"]
    hashed = r.policy == "prefix_hash"
    return status_model.Router(endpoint=f"http://{name}.{ns}.svc.cluster.local:{spec.runtime.port}", policy=r.policy,
                               prefix_tokens=r.prefix_tokens if hashed else None,
                               load_factor=r.load_factor if hashed else None, replicas=r.replicas, image=r.image,
                               smg_version=SMG_VERSION)
