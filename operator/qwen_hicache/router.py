"""The rollout's seam to the router: take a pod out before it is deleted, put it back after its warm check.

The router's worker list is the manifest ConfigMap (render_router), written here from `status.restart`:
a pod whose restart has passed its canary (steps Delete, WaitingReady, Verify) is left out; once its
replacement served the canary from disk it leaves `inFlight` and is listed again. The list is the only
input: the router's health checks can neither re-add a pod that is not in it (a router restart reads the
same file) nor keep one that is. The shell deletes a pod only when every ready router pod says, through its
own `GET /workers`, that it no longer routes to it (absent, or `draining`): ConfigMap volume updates reach a
pod with a delay, so the file alone proves nothing. Running requests finish: the pod's preStop hook waits for
them before it flushes and stops.
"""

from __future__ import annotations

from typing import Any

from . import render_router
from . import status_model as sm
from .apply import apply_if_drifted
from .constants import owner_reference
from .drift import with_hash
from .engine import router_workers
from .gather import Live, ready_ips
from .kube import KubeClient
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]
DRAINED_STEPS = ("Delete", "WaitingReady", "Verify")


def active(spec: QwenHiCacheServerSpec | None) -> bool:
    return spec is not None and spec.router_on


def drained_pods(restart: sm.Restart | None) -> frozenset[str]:
    """Pods the rollout has taken out of the router: past their canary, not yet verified warm."""
    return frozenset(e.pod for e in (restart.in_flight if restart else []) if e.step in DRAINED_STEPS)


def manifest_key(meta: Obj) -> tuple[str, str]:
    """The manifest ConfigMap's (kind, name): gathered with the other children, applied here."""
    return "ConfigMap", render_router.manifest_name(meta["name"])


def _apply_manifest(kube: KubeClient, live: Live, meta: Obj, spec: QwenHiCacheServerSpec,
                    drained: frozenset[str], applied: list[str] | None = None) -> None:  # fmt: skip
    manifest = render_router.get_manifest_configmap(meta, spec, owner_reference(meta), drained)
    apply_if_drifted(kube, live, with_hash(manifest), applied)


def ready_to_delete(kube: KubeClient, live: Live, meta: Obj, spec: QwenHiCacheServerSpec, restart: sm.Restart,
                    pod: str, router_pods: list[Obj]) -> bool:  # fmt: skip
    """Before delete: the pod is out of the manifest and no ready router pod routes to it any more."""
    if not active(spec):
        return True
    _apply_manifest(kube, live, meta, spec, drained_pods(restart) | {pod})
    for ip in ready_ips(router_pods).values():
        workers = router_workers(ip, spec.router.port)
        if workers is None or workers.get(pod) == "ready":
            return False  # not confirmed yet: the ConfigMap has not reached that router, or it did not answer
    return True


def sync(kube: KubeClient, live: Live, meta: Obj, spec: QwenHiCacheServerSpec, restart: sm.Restart | None,
         router_pods: list[Obj], previous: sm.Router | None = None,
         applied: list[str] | None = None) -> sm.Router | None:  # fmt: skip
    """After the rollout step: the manifest for the current restart state, and `status.router`.

    A router that was running (`previous` status) and is no longer wanted is scaled to zero once (the client
    Service already points at the pods again); its objects go with the resource."""
    if not active(spec):
        if previous and spec is not None:
            dep = render_router.get_router_deployment(meta, spec, owner_reference(meta))
            dep["spec"]["replicas"] = 0
            apply_if_drifted(kube, live, with_hash(dep), applied)
        return None
    drained = drained_pods(restart)
    _apply_manifest(kube, live, meta, spec, drained, applied)
    routers = {name: router_workers(ip, spec.router.port) for name, ip in ready_ips(router_pods).items()}
    pods = [f"{meta['name']}-{i}" for i in range(spec.replicas)]
    return render_router.router_status(spec, meta).model_copy(update={
        "drained": sorted(drained),
        "ready_routers": sum(1 for w in routers.values() if w is not None),
        "workers": [sm.RouterWorker(pod=pod, routers={r: (w or {}).get(pod, "absent") for r, w in sorted(
            routers.items())}) for pod in pods],
    })
