"""Kopf wiring: every trigger funnels into `reconciler.reconcile`. Import this module to register them."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import kopf
from pydantic import ValidationError

from . import driver, metrics, reconciler, rollout
from .constants import MANAGER, selector
from .kube import Kube, load_api_client
from .plan import parse_spec
from .spec import GROUP, PLURAL, VERSION
from .status_model import restart_of

RESYNC_SECONDS = float(os.environ.get("QWEN_HICACHE_RESYNC_SECONDS", "60"))
ROLLOUT_POLL_SECONDS = float(os.environ.get("QWEN_HICACHE_ROLLOUT_POLL_SECONDS", "2"))
ROLLOUT_WORKERS = int(os.environ.get("QWEN_HICACHE_ROLLOUT_WORKERS", "8"))
ROLLOUT_FULL_STEP_SECONDS = float(os.environ.get("QWEN_HICACHE_ROLLOUT_FULL_STEP_SECONDS", "10"))
CREATE_WORKERS = int(os.environ.get("QWEN_HICACHE_CREATE_WORKERS", "2"))
_kube: Kube | None = None
_steps: driver.StepPool | None = None
_creates: driver.StepPool | None = None


def steps() -> driver.StepPool:
    """Threads for rollout steps and child events, apart from Kopf's handler executor (never starved by them)."""
    global _steps
    if _steps is None:
        _steps = driver.StepPool(ROLLOUT_WORKERS)
    return _steps


def creates() -> driver.StepPool:
    """Threads for first reconciles of new resources only. Kopf's executor is one FIFO queue: 50 restarts at
    once put 50 full reconciles of existing servers in front of a new one (measured: 8 s of its 13 s)."""
    global _creates
    if _creates is None:
        _creates = driver.StepPool(CREATE_WORKERS, name="create")
    return _creates


def kube() -> Kube:
    """The process-wide client (created lazily so importing this module needs no cluster)."""
    global _kube
    if _kube is None:
        _kube = Kube(load_api_client())
    return _kube


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Kubernetes event on the resource, via Kopf's poster (batched, rate-limited)."""
    kopf.event(body, type=type_, reason=reason, message=message[:1024])


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account, at the address the kubelet injects (KUBERNETES_SERVICE_HOST/_PORT, as
    client-go's in-cluster config does, so no cluster DNS is needed); elsewhere $KUBECONFIG, read at login time."""
    info = kopf.login_with_service_account(**kwargs)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is not None and host and port:
        info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    return info or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep Kopf's own bookkeeping in annotations under our group, never in `status`."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.execution.max_workers = int(os.environ.get("QWEN_HICACHE_WORKERS", "8"))
    # Serve only the resources found at startup: scanning needs cluster-wide list/watch on CRDs and namespaces,
    # which the namespace-scoped install must not have and the operator does not need (one CRD, installed first).
    settings.scanning.disabled = True


def _run(body: Any, logger: logging.Logger) -> reconciler.Outcome:
    with metrics.track_reconcile(body["metadata"]["namespace"], body["metadata"]["name"]):
        outcome = reconciler.reconcile(kube(), dict(body), post_event)
        if outcome.applied or outcome.status_written:
            logger.info("reconciled: applied=%s status_written=%s", outcome.applied, outcome.status_written)
        if outcome.error:
            raise kopf.TemporaryError(outcome.error, delay=30)
        return outcome


@kopf.on.create(GROUP, VERSION, PLURAL)
async def create_resource(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A new resource: its first reconcile runs in its own lane, never queued behind updates of others."""
    await creates().run(_run, body, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_resource(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Spec changes and operator restarts."""
    _run(body, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Periodic level-based resync: repairs drift nobody told us about; a no-op writes nothing."""
    _run(body, logger)


@kopf.on.event("apps", "v1", "statefulsets", labels={"app.kubernetes.io/managed-by": MANAGER})
async def child_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A StatefulSet we own changed (readiness, deletion): refresh its owner's status. Kopf never retries event
    handlers, so a failure is retried here within seconds, then left to the resync timer (never raised)."""
    owner = body.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/instance")
    if owner:  # reconcile() reads the owner itself; a missing owner (deleted) is a no-op there
        ref = {"metadata": {"namespace": body["metadata"]["namespace"], "name": owner}}
        await driver.retrying(lambda: steps().run(_run, ref, logger), logger, f"reconcile of {owner}")


def rollout_wanted(spec: Any, status: Any, **_: Any) -> bool:
    """A restart is running, or the pods' target changed and one must start."""
    try:
        target = rollout.target_of(parse_spec(dict(spec)))
    except ValidationError:
        return False
    return rollout.is_active(restart_of(dict(status or {})), target)


@kopf.daemon(GROUP, VERSION, PLURAL, when=rollout_wanted, cancellation_timeout=10, initial_delay=1)
async def drive_rollout(stopped: kopf.DaemonStopped, name: str, namespace: str, logger: logging.Logger,
                        **_: Any) -> None:
    """Poll quickly while a rollout runs (pods restart on their own schedule); stops when it completes.
    Async: it waits on the event loop, and each step holds a thread of `steps()` only while it runs."""
    gate = driver.QuietGate(ROLLOUT_FULL_STEP_SECONDS)

    def wanted(server: dict[str, Any]) -> bool:
        return rollout_wanted(server.get("spec") or {}, server.get("status"))

    async def step(server: dict[str, Any]) -> None:
        pods = await steps().run(kube().list, "v1", "Pod", namespace, selector(name))
        mark, now = driver.world_mark(server, pods), time.monotonic()
        if gate.due(mark, now):
            outcome = await steps().run(_run, server, logger)
            gate.stepped(mark, now, acted=outcome.rollout_actions > 0)

    await driver.drive(fetch=lambda: steps().run(kube().get_server, namespace, name), wanted=wanted,
                       step=step, sleep=stopped.wait, stopped=lambda: bool(stopped), poll=ROLLOUT_POLL_SECONDS,
                       log=logger)
