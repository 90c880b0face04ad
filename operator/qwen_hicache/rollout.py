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


def target(config_hash: str, restart: str | None) -> str:
    """What every pod should run: `<config hash>/<restart id>` (a pod's annotations spell the same)."""
    return f"{config_hash}/{restart or ''}"


def target_of(spec: QwenHiCacheServerSpec) -> str:
    """The target of a spec (derive.Derived has it for a planned one)."""
    return target(config_hash(spec), spec.restart)


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
    terminating: bool = False
    """deletionTimestamp is set: still listed (preStop may run), but already on its way out."""

    @property
    def available(self) -> bool:
        """Serving: Ready and not being deleted."""
        return self.ready and not self.terminating

    @staticmethod
    def from_pod(pod: Obj) -> PodView:
        meta, status = pod["metadata"], pod.get("status") or {}
        ann = meta.get("annotations") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return PodView(
            name=meta["name"],
            ordinal=_ordinal(meta["name"]),
            uid=meta.get("uid", ""),
            ready=ready,
            ip=status.get("podIP"),
            target=f"{ann.get(CONFIG_HASH_ANNOTATION, '')}/{ann.get(RESTART_ANNOTATION, '')}",
            fingerprint=ann.get(FINGERPRINT_ANNOTATION, ""),
            terminating=bool(meta.get("deletionTimestamp")),
        )


def _ordinal(name: str) -> int:
    return int(name.rsplit("-", 1)[-1])


@dataclass(frozen=True)
class Action:
    """One side effect for the shell: `canary`, `delete`, `baseline` (read the new pod's storage counters) or
    `verify` on a pod."""

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


STORAGE_COUNTER = "sglang:cached_tokens_total{storage}"
"""Prompt tokens the pod has served from the disk tier since it started (engine.cache_metrics key)."""
RECOVERABLE = ("PodNotReady", "WarmCheckFailed")
"""Pauses the pod itself can end (it becomes ready, it answers the canary); the others need a human."""


def allowed_down(max_unavailable: int, replicas: int) -> int:
    """Pods that may be down at once: maxUnavailable, but never all replicas when there are several (a single
    replica can only restart by going down). The PodDisruptionBudget uses the same number."""
    return max(1, min(max_unavailable, replicas - 1))


def unavailable(pods: list[PodView], replicas: int) -> int:
    """Desired replicas minus those serving: missing, unready and terminating pods all count as down."""
    return max(0, replicas - sum(1 for p in pods if p.available and p.ordinal < replicas))


def may_take_down(pods: list[PodView], name: str, uid: str, replicas: int, policy: Policy) -> bool:
    """Whether deleting this incarnation now keeps the promise (the shell asks again right before it deletes,
    with freshly listed pods). Deleting a pod that is not serving costs nothing."""
    pod = next((p for p in pods if p.name == name), None)
    if pod is None or pod.uid != uid or not pod.available:
        return True
    return unavailable(pods, replicas) + 1 <= allowed_down(policy.max_unavailable, replicas)


def _seconds(a: str, b: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(b, fmt) - datetime.strptime(a, fmt)).total_seconds()


def _clock(entry: Obj, key: str) -> str:
    """When a wait began: `key`, or later when the entry was carried into a new rollout (a fresh timeout)."""
    return max(entry[key], entry.get("since", entry[key]))


@dataclass
class _Pass:
    """One planning pass: what the cluster has, and how many serving pods this pass is about to take down."""

    pods: dict[str, PodView]
    replicas: int
    policy: Policy
    now: str
    taken: int = 0

    @property
    def cap(self) -> int:
        return allowed_down(self.policy.max_unavailable, self.replicas)

    @property
    def down(self) -> int:
        return unavailable(list(self.pods.values()), self.replicas)

    def take_one(self) -> bool:
        """Reserve one more pod going down in this pass, if the budget has room."""
        if self.down + self.taken + 1 > self.cap:
            return False
        self.taken += 1
        return True


def _fresh(target: str, pods: list[PodView], now: str, carried: list[Obj] | None = None) -> Obj:
    carried = carried or []
    busy = {e["pod"] for e in carried}
    outdated = sorted((p for p in pods if p.target != target and p.name not in busy), key=lambda p: -p.ordinal)
    phase = "Rolling" if outdated or carried else "Complete"
    return {"id": target, "phase": phase, "pending": [p.name for p in outdated], "done": [], "inFlight": carried,
            "results": [], "started": now, **({} if phase == "Rolling" else {"finished": now})}


def _carry(prev: Obj | None, now: str) -> list[Obj]:
    """In-flight pods of a rollout that is being replaced: they stay in flight (their pods may be down), with
    fresh timeouts, so the new rollout never takes another pod down while they are."""
    if not prev or prev.get("phase") not in ("Rolling", "Paused"):
        return []
    return [{**copy.deepcopy(e), "since": now} for e in prev.get("inFlight") or []]


def _pause(rs: Obj, reason: str, message: str) -> Obj:
    rs.update(phase="Paused", reason=reason, message=message)
    return rs


def _resume(rs: Obj) -> None:
    rs["phase"] = "Rolling"
    rs.pop("reason", None)
    rs.pop("message", None)


def _requeue(rs: Obj, entry: Obj) -> None:
    """The pod came back with an older template (the rollout was retargeted meanwhile): roll it again later."""
    rs["inFlight"].remove(entry)
    rs["pending"].insert(0, entry["pod"])


def _gone(pod: PodView | None, entry: Obj) -> bool:
    """The incarnation this entry was about to restart is gone or going (deleted by us before a crash, by
    someone else, or replaced): nothing left to delete."""
    return pod is None or pod.uid != entry["uid"] or pod.terminating


def _successor(pod: PodView | None, entry: Obj) -> bool:
    return bool(pod and pod.uid != entry["uid"] and pod.available and pod.ip)


def _check(entry: Obj, pod: PodView) -> Action:
    """Verify, but only once a baseline of this incarnation's storage counters is on record (see `verified`)."""
    kind = "verify" if entry.get("baselineUid") == pod.uid else "baseline"
    return Action(kind, entry["pod"], pod.uid, pod.ip or "")


def _advance(rs: Obj, entry: Obj, ctx: _Pass) -> Action | None:
    pod = ctx.pods.get(entry["pod"])
    if entry["step"] in ("Canary", "Delete") and _gone(pod, entry):
        entry.update(step="WaitingReady", deletedAt=ctx.now)
    step = entry["step"]
    if step == "Canary":
        return Action("canary", entry["pod"], entry["uid"], pod.ip or "") if pod else None
    if step == "Delete":
        if pod and pod.available and not ctx.take_one():
            return None  # another pod went down meanwhile: delete on a later pass
        return Action("delete", entry["pod"], entry["uid"])
    if step == "WaitingReady":
        return _waiting(rs, entry, pod, ctx)
    return _verifying(rs, entry, pod, ctx)


def _waiting(rs: Obj, entry: Obj, pod: PodView | None, ctx: _Pass) -> Action | None:
    if _successor(pod, entry):
        assert pod is not None
        if pod.target != rs["id"]:
            _requeue(rs, entry)
            return None
        entry.update(step="Verify", readyAt=ctx.now, readyUid=pod.uid)
        return _check(entry, pod)
    if _seconds(_clock(entry, "deletedAt"), ctx.now) > ctx.policy.timeout_seconds:
        _pause(rs, "PodNotReady", f"pod {entry['pod']} did not become ready within {ctx.policy.timeout_seconds}s "
                                  "after its restart; the rollout resumes by itself once it is ready (see its "
                                  "events and logs), or set spec.restart to a new value to start over")
    return None


def _verifying(rs: Obj, entry: Obj, pod: PodView | None, ctx: _Pass) -> Action | None:
    ready_uid = entry.setdefault("readyUid", pod.uid if pod else "")
    if pod is None or pod.uid != ready_uid or pod.terminating:  # deleted again before its check: wait again
        for key in ("readyAt", "readyUid", "baselineUid", "baselineStorage"):
            entry.pop(key, None)
        entry.update(step="WaitingReady", uid=ready_uid, deletedAt=ctx.now)
        return None
    if pod.target != rs["id"]:
        _requeue(rs, entry)
        return None
    if not pod.available or not pod.ip:
        return None
    if rs["phase"] == "Rolling" and _seconds(_clock(entry, "readyAt"), ctx.now) > ctx.policy.timeout_seconds:
        _pause(rs, "WarmCheckFailed", f"pod {entry['pod']} did not answer the warm-start canary within "
                                      f"{ctx.policy.timeout_seconds}s; the check is retried and the rollout "
                                      "resumes by itself once it answers")
        return None
    return _check(entry, pod)


def _start_next(rs: Obj, ctx: _Pass) -> list[Obj]:
    """Take pending pods into flight while the budget allows; return the new entries."""
    def takes_down(e: Obj) -> bool:
        pod = ctx.pods.get(e["pod"])
        return e["step"] in ("Canary", "Delete") and not _gone(pod, e) and bool(pod and pod.available)

    committed = sum(1 for e in rs["inFlight"] if takes_down(e))
    started = []
    while rs["pending"] and len(rs["inFlight"]) < ctx.cap:
        name = rs["pending"][0]
        pod = ctx.pods.get(name)
        if pod is not None and pod.target == rs["id"] and not pod.terminating:
            rs["pending"].pop(0)
            rs["done"].append(name)  # already replaced by someone else: nothing to restart
            continue
        if pod is not None and pod.available:
            if ctx.down + committed + 1 > ctx.cap:
                break  # enough pods are down already: wait rather than exceed maxUnavailable
            committed += 1
        rs["pending"].pop(0)
        started.append(_new_entry(name, pod, ctx))
        rs["inFlight"].append(started[-1])
    return started


def _new_entry(name: str, pod: PodView | None, ctx: _Pass) -> Obj:
    if pod is None or pod.terminating:  # already down (deleted by someone else): wait for its successor
        return {"pod": name, "step": "WaitingReady", "uid": pod.uid if pod else "", "since": ctx.now,
                "deletedAt": ctx.now}
    step = "Canary" if pod.available and pod.ip else "Delete"
    return {"pod": name, "step": step, "uid": pod.uid, "since": ctx.now,
            "sameCache": pod.fingerprint == ctx.policy.fingerprint}


def _drop_scaled_away(rs: Obj, replicas: int) -> None:
    """Scaled down mid-rollout: pods at ordinals >= replicas will not come back; they are done, not waited for."""
    gone = [n for n in rs["pending"] if _ordinal(n) >= replicas]
    gone += [e["pod"] for e in rs["inFlight"] if _ordinal(e["pod"]) >= replicas]
    rs["pending"] = [n for n in rs["pending"] if _ordinal(n) < replicas]
    rs["inFlight"] = [e for e in rs["inFlight"] if _ordinal(e["pod"]) < replicas]
    rs["done"] += gone


def _paused_actions(rs: Obj, ctx: _Pass) -> list[Action] | None:
    """While paused: None when the pause is over (the rollout goes on), else the checks still worth retrying."""
    if rs.get("reason") not in RECOVERABLE:
        return []
    if not rs["inFlight"] or any(e["step"] == "WaitingReady" and _successor(ctx.pods.get(e["pod"]), e)
                                 for e in rs["inFlight"]):
        _resume(rs)  # scaled away, or the pod became ready: verify it and go on
        return None
    return [a for e in list(rs["inFlight"]) if e["step"] == "Verify" and (a := _verifying(rs, e, ctx.pods.get(
        e["pod"]), ctx))]


def _finish_if_done(rs: Obj, now: str) -> None:
    if rs["phase"] == "Rolling" and not rs["inFlight"] and not rs["pending"]:
        rs.update(phase="Complete", finished=now)


def plan_rollout(prev: Obj | None, pods: list[PodView], target: str, replicas: int, policy: Policy,
                 now: str) -> tuple[Obj, list[Action]]:
    """The next restart status and the side effects to perform now (at most one per in-flight pod)."""
    if prev is None or prev.get("id") != target:
        if prev is None and not any(p.target != target for p in pods):
            return _fresh(target, [], now), []
        rs = _fresh(target, pods, now, _carry(prev, now))
    else:
        rs = copy.deepcopy(prev)
    if rs["phase"] not in ("Rolling", "Paused"):
        return rs, []
    ctx = _Pass({p.name: p for p in pods}, replicas, policy, now)
    _drop_scaled_away(rs, replicas)
    if rs["phase"] == "Paused" and (retries := _paused_actions(rs, ctx)) is not None:
        return rs, retries
    actions = [a for e in list(rs["inFlight"]) if (a := _advance(rs, e, ctx))]
    if rs["phase"] == "Rolling":
        actions += [a for e in _start_next(rs, ctx) if (a := _advance(rs, e, ctx))]
    if rs["phase"] != "Rolling":
        return rs, []
    _finish_if_done(rs, now)
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


def baseline_read(rs: Obj, pod: str, uid: str, metrics: dict[str, float]) -> Obj:
    """The new pod's storage counter before any canary reaches it; persisted in status before the canary is
    sent, so a retried check (after a crash or a failed status write) still sees what the first one loaded."""
    rs = copy.deepcopy(rs)
    entry = _entry(rs, pod)
    if not metrics:
        entry["lastError"] = "the pod's /metrics did not answer"
        return rs
    entry.update(baselineUid=uid, baselineStorage=int(metrics.get(STORAGE_COUNTER, 0)))
    entry.pop("lastError", None)
    return rs


def verified(rs: Obj, pod: str, storage_tokens: int | None, error: str | None, policy: Policy, now: str,
             metrics: dict[str, float] | None = None) -> Obj:
    """Record the warm-start check; finish the pod, keep retrying (no answer yet), or pause (cold).

    Warm: the answer names disk tokens, or the pod's storage counter rose since the baseline (a retried
    canary is served from GPU memory, but the first one's disk read still shows in the counter). Without
    the counter a storage=0 answer proves nothing, so it is retried. `metrics`: the pod's counters after
    the replay, recorded beside the per-request evidence."""
    rs = copy.deepcopy(rs)
    entry = _entry(rs, pod)
    metrics = metrics or {}
    counter = metrics.get(STORAGE_COUNTER, 0 if metrics else None)
    if storage_tokens is None or (storage_tokens == 0 and (counter is None or "baselineStorage" not in entry)):
        entry["lastError"] = error or "no storage counters to tell a cold start from a retried check"
        return rs
    if rs["phase"] == "Paused":
        _resume(rs)  # WarmCheckFailed: it answers now
    since = int(counter - entry["baselineStorage"]) if counter is not None and "baselineStorage" in entry else 0
    warm = storage_tokens > 0 or since > 0
    expect_warm = entry.get("sameCache", True)
    rs["results"].append({
        "pod": pod, "warm": warm, "storageTokens": storage_tokens,
        "timeToReadySeconds": int(_seconds(entry["deletedAt"], entry["readyAt"])),
        **({} if expect_warm else {"newCacheNamespace": True}),
        **{key: int(value) for key, value in _evidence(metrics).items()},
        **({"metricStorageBaseline": entry["baselineStorage"]} if "baselineStorage" in entry else {}),
    })
    if not warm and expect_warm and policy.require_warm:
        return _pause(rs, "ColdStart", f"pod {pod} came back without a disk-cache hit for the canary (storage=0 "
                                       "tokens, storage counter unchanged); nothing else is restarted. Check its "
                                       "cache volume, then set spec.restart to a new value to go on (or set "
                                       "rollout.requireWarmStart: false)")
    rs["inFlight"].remove(entry)
    rs["done"].append(pod)
    _finish_if_done(rs, now)
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
