"""Cache-aware rolling restart: a pure state machine whose whole state lives in `status.restart`.

Each outdated pod goes Canary -> Delete -> WaitingReady -> Verify. The canary prompt puts a known prefix
on disk (the preStop hook flushes it), the pod is deleted (with a uid precondition, so a pod is never
restarted twice, even if the operator dies between steps), and the replacement must become ready and
serve the replayed canary from disk (`cached_tokens_details.storage > 0`) before the next pod goes.
A timeout or a cold start pauses the rollout; a new `spec.restart` value starts a fresh one.

A pod is outdated when its template annotations name another target: a hash of the spec fields that
need new pods, plus `spec.restart`. Operator upgrades that merely render differently never roll pods.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .constants import CONFIG_HASH_ANNOTATION, FINGERPRINT_ANNOTATION, RESTART_ANNOTATION  # noqa: F401
from .spec import QwenHiCacheServerSpec

Obj = dict[str, Any]

CANARY_TOKENS_HINT = 4096
"""Canary length in characters: well past the runtime's 256-token prefetch threshold, several pages."""


def config_hash(spec: QwenHiCacheServerSpec) -> str:
    """Hash of every spec field whose change needs new pods (not replicas, rollout, restart or router; nor the
    disk's size or cap: a grown volume is expanded under the running pods, see disk_change)."""
    wire = spec.wire()
    for key in ("replicas", "restart", "rollout", "router"):  # router: its own Deployment, never new pods
        wire.pop(key, None)
    for key in ("size", "capPerRank"):
        wire.get("hicache", {}).get("disk", {}).pop(key, None)
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()[:16]


def target_of(spec: QwenHiCacheServerSpec) -> str:
    """What every pod should run: `<config hash>/<restart id>`."""
    return f"{config_hash(spec)}/{spec.restart or ''}"


def canary_prompt(name: str) -> str:
    """A deterministic prompt, unique per resource, that spans many cache pages."""
    words, i = [], 0
    while sum(len(w) + 1 for w in words) < CANARY_TOKENS_HINT:
        words.append(hashlib.sha256(f"{name}:{i}".encode()).hexdigest()[:8])
        i += 1
    return f"qwen-hicache warm-start canary for {name}: " + " ".join(words)


@dataclass(frozen=True)
class PodView:
    """What the rollout needs to know about one pod."""

    name: str
    ordinal: int
    uid: str
    ready: bool
    ip: str | None
    target: str
    fingerprint: str = ""

    @staticmethod
    def from_pod(pod: Obj) -> PodView:
        meta, status = pod["metadata"], pod.get("status") or {}
        ann = meta.get("annotations") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return PodView(
            name=meta["name"],
            ordinal=int(meta["name"].rsplit("-", 1)[-1]),
            uid=meta.get("uid", ""),
            ready=ready,
            ip=status.get("podIP"),
            target=f"{ann.get(CONFIG_HASH_ANNOTATION, '')}/{ann.get(RESTART_ANNOTATION, '')}",
            fingerprint=ann.get(FINGERPRINT_ANNOTATION, ""),
        )


@dataclass(frozen=True)
class Action:
    """One side effect for the shell: `canary`, `delete` or `verify` on a pod."""

    kind: str
    pod: str
    uid: str = ""
    ip: str = ""


@dataclass(frozen=True)
class Policy:
    max_unavailable: int
    timeout_seconds: int
    require_warm: bool
    fingerprint: str = ""
    """The cache namespace new pods use: a pod that changes namespace cannot come back warm, by design."""


def _seconds(a: str, b: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(b, fmt) - datetime.strptime(a, fmt)).total_seconds()


def _fresh(target: str, pods: list[PodView], now: str) -> Obj:
    outdated = sorted((p for p in pods if p.target != target), key=lambda p: -p.ordinal)
    phase = "Rolling" if outdated else "Complete"
    return {"id": target, "phase": phase, "pending": [p.name for p in outdated], "done": [], "inFlight": [],
            "results": [], "started": now, **({} if outdated else {"finished": now})}


def _pause(rs: Obj, reason: str, message: str) -> Obj:
    rs.update(phase="Paused", reason=reason, message=message)
    return rs


def _advance(rs: Obj, entry: Obj, pods: dict[str, PodView], policy: Policy, now: str) -> Action | None:
    pod = pods.get(entry["pod"])
    step = entry["step"]
    if step == "Canary":
        return Action("canary", entry["pod"], entry["uid"], pod.ip or "") if pod else None
    if step == "Delete":
        return Action("delete", entry["pod"], entry["uid"])
    if step == "WaitingReady":
        if pod and pod.uid != entry["uid"] and pod.ready and pod.ip:
            entry.update(step="Verify", readyAt=now)
            return Action("verify", entry["pod"], pod.uid, pod.ip)
        if _seconds(entry["deletedAt"], now) > policy.timeout_seconds:
            _pause(rs, "PodNotReady", f"pod {entry['pod']} did not become ready within {policy.timeout_seconds}s "
                                      "after its restart; set spec.restart to a new value to retry")
        return None
    if step == "Verify" and pod and pod.ip:
        if _seconds(entry["readyAt"], now) > policy.timeout_seconds:
            _pause(rs, "WarmCheckFailed", f"pod {entry['pod']} did not answer the warm-start canary within "
                                          f"{policy.timeout_seconds}s")
            return None
        return Action("verify", entry["pod"], pod.uid, pod.ip)
    return None


def _cap(policy: Policy, replicas: int) -> int:
    """Pods allowed down at once: maxUnavailable, but never all replicas when there are several."""
    return max(1, min(policy.max_unavailable, replicas - 1))


def _start_next(rs: Obj, pods: dict[str, PodView], policy: Policy, replicas: int, now: str) -> None:
    busy = {e["pod"] for e in rs["inFlight"]}
    unready_others = sum(1 for p in pods.values() if not p.ready and p.name not in busy)
    while rs["pending"] and len(rs["inFlight"]) < _cap(policy, replicas):
        name = rs["pending"][0]
        pod = pods.get(name)
        if pod is not None and pod.target == rs["id"]:
            rs["pending"].pop(0)
            rs["done"].append(name)  # already replaced by someone else: nothing to restart
            continue
        if pod is not None and pod.ready and len(rs["inFlight"]) + unready_others >= _cap(policy, replicas):
            return  # another pod is already down: wait rather than exceed maxUnavailable
        rs["pending"].pop(0)
        if pod is None:
            rs["inFlight"].append({"pod": name, "step": "WaitingReady", "uid": "", "since": now, "deletedAt": now})
        else:
            step = "Canary" if pod.ready and pod.ip else "Delete"
            rs["inFlight"].append({"pod": name, "step": step, "uid": pod.uid, "since": now,
                                   "sameCache": pod.fingerprint == policy.fingerprint})
            unready_others -= 0 if pod.ready else 1


def plan_rollout(prev: Obj | None, pods: list[PodView], target: str, replicas: int, policy: Policy,
                 now: str) -> tuple[Obj, list[Action]]:
    """The next restart status and the side effects to perform now (at most one per in-flight pod)."""
    if prev is None or prev.get("id") != target:
        if prev is None and not any(p.target != target for p in pods):
            return _fresh(target, [], now), []
        rs = _fresh(target, pods, now)
    else:
        rs = copy.deepcopy(prev)
    if rs["phase"] != "Rolling":
        return rs, []
    by_name = {p.name: p for p in pods}
    _start_next(rs, by_name, policy, replicas, now)
    if not rs["inFlight"] and not rs["pending"]:  # the rest was replaced by someone else: nothing left to do
        rs.update(phase="Complete", finished=now)
        return rs, []
    actions = [a for e in rs["inFlight"] if (a := _advance(rs, e, by_name, policy, now))]
    if rs["phase"] != "Rolling":
        return rs, []
    return rs, actions


def _entry(rs: Obj, pod: str) -> Obj:
    return next(e for e in rs["inFlight"] if e["pod"] == pod)


def canary_sent(rs: Obj, pod: str, tokens: int | None, error: str | None) -> Obj:
    """Canary done (or impossible): the pod may be deleted next. Recorded so the result can be explained."""
    rs = copy.deepcopy(rs)
    _entry(rs, pod).update(step="Delete", canaryTokens=tokens or 0, **({"canaryError": error} if error else {}))
    return rs


def deleted(rs: Obj, pod: str, now: str) -> Obj:
    """The old pod is gone (or was already replaced): wait for its successor."""
    rs = copy.deepcopy(rs)
    _entry(rs, pod).update(step="WaitingReady", deletedAt=now)
    return rs


def verified(rs: Obj, pod: str, storage_tokens: int | None, error: str | None, policy: Policy, now: str,
             metrics: dict[str, float] | None = None) -> Obj:
    """Record the warm-start check; finish the pod, keep retrying (no answer yet), or pause (cold).

    `metrics`: the pod's own counters after the replay (`sglang:cached_tokens_total{storage}`,
    `sglang:prefetched_tokens_total`), recorded beside the per-request evidence."""
    rs = copy.deepcopy(rs)
    entry = _entry(rs, pod)
    if storage_tokens is None:
        entry["lastError"] = error or "no answer"
        return rs
    warm = storage_tokens > 0
    expect_warm = entry.get("sameCache", True)
    rs["results"].append({
        "pod": pod, "warm": warm, "storageTokens": storage_tokens,
        "timeToReadySeconds": int(_seconds(entry["deletedAt"], entry["readyAt"])),
        **({} if expect_warm else {"newCacheNamespace": True}),
        **{key: int(value) for key, value in _evidence(metrics or {}).items()},
    })
    if not warm and expect_warm and policy.require_warm:
        return _pause(rs, "ColdStart", f"pod {pod} came back without a disk-cache hit for the canary "
                                       "(storage=0 tokens); nothing else is restarted")
    rs["inFlight"].remove(entry)
    rs["done"].append(pod)
    if not rs["inFlight"] and not rs["pending"]:
        rs.update(phase="Complete", finished=now)
    return rs


def _evidence(metrics: dict[str, float]) -> dict[str, float]:
    """The runtime's storage counters, renamed for status (absent counters are simply not reported)."""
    names = {"sglang:cached_tokens_total{storage}": "metricStorageCachedTokens",
             "sglang:prefetched_tokens_total": "metricPrefetchedTokens"}
    return {names[k]: v for k, v in metrics.items() if k in names}


def is_active(restart_status: Obj | None, target: str) -> bool:
    """Whether a rollout is running or must start (drives the fast polling daemon)."""
    if not restart_status:
        return False
    return restart_status.get("id") != target or restart_status.get("phase") == "Rolling"
