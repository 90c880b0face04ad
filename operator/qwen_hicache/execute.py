"""The executor: the side effects of one pass besides applying children (which `apply` does).

The admin Secret (created once), the fingerprint recorded on each cache claim, and the rollout's actions: the
canary, the warm check and its baseline (the runtime, `engine`; with the check, the predecessor's preStop record
from the sidecar), and taking a pod down (the workload manager, after the router seam "before delete": the pod is
out of every router). The decisions are the pure modules' (rollout, claim_history); this module only performs them
and records what happened.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from . import claim_history, diskusage, engine, render, rollout, router
from .gather import Live
from .kube import KubeClient
from .plan_model import Plan
from .status_model import QwenHiCacheServerStatus, Restart

Obj = dict[str, Any]
Release = Callable[[Restart, rollout.Action], Restart | None]
"""How the workload takes one unit down (`Workload.release`, bound to the pass); None: not now."""


def ensure_admin_secret(kube: KubeClient, meta: Obj, old: QwenHiCacheServerStatus, applied: list[str]) -> str:
    """Create the admin API key Secret once (tracked in status, so a no-op reconcile does not even try)."""
    name = render.admin_secret_name(meta["name"])
    if old.admin_secret != name and kube.create_if_absent(render.get_admin_secret(meta, secrets.token_hex(32))):
        applied.append(f"Secret/{name}")
    return name


def annotate_claims(kube: KubeClient, meta: Obj, claims: list[Obj], fingerprint: str, keep: int) -> tuple[str, ...]:
    """Record the cache fingerprint, and the ones it replaced, on each cache volume claim (they outlive the
    resource); the earlier namespaces the claims hold, newest first."""
    for claim in claims:
        notes = claim["metadata"].get("annotations") or {}
        if (wanted := claim_history.annotations_for(notes, fingerprint, keep)) is not None:
            kube.annotate("v1", "PersistentVolumeClaim", meta["namespace"], claim["metadata"]["name"], wanted)
            claim["metadata"]["annotations"] = {**notes, **wanted}
    return claim_history.previous_on_claims(claims, fingerprint)


def run_rollout(kube: KubeClient, live: Live, meta: Obj, old: Restart | None, p: Plan, views: list[rollout.PodView],
                router_pods: list[Obj], release: Release, now: str) -> tuple[Restart, int]:  # fmt: skip
    """Advance the restart state machine one step and perform its side effects; the new state and how many
    actions it attempted (an attempt's effect may show only in the engine: the next step must look again).
    `views` and `release` are the workload's units and its way to take one down (pods, or LWS groups)."""
    policy = p.derived.policy
    rs, actions = rollout.plan_rollout(old, views, p.target, p.spec.replicas, policy, now)
    port, prompt = p.spec.runtime.port, rollout.canary_prompt(meta["name"])
    for act in actions:
        if act.kind == "canary":
            res = engine.generate(act.ip, port, prompt) if act.ip else engine.CanaryResult(None, None, "no pod IP")
            written = engine.write_rate(engine.cache_metrics(act.ip, port)) if act.ip else None
            rs = rollout.canary_sent(rs, act.pod, res.prompt_tokens, res.error, written)
        elif act.kind == "delete":
            if router.ready_to_delete(kube, live, meta, p.spec, rs, act.pod, router_pods) and (
                    taken := release(rs, act)) is not None:
                rs = rollout.deleted(taken, act.pod, now)
        elif act.kind == "baseline":
            rs = rollout.baseline_read(rs, act.pod, act.uid, engine.cache_metrics(act.ip, port))
        elif act.kind == "verify":
            res = engine.generate(act.ip, port, prompt)
            metrics = engine.cache_metrics(act.ip, port) if res.storage_tokens is not None else {}
            prestop = _prestop_record(act.ip, p) if res.storage_tokens is not None else None
            rs = rollout.verified(rs, act.pod, res.storage_tokens, res.error, policy, now, metrics, prestop)
    return rs, len(actions)


def _prestop_record(ip: str, p: Plan) -> diskusage.PreStopRecord | None:
    """The last preStop record on the verified pod's volume, from its cache-usage sidecar (the leader's, for a
    group: only node 0 runs the preStop); None without a disk tier or an answer."""
    if not p.spec.hicache.disk.enabled:
        return None
    usage = engine.read_usage(ip)
    return usage.prestop if usage else None
