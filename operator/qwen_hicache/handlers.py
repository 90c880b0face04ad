"""Kopf wiring: every trigger funnels into `reconciler.reconcile`. `register(settings)` puts the handlers in a
registry (Kopf's default one unless given); nothing is registered by importing this module, and nothing reads
the environment: the settings come from `Settings.load()` at start-up (cli.py) or from the caller (tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
from pydantic import ValidationError

from . import driver, indexed, metrics, reconciler, rollout
from .constants import INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER, NAME_LABEL, SERVER_APP
from .kube import Kube, KubeClient, load_api_client
from .plan import parse_spec
from .settings import Settings
from .spec import GROUP, PLURAL, VERSION
from .status_model import restart_of

RESOURCE = (GROUP, VERSION, PLURAL)
WORKLOADS = {"child_changed": ("apps", "v1", "statefulsets"),
             "group_changed": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")}
"""The kinds a server's serving workload takes (one node per replica, or LeaderWorkerSet groups), by the id of the
event handler that watches them. Without the LeaderWorkerSet API (no LWS installed) Kopf serves only the
StatefulSets: it logs once at start-up that the resource is unresolved and watches nothing for it (resources are
scanned at start-up only: an LWS installed later is watched after the operator's next restart)."""


def instance_pods(body: Any, namespace: str, labels: Any, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Kopf index of every pod the operator made (serving and router) by (namespace, server), whole: a pass reads
    its pods here instead of listing them (indexed.py), and the rollout poll its serving pods' marks. One index of
    pods, so each pod event is indexed once."""
    return indexed.pod_entry(body, namespace, labels)


def serving_pods(pods: indexed.PodsIndex | None, namespace: str, name: str) -> list[dict[str, Any]]:
    """The server's serving pods in the index (router pods carry another name label and stay out)."""
    found = pods.get((namespace, name), []) if pods is not None else []
    return [p for p in found if ((p.get("metadata") or {}).get("labels") or {}).get(NAME_LABEL) == SERVER_APP]


def _ref(body: Any) -> dict[str, Any]:
    """Namespace and name only: a retry reads the resource afresh and keeps no Kopf body alive."""
    return {"metadata": {"namespace": body["metadata"]["namespace"], "name": body["metadata"]["name"]}}


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Kubernetes event on the resource, via Kopf's poster (batched, rate-limited)."""
    kopf.event(body, type=type_, reason=reason, message=message[:1024])


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account, at the address the kubelet injects (KUBERNETES_SERVICE_HOST/_PORT, as
    client-go's in-cluster config does, so no cluster DNS is needed); elsewhere $KUBECONFIG, read at login time."""
    info = kopf.login_with_service_account(**kwargs)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is not None and host and port:
        info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    return info or kopf.login_with_kubeconfig(**kwargs)


def rollout_wanted(spec: Any, status: Any, **_: Any) -> bool:
    """A restart is running, or the pods' target changed and one must start."""
    try:
        target = rollout.target_of(parse_spec(dict(spec)))
    except ValidationError:
        return False
    return rollout.is_active(restart_of(dict(status or {})), target)


class Operator:
    """The handlers of one operator process, with its settings, its client and its thread pools."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kube: Kube | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """Kopf's event loop (captured at start-up): a sync handler hands its retries to it."""
        self.steps = driver.StepPool(settings.rollout_workers)
        """Threads for rollout steps and child events, apart from Kopf's handler executor (never starved)."""
        self.creates = driver.StepPool(settings.create_workers, name="create")
        """Threads for first reconciles only. Kopf's executor is one FIFO queue: 50 restarts at once put 50 full
        reconciles of existing servers in front of a new one (measured: 8 s of its 13 s)."""

    def kube(self) -> Kube:
        """The process-wide client (created at the first call, so registering needs no cluster)."""
        if self._kube is None:
            self._kube = Kube(load_api_client(), self.settings.node_cache_seconds, self.settings.node_sizing_check)
        return self._kube

    async def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        """Keep Kopf's own bookkeeping in annotations under our group, never in `status`."""
        self._loop = asyncio.get_running_loop()
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.execution.max_workers = self.settings.workers
        # Serve only the resources found at startup: scanning needs cluster-wide list/watch on CRDs and namespaces,
        # which the namespace-scoped install must not have and the operator does not need (one CRD, installed first).
        settings.scanning.disabled = True

    def client(self, pods: indexed.PodsIndex | None) -> KubeClient:
        """The client of one pass: its pod list from Kopf's pod index when the handler was given it."""
        return self.kube() if pods is None else indexed.IndexedPods(self.kube(), pods)

    def run(self, body: Any, logger: logging.Logger, pods: indexed.PodsIndex | None = None) -> reconciler.Outcome:
        with metrics.track_reconcile(body["metadata"]["namespace"], body["metadata"]["name"]):
            outcome = reconciler.reconcile(self.client(pods), dict(body), post_event)
            if outcome.applied or outcome.status_written:
                logger.info("reconciled: applied=%s status_written=%s", outcome.applied, outcome.status_written)
            if outcome.namespace_terminating:
                logger.info("the namespace is being deleted: nothing to converge")
            if outcome.error:
                raise kopf.TemporaryError(outcome.error, delay=30)
            return outcome

    async def create_resource(self, body: kopf.Body, logger: logging.Logger,
                              instance_pods: indexed.PodsIndex | None = None, **_: Any) -> None:  # fmt: skip
        """A new resource: its first reconcile runs in its own lane, never queued behind updates of others. A failed
        pass is retried here (see `_retry`), never by Kopf."""
        ref = _ref(body)
        await self._retry(lambda: self.creates.run(self.run, ref, logger, instance_pods), ref, logger)

    def reconcile_resource(self, body: kopf.Body, logger: logging.Logger,
                           instance_pods: indexed.PodsIndex | None = None, **_: Any) -> None:  # fmt: skip
        """Spec changes and operator restarts: one pass now; a failed one is retried on the event loop in the step
        pool (see `_retry`), so the handler itself never fails."""
        try:
            self.run(body, logger, instance_pods)
        except Exception as err:  # noqa: BLE001 - retried below, then left to the resync timer
            logger.info("reconcile failed, retrying in %.1fs: %s", driver.RETRY_SECONDS[0], err)
            assert self._loop is not None, "configure() runs at start-up"
            ref = _ref(body)
            later = self._retry(lambda: self.steps.run(self.run, ref, logger, instance_pods), ref, logger,
                                driver.RETRY_SECONDS[0])
            asyncio.run_coroutine_threadsafe(later, self._loop)

    async def _retry(self, attempt: Callable[[], Awaitable[object]], ref: dict[str, Any], logger: logging.Logger,
                     after: float = 0) -> None:
        """Run a pass (after `after` seconds) until it succeeds, within seconds (driver.retrying), then leave it to
        the resync timer.

        Why not Kopf's retry (raising from a create/update handler): Kopf keeps a failed handler's retry state in
        annotations of the resource, a patch on failure, a "touch" patch when the delay ends and one more when it
        succeeds; under API-server pressure those landed in the benchmark's no-op window as writes. Every trigger
        runs the same level-based pass, so the timer's retry is as good as Kopf's."""
        await asyncio.sleep(after)
        await driver.retrying(attempt, logger, f"reconcile of {ref['metadata']['name']}")

    def resync(self, body: kopf.Body, logger: logging.Logger, instance_pods: indexed.PodsIndex | None = None,
               **_: Any) -> None:  # fmt: skip
        """The periodic level-based resync (repairs drift nobody told us about; a no-op writes nothing). It may
        raise: Kopf retries a timer in memory, without touching the resource."""
        self.run(body, logger, instance_pods)

    def stopped(self, **_: Any) -> None:
        """The operator stops: its step threads end with it (an embedding process keeps running)."""
        self.steps.shutdown()
        self.creates.shutdown()

    def deleted(self, name: str, namespace: str, **_: Any) -> None:
        """A deleted server's series leave the operator's metrics and its versions the reconciler's memory (its children
        go with it by owner reference)."""
        metrics.forget_server(namespace, name)
        reconciler.forget(namespace, name)

    async def child_changed(self, body: kopf.Body, logger: logging.Logger, type: str | None = None,
                            instance_pods: indexed.PodsIndex | None = None, **_: Any) -> None:  # fmt: skip
        """A workload we own (StatefulSet or LeaderWorkerSet) changed (readiness, deletion): refresh its owner's
        status. An event showing the workload exactly as the last pass saw it (our own apply, the controller's
        revision or status bookkeeping) is skipped: that pass would read the same and write nothing. Kopf never
        retries event handlers, so a failure is retried here within seconds, then left to the resync timer (never
        raised)."""
        if type != "DELETED" and reconciler.workload_seen(dict(body)):
            return
        owner = body.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/instance")
        if owner:  # reconcile() reads the owner itself; a missing owner (deleted) is a no-op there
            ref = {"metadata": {"namespace": body["metadata"]["namespace"], "name": owner}}
            await driver.retrying(lambda: self.steps.run(self.run, ref, logger, instance_pods), logger,
                                  f"reconcile of {owner}")

    async def drive_rollout(self, stopped: kopf.DaemonStopped, name: str, namespace: str, logger: logging.Logger,
                            instance_pods: indexed.PodsIndex | None = None, **_: Any) -> None:  # fmt: skip
        """Poll quickly while a rollout runs (pods restart on their own schedule); stops when it completes.
        Async: it waits on the event loop, and each step holds a thread of `steps` only while it runs."""
        gate = driver.QuietGate(self.settings.rollout_full_step_seconds)

        def wanted(server: dict[str, Any]) -> bool:
            return rollout_wanted(server.get("spec") or {}, server.get("status"))

        async def step(server: dict[str, Any]) -> None:
            mark, now = driver.world_mark(server, serving_pods(instance_pods, namespace, name)), time.monotonic()
            if gate.due(mark, now):
                outcome = await self.steps.run(self.run, server, logger, instance_pods)
                gate.stepped(mark, now, acted=outcome.rollout_actions > 0)

        await driver.drive(fetch=lambda: self.steps.run(self.kube().get_server, namespace, name), wanted=wanted,
                           step=step, sleep=stopped.wait, stopped=lambda: bool(stopped),
                           poll=self.settings.rollout_poll_seconds, log=logger)

    def register(self, registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
        """Every handler, under the ids earlier releases used (Kopf keeps handler progress under them)."""
        interval = self.settings.resync_seconds
        kopf.on.login(registry=registry)(login)
        kopf.on.startup(registry=registry, id="configure")(self.configure)
        kopf.on.cleanup(registry=registry, id="stop_pools")(self.stopped)
        kopf.on.create(*RESOURCE, registry=registry, id="create_resource")(self.create_resource)
        kopf.on.resume(*RESOURCE, registry=registry, id="reconcile_resource")(self.reconcile_resource)
        kopf.on.update(*RESOURCE, registry=registry, id="reconcile_resource")(self.reconcile_resource)
        kopf.timer(*RESOURCE, registry=registry, id="resync", interval=interval, initial_delay=interval)(
            self.resync)
        kopf.on.delete(*RESOURCE, registry=registry, id="forget_metrics", optional=True)(self.deleted)
        for handler_id, workload in WORKLOADS.items():
            kopf.on.event(*workload, registry=registry, id=handler_id, labels={MANAGED_BY_LABEL: MANAGER})(
                self.child_changed)
        kopf.index("", "v1", "pods", registry=registry, id="instance_pods",
                   labels={MANAGED_BY_LABEL: MANAGER, INSTANCE_LABEL: kopf.PRESENT})(instance_pods)
        kopf.daemon(*RESOURCE, registry=registry, id="drive_rollout", when=rollout_wanted, cancellation_timeout=10,
                    initial_delay=1)(self.drive_rollout)
        return registry


def register(settings: Settings, registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """The operator's handlers with these settings, in `registry` (Kopf's default registry when None)."""
    return Operator(settings).register(registry if registry is not None else kopf.get_default_registry())
