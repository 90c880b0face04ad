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

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from .constants import CONFIG_HASH_ANNOTATION, FINGERPRINT_ANNOTATION, RESTART_ANNOTATION  # noqa: F401
from .diskusage import PreStopRecord
from .spec import QwenHiCacheServerSpec
from .status_model import OUTCOMES, PreStop, Restart, RestartEntry, RestartResult

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


@lru_cache(maxsize=4096)
def canary_prompt(name: str) -> str:
    """A deterministic prompt, unique per resource, that spans many cache pages. Every pass asks for it, so it is
    built once per name (building it was about 1 ms of a pass's CPU)."""
    words: list[str] = []
    chars = 0
    while chars < CANARY_TOKENS_HINT:
        words.append(hashlib.sha256(f"{name}:{len(words)}".encode()).hexdigest()[:8])
        chars += len(words[-1]) + 1
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
            target=target(ann.get(CONFIG_HASH_ANNOTATION, ""), ann.get(RESTART_ANNOTATION)),
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
    page_size: int = 0
    """Tokens per KV page (0: unknown): a warm canary restores every full page but the one token the runtime
    always computes, so a hit below that is only partly warm."""


STORAGE_COUNTER = "sglang:cached_tokens_total{storage}"
"""Prompt tokens the pod has served from the disk tier since it started (engine.cache_metrics key)."""
RECOVERABLE = ("PodNotReady", "WarmCheckFailed")
"""Pauses the pod itself can end (it becomes ready, it answers the canary); the others need a human."""


def allowed_down(max_unavailable: int, replicas: int) -> int:
    """Pods that may be down at once: maxUnavailable, but never all replicas when there are several (a single
    replica can only restart by going down). The PodDisruptionBudget uses the same number."""
    return max(1, min(max_unavailable, replicas - 1))


@dataclass(frozen=True)
class Restarts:
    """What a spec means for restarts (derive keeps it): what pods should run, and the rollout's rules."""

    config_hash: str
    target: str
    policy: Policy
    allowed_down: int


def restarts(spec: QwenHiCacheServerSpec, fingerprint: str) -> Restarts:
    """The config hash and target of `spec`, and the rollout's rules with `fingerprint` as the new pods'
    namespace. Without a disk tier nothing can come back warm, so none is required (the check still runs)."""
    h, ro, disk = config_hash(spec), spec.rollout, spec.hicache.disk.enabled
    policy = Policy(ro.max_unavailable, ro.pod_timeout_seconds, ro.require_warm_start and disk,
                    fingerprint if disk else "", spec.runtime.page_size)
    return Restarts(h, target(h, spec.restart), policy, allowed_down(ro.max_unavailable, spec.replicas))


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


def _clock(entry: RestartEntry, began: str) -> str:
    """When a wait began: `began`, or later when the entry was carried into a new rollout (a fresh timeout)."""
    return max(began, entry.since or began)


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


TAKING_DOWN = ("Canary", "Delete")
"""Steps before the pod is taken down: it still serves."""


def _fresh(target: str, pods: list[PodView], now: str, carried: list[RestartEntry] | None = None) -> Restart:
    carried = carried or []
    busy = {e.pod for e in carried}
    outdated = sorted((p for p in pods if p.target != target and p.name not in busy), key=lambda p: -p.ordinal)
    rolling = bool(outdated or carried)
    return Restart(id=target, phase="Rolling" if rolling else "Complete", pending=[p.name for p in outdated],
                   done=[], in_flight=carried, results=[], started=now, finished=None if rolling else now)


def _carry(prev: Restart | None, now: str) -> list[RestartEntry]:
    """Taken-down pods of a rollout that is being replaced: they stay in flight (their pods may be down), with
    fresh timeouts, so the new rollout never takes another pod down while they are. One still at its canary or
    delete step is up and joins the new rollout's pending pods in their order instead: kept in flight ahead of a
    higher pending group, its release would lower a LeaderWorkerSet's partition past that group."""
    if not prev or prev.phase not in ("Rolling", "Paused"):
        return []
    return [e.model_copy(deep=True, update={"since": now}) for e in prev.in_flight if e.step not in TAKING_DOWN]


def _pause(rs: Restart, reason: str, message: str) -> Restart:
    rs.phase, rs.reason, rs.message = "Paused", reason, message
    return rs


def _resume(rs: Restart) -> None:
    rs.phase, rs.reason, rs.message = "Rolling", None, None


def _requeue(rs: Restart, entry: RestartEntry) -> None:
    """The pod came back with an older template (the rollout was retargeted meanwhile): roll it again in its turn,
    highest index first like every pending pod. Not simply first: a LeaderWorkerSet group's release lowers the
    partition to its index, so a lower group rolled before a higher pending one would restart that one too, with
    no canary and no warm check."""
    rs.in_flight.remove(entry)
    rs.pending = sorted([*rs.pending, entry.pod], key=lambda name: -_ordinal(name))


def _gone(pod: PodView | None, entry: RestartEntry) -> bool:
    """The incarnation this entry was about to restart is gone or going (deleted by us before a crash, by
    someone else, or replaced): nothing left to delete."""
    return pod is None or pod.uid != entry.uid or pod.terminating


def _successor(pod: PodView | None, entry: RestartEntry) -> bool:
    return bool(pod and pod.uid != entry.uid and pod.available and pod.ip)


def _check(entry: RestartEntry, pod: PodView) -> Action:
    """Verify, but only once a baseline of this incarnation's storage counters is on record (see `verified`)."""
    kind = "verify" if entry.baseline_uid == pod.uid else "baseline"
    return Action(kind, entry.pod, pod.uid, pod.ip or "")


def _advance(rs: Restart, entry: RestartEntry, ctx: _Pass) -> Action | None:
    pod = ctx.pods.get(entry.pod)
    if entry.step in TAKING_DOWN and _gone(pod, entry):
        entry.step, entry.deleted_at = "WaitingReady", ctx.now
    if entry.step == "Canary":
        return Action("canary", entry.pod, entry.uid or "", pod.ip or "") if pod else None
    if entry.step == "Delete":
        if pod and pod.available and not ctx.take_one():
            return None  # another pod went down meanwhile: delete on a later pass
        return Action("delete", entry.pod, entry.uid or "")
    if entry.step == "WaitingReady":
        return _waiting(rs, entry, pod, ctx)
    return _verifying(rs, entry, pod, ctx)


def _waiting(rs: Restart, entry: RestartEntry, pod: PodView | None, ctx: _Pass) -> Action | None:
    if _successor(pod, entry):
        assert pod is not None
        if pod.target != rs.id:
            _requeue(rs, entry)
            return None
        entry.step, entry.ready_at, entry.ready_uid = "Verify", ctx.now, pod.uid
        return _check(entry, pod)
    if _seconds(_clock(entry, entry.deleted_at or ctx.now), ctx.now) > ctx.policy.timeout_seconds:
        _pause(rs, "PodNotReady", f"pod {entry.pod} did not become ready within {ctx.policy.timeout_seconds}s "
                                  "after its restart; the rollout resumes by itself once it is ready (see its "
                                  "events and logs), or set spec.restart to a new value to start over")
    return None


def _verifying(rs: Restart, entry: RestartEntry, pod: PodView | None, ctx: _Pass) -> Action | None:
    if entry.ready_uid is None:
        entry.ready_uid = pod.uid if pod else ""
    ready_uid = entry.ready_uid
    if pod is None or pod.uid != ready_uid or pod.terminating:  # deleted again before its check: wait again
        entry.ready_at = entry.ready_uid = entry.baseline_uid = entry.baseline_storage = None
        entry.step, entry.uid, entry.deleted_at = "WaitingReady", ready_uid, ctx.now
        return None
    if pod.target != rs.id:
        _requeue(rs, entry)
        return None
    if not pod.available or not pod.ip:
        return None
    waited = _seconds(_clock(entry, entry.ready_at or ctx.now), ctx.now)
    if rs.phase == "Rolling" and waited > ctx.policy.timeout_seconds:
        _pause(rs, "WarmCheckFailed", f"pod {entry.pod} did not answer the warm-start canary within "
                                      f"{ctx.policy.timeout_seconds}s; the check is retried and the rollout "
                                      "resumes by itself once it answers")
        return None
    return _check(entry, pod)


def _start_next(rs: Restart, ctx: _Pass) -> list[RestartEntry]:
    """Take pending pods into flight while the budget allows; return the new entries."""
    def takes_down(e: RestartEntry) -> bool:
        pod = ctx.pods.get(e.pod)
        return e.step in TAKING_DOWN and not _gone(pod, e) and bool(pod and pod.available)

    committed = sum(1 for e in rs.in_flight if takes_down(e))
    started = []
    while rs.pending and len(rs.in_flight) < ctx.cap:
        name = rs.pending[0]
        pod = ctx.pods.get(name)
        if pod is not None and pod.target == rs.id and not pod.terminating:
            rs.pending.pop(0)
            rs.done.append(name)  # already replaced by someone else: nothing to restart
            continue
        if pod is not None and pod.available:
            if ctx.down + committed + 1 > ctx.cap:
                break  # enough pods are down already: wait rather than exceed maxUnavailable
            committed += 1
        rs.pending.pop(0)
        started.append(_new_entry(name, pod, ctx))
        rs.in_flight.append(started[-1])
    return started


def _new_entry(name: str, pod: PodView | None, ctx: _Pass) -> RestartEntry:
    if pod is None or pod.terminating:  # already down (deleted by someone else): wait for its successor
        return RestartEntry(pod=name, step="WaitingReady", uid=pod.uid if pod else "", since=ctx.now,
                            deleted_at=ctx.now)
    step = "Canary" if pod.available and pod.ip else "Delete"
    return RestartEntry(pod=name, step=step, uid=pod.uid, since=ctx.now,
                        same_cache=pod.fingerprint == ctx.policy.fingerprint)


def _drop_scaled_away(rs: Restart, replicas: int) -> None:
    """Scaled down mid-rollout: pods at ordinals >= replicas will not come back; they are done, not waited for."""
    gone = [n for n in rs.pending if _ordinal(n) >= replicas]
    gone += [e.pod for e in rs.in_flight if _ordinal(e.pod) >= replicas]
    rs.pending = [n for n in rs.pending if _ordinal(n) < replicas]
    rs.in_flight = [e for e in rs.in_flight if _ordinal(e.pod) < replicas]
    rs.done += gone


def _paused_actions(rs: Restart, ctx: _Pass) -> list[Action] | None:
    """While paused: None when the pause is over (the rollout goes on), else the checks still worth retrying."""
    if rs.reason not in RECOVERABLE:
        return []
    if not rs.in_flight or any(e.step == "WaitingReady" and _successor(ctx.pods.get(e.pod), e)
                               for e in rs.in_flight):
        _resume(rs)  # scaled away, or the pod became ready: verify it and go on
        return None
    return [a for e in list(rs.in_flight) if e.step == "Verify" and (a := _verifying(rs, e, ctx.pods.get(e.pod), ctx))]


def _finish_if_done(rs: Restart, now: str) -> None:
    if rs.phase == "Rolling" and not rs.in_flight and not rs.pending:
        rs.phase, rs.finished = "Complete", now


def plan_rollout(prev: Restart | None, pods: list[PodView], target: str, replicas: int, policy: Policy,
                 now: str) -> tuple[Restart, list[Action]]:
    """The next restart status and the side effects to perform now (at most one per in-flight pod)."""
    if prev is None or prev.id != target:
        if prev is None and not any(p.target != target for p in pods):
            return _fresh(target, [], now), []
        rs = _fresh(target, pods, now, _carry(prev, now))
    else:
        rs = prev.model_copy(deep=True)
    if rs.phase not in ("Rolling", "Paused"):
        return rs, []
    ctx = _Pass({p.name: p for p in pods}, replicas, policy, now)
    _drop_scaled_away(rs, replicas)
    if rs.phase == "Paused" and (retries := _paused_actions(rs, ctx)) is not None:
        return rs, retries
    actions = [a for e in list(rs.in_flight) if (a := _advance(rs, e, ctx))]
    if rs.phase == "Rolling":
        actions += [a for e in _start_next(rs, ctx) if (a := _advance(rs, e, ctx))]
    if rs.phase != "Rolling":
        return rs, []
    _finish_if_done(rs, now)
    return rs, actions


def _entry(rs: Restart, pod: str) -> RestartEntry:
    return next(e for e in rs.in_flight if e.pod == pod)


def canary_sent(rs: Restart, pod: str, tokens: int | None, error: str | None,
                written: tuple[int, float] | None = None) -> Restart:
    """Canary done (or impossible): the pod may be deleted next. Recorded so the result can be explained.
    `written`: (bytes, seconds) the pod's disk tier has written so far (engine.write_rate), if exported."""
    rs = rs.model_copy(deep=True)
    entry = _entry(rs, pod)
    entry.step, entry.canary_tokens = "Delete", tokens or 0
    if written:
        entry.disk_written_bytes, entry.disk_write_seconds = written[0], round(written[1], 3)
    if error:
        entry.canary_error = error
    return rs


def deleted(rs: Restart, pod: str, now: str) -> Restart:
    """The old pod is gone (or was already replaced): wait for its successor."""
    rs = rs.model_copy(deep=True)
    entry = _entry(rs, pod)
    entry.step, entry.deleted_at = "WaitingReady", now
    return rs


def baseline_read(rs: Restart, pod: str, uid: str, metrics: dict[str, float]) -> Restart:
    """The new pod's storage counter before any canary reaches it; persisted in status before the canary is
    sent, so a retried check (after a crash or a failed status write) still sees what the first one loaded."""
    rs = rs.model_copy(deep=True)
    entry = _entry(rs, pod)
    if not metrics:
        entry.last_error = "the pod's /metrics did not answer"
        return rs
    entry.baseline_uid, entry.baseline_storage = uid, int(metrics.get(STORAGE_COUNTER, 0))
    entry.last_error = None
    return rs


def verified(rs: Restart, pod: str, storage_tokens: int | None, error: str | None, policy: Policy, now: str,
             metrics: dict[str, float] | None = None, prestop: PreStopRecord | None = None) -> Restart:
    """Record the warm-start check; finish the pod, keep retrying (no answer yet), or pause (cold).

    Warm: the answer names disk tokens, or the pod's storage counter rose since the baseline (a retried
    canary is served from GPU memory, but the first one's disk read still shows in the counter). Without
    the counter a storage=0 answer proves nothing, so it is retried. `metrics`: the pod's counters after
    the replay, recorded beside the per-request evidence. `prestop`: the record the pod's volume holds (its
    cache-usage sidecar), kept only when the replaced incarnation wrote it (`predecessor_prestop`)."""
    rs = rs.model_copy(deep=True)
    entry = _entry(rs, pod)
    metrics = metrics or {}
    counter = metrics.get(STORAGE_COUNTER, 0 if metrics else None)
    baseline = entry.baseline_storage
    if storage_tokens is None or (storage_tokens == 0 and (counter is None or baseline is None)):
        entry.last_error = error or "no storage counters to tell a cold start from a retried check"
        return rs
    if rs.phase == "Paused":
        _resume(rs)  # WarmCheckFailed: it answers now
    since = int(counter - baseline) if counter is not None and baseline is not None else 0
    share, warmth = canary_warmth(max(storage_tokens, since), entry.canary_tokens, policy.page_size)
    warm = warmth == "Warm"
    expect_warm = entry.same_cache is not False
    evidence = _evidence(metrics)
    rs.results.append(RestartResult(
        pod=pod, warm=warm, warmth=warmth, canary_hit_share=share, storage_tokens=storage_tokens,
        time_to_ready_seconds=int(_seconds(entry.deleted_at, entry.ready_at)),
        new_cache_namespace=None if expect_warm else True,
        metric_storage_cached_tokens=evidence.get("metricStorageCachedTokens"),
        metric_prefetched_tokens=evidence.get("metricPrefetchedTokens"),
        metric_storage_baseline=baseline,
        disk_write_bytes_per_second=_rate(entry),
        disk_written_bytes=entry.disk_written_bytes,
        pre_stop=predecessor_prestop(entry, prestop),
    ))
    if warmth == "Cold" and expect_warm and policy.require_warm:
        return _pause(rs, "ColdStart", f"pod {pod} came back without a disk-cache hit for the canary (storage=0 "
                                       "tokens, storage counter unchanged); nothing else is restarted. Check its "
                                       "cache volume, then set spec.restart to a new value to go on (or set "
                                       "rollout.requireWarmStart: false)")
    rs.in_flight.remove(entry)
    rs.done.append(pod)
    _finish_if_done(rs, now)
    return rs


def predecessor_prestop(entry: RestartEntry, record: PreStopRecord | None) -> PreStop | None:
    """The replaced incarnation's preStop outcome, or None. A record is the volume's last preStop, whoever wrote
    it: only the uid this entry replaced (a group's: any of its members', the leader's in practice) makes it this
    restart's, so an older incarnation's record is never reported again (a pod checked again after a new restart
    id was restarted again: its predecessor, and its record, are new)."""
    if record is None or record.outcome not in OUTCOMES or not record.pod_uid or not entry.uid:
        return None
    if record.pod_uid not in entry.uid.split("|"):
        return None
    finished = (datetime.fromtimestamp(record.finished_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                if record.finished_at else None)
    return PreStop(outcome=record.outcome, message=record.message or None,  # type: ignore[arg-type]
                   seconds=record.seconds, finished=finished)


def failed_prestops(old: Restart | None, new: Restart | None) -> list[RestartResult]:
    """Results this pass added whose predecessor's preStop did not end `ok` (one Warning event each)."""
    if not new:
        return []
    seen = len(old.results) if old is not None and old.id == new.id else 0
    return [r for r in new.results[seen:] if r.pre_stop and r.pre_stop.outcome != "ok"]


def canary_warmth(restored: int, canary_tokens: int | None, page_size: int) -> tuple[float | None, str]:
    """(hit share, Warm | Partial | Cold) of a replayed canary that restored `restored` tokens from disk.

    The share is of what a warm pod restores: every full page of the prompt but the last token, which the
    runtime always computes (`(tokens - 1) // page_size` pages). Unknown (None) without the canary's length or
    the page size; then any restored token counts as warm, as before. Partial: the pod restored some pages of
    the canary but not all (queued writes lost at the stop, pages evicted or unreadable)."""
    if restored <= 0:
        return (0.0 if canary_tokens else None), "Cold"
    if not canary_tokens or page_size <= 0:
        return None, "Warm"
    cacheable = (canary_tokens - 1) // page_size * page_size
    if cacheable <= 0:
        return None, "Warm"
    share = round(min(restored / cacheable, 1.0), 4)
    return share, ("Warm" if share >= 1.0 else "Partial")


MEASURE_MIN_BYTES = 1 << 30
"""A write rate counts from 1 GiB written: below, a few small commits are mostly sync latency."""


def _rate(entry: RestartEntry) -> int | None:
    if not entry.disk_written_bytes or not entry.disk_write_seconds:
        return None
    return int(entry.disk_written_bytes / entry.disk_write_seconds)


def measured_write_rate(restart: Restart | None, previous: int | None) -> int | None:
    """The disk tier's write rate for the next budget: the slowest replaced pod of the last rollout that wrote at
    least MEASURE_MIN_BYTES (two significant figures, so the budget moves only with a real change); else
    `previous` (status.cache's)."""
    rates = [r.disk_write_bytes_per_second for r in (restart.results if restart else [])
             if r.disk_write_bytes_per_second and (r.disk_written_bytes or 0) >= MEASURE_MIN_BYTES]
    if not rates:
        return previous
    slowest = min(rates)
    digits = max(len(str(slowest)) - 2, 0)
    return slowest // 10**digits * 10**digits


def _evidence(metrics: dict[str, float]) -> dict[str, int]:
    """The runtime's storage counters, renamed for status (absent counters are simply not reported)."""
    names = {"sglang:cached_tokens_total{storage}": "metricStorageCachedTokens",
             "sglang:prefetched_tokens_total": "metricPrefetchedTokens"}
    return {names[k]: int(v) for k, v in metrics.items() if k in names}


def is_active(restart: Restart | None, target: str) -> bool:
    """Whether a rollout is running or must start (drives the fast polling daemon)."""
    if not restart:
        return False
    return restart.id != target or restart.phase == "Rolling"
