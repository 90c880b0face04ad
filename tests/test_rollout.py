"""The restart state machine, step by step, with simulated pods (pure)."""

from __future__ import annotations

from qwen_hicache import rollout
from qwen_hicache.diskusage import PreStopRecord
from qwen_hicache.plan import parse_spec
from qwen_hicache.rollout import (
    STORAGE_COUNTER,
    PodView,
    Policy,
    allowed_down,
    baseline_read,
    canary_prompt,
    canary_sent,
    canary_warmth,
    deleted,
    failed_prestops,
    is_active,
    may_take_down,
    measured_write_rate,
    plan_rollout,
    target_of,
    verified,
)
from qwen_hicache.status_model import Restart, RestartEntry
from resources import example, variant

OLD, NEW = "h0/", "h0/r1"
POLICY = Policy(max_unavailable=1, timeout_seconds=600, require_warm=True, page_size=64)
T = [f"2026-01-01T00:00:{i:02d}Z" for i in range(60)]


def pods(target: str = OLD, n: int = 3, ready: bool = True, gen: int = 0) -> list[PodView]:
    return [PodView(f"s-{i}", i, f"uid-{i}-{gen}", ready, f"127.0.0.{10 + i}", target) for i in range(n)]


def counters(storage: int) -> dict[str, float]:
    """What engine.cache_metrics returns for a pod that has served `storage` tokens from disk."""
    return {STORAGE_COUNTER: float(storage), "sglang:prefetched_tokens_total": float(storage)}


def until_verify(rs: dict, view: list[PodView], now: str, replicas: int = 3, policy: Policy = POLICY,
                 storage: int = 0) -> dict:
    """Plan the pass that sees the successor ready (a baseline action) and record the baseline."""
    rs, actions = plan_rollout(rs, view, NEW, replicas, policy, now)
    base = next(a for a in actions if a.kind == "baseline")
    return baseline_read(rs, base.pod, base.uid, counters(storage))


def test_nothing_to_do_when_pods_are_current() -> None:
    rs, actions = plan_rollout(None, pods(NEW), NEW, 3, POLICY, T[0])
    assert rs.phase == "Complete" and actions == []
    assert not is_active(rs, NEW) and is_active(rs, "h1/")


def test_one_pod_at_a_time_canary_delete_wait_verify() -> None:
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    assert rs.pending == ["s-1", "s-0"] and [a.kind for a in actions] == ["canary"]
    assert actions[0].pod == "s-2" and actions[0].ip == "127.0.0.12"
    rs = canary_sent(rs, "s-2", 4096, None)
    rs, actions = plan_rollout(rs, pods(), NEW, 3, POLICY, T[1])
    assert [(a.kind, a.pod, a.uid) for a in actions] == [("delete", "s-2", "uid-2-0")]
    rs = deleted(rs, "s-2", T[1])
    gone = pods()[:2]
    rs, actions = plan_rollout(rs, gone, NEW, 3, POLICY, T[2])
    assert actions == [] and rs.in_flight[0].step == "WaitingReady"
    back = gone + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs, actions = plan_rollout(rs, back, NEW, 3, POLICY, T[5])
    assert [(a.kind, a.pod, a.uid) for a in actions] == [("baseline", "s-2", "uid-2-1")]
    rs = baseline_read(rs, "s-2", "uid-2-1", {})  # /metrics did not answer: no canary without a baseline
    assert plan_rollout(rs, back, NEW, 3, POLICY, T[5])[1][0].kind == "baseline"
    rs = baseline_read(rs, "s-2", "uid-2-1", {"sglang:num_requests_total": 0.0})  # no storage hit yet
    assert rs.in_flight[0].baseline_storage == 0
    rs, actions = plan_rollout(rs, back, NEW, 3, POLICY, T[5])
    assert [(a.kind, a.pod) for a in actions] == [("verify", "s-2")]
    rs = verified(rs, "s-2", 4032, None, POLICY, T[5])
    assert rs.done == ["s-2"] and rs.results[0].wire() == {
        "pod": "s-2", "warm": True, "warmth": "Warm", "canaryHitShare": 1.0, "storageTokens": 4032,
        "timeToReadySeconds": 4, "metricStorageBaseline": 0}
    rs, actions = plan_rollout(rs, back, NEW, 3, POLICY, T[6])
    assert [(a.kind, a.pod) for a in actions] == [("canary", "s-1")]


def test_a_second_pod_never_goes_down_while_another_is_unready() -> None:
    current = pods()
    current[0] = PodView("s-0", 0, "uid-0-0", False, None, OLD)
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), current, NEW, 3, POLICY, T[0])
    assert actions == [] and rs.in_flight == [] and rs.pending == ["s-2", "s-1", "s-0"]


def test_max_unavailable_never_takes_all_replicas() -> None:
    wide = Policy(max_unavailable=5, timeout_seconds=600, require_warm=True)
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, wide, T[0])
    assert len(actions) == 2 and len(rs.pending) == 1


def test_resume_after_operator_restart_does_not_delete_a_replaced_pod_twice() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    rs = canary_sent(rs, "s-2", 4096, None)
    # The operator deleted s-2 and died before recording it; its successor already runs the new target.
    replaced = pods()[:2] + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs, actions = plan_rollout(rs, replaced, NEW, 3, POLICY, T[1])
    assert [(a.kind, a.uid) for a in actions] == [("baseline", "uid-2-1")]  # no second delete: check the successor
    assert rs.in_flight[0].step == "Verify"


def test_cold_start_pauses_and_a_new_restart_id_retries() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-2", 4096, None), "s-2", T[1])
    back = pods()[:2] + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs = until_verify(rs, back, T[2])
    rs = verified(rs, "s-2", 0, None, POLICY, T[2], counters(0))
    assert rs.phase == "Paused" and rs.reason == "ColdStart" and "s-2" in rs.message
    assert "spec.restart" in rs.message
    assert plan_rollout(rs, back, NEW, 3, POLICY, T[3])[1] == []  # nothing else is restarted
    rs2, actions = plan_rollout(rs, back, "h0/r2", 3, POLICY, T[4])
    assert rs2.phase == "Rolling" and actions[0].kind == "canary"


def test_no_answer_is_retried_then_times_out() -> None:
    short = Policy(1, 3, True)
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, short, T[0])
    rs = deleted(canary_sent(rs, "s-1", None, "refused"), "s-1", T[0])
    assert rs.in_flight[0].canary_error == "refused"
    rs, actions = plan_rollout(rs, pods(n=1), NEW, 2, short, T[5])
    assert rs.phase == "Paused" and rs.reason == "PodNotReady" and actions == []


def test_target_ignores_replicas_and_follows_restart() -> None:
    base = target_of(parse_spec(example()["spec"]))
    assert target_of(parse_spec(variant(**{"spec.replicas": 7})["spec"])) == base
    assert target_of(parse_spec(variant(**{"spec.restart": "x"})["spec"])) == base + "x"
    assert target_of(parse_spec(variant(**{"spec.runtime.kvCacheDtype": "bf16"})["spec"])) != base


def test_canary_is_deterministic_and_long() -> None:
    assert canary_prompt("a") == canary_prompt("a") != canary_prompt("b")
    assert len(canary_prompt("a")) > 4000


def test_a_new_cache_namespace_is_expected_to_start_cold() -> None:
    policy = Policy(1, 600, True, fingerprint="v1-new")
    old = [PodView(f"s-{i}", i, f"uid-{i}", True, f"127.0.0.{i}", OLD, "v1-old") for i in range(2)]
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), old, NEW, 2, policy, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = old[:1] + [PodView("s-1", 1, "uid-1b", True, "127.0.0.1", NEW, "v1-new")]
    rs = until_verify(rs, back, T[2], 2, policy)
    rs = verified(rs, "s-1", 0, None, policy, T[2], counters(0))
    assert rs.phase == "Rolling" and rs.results[0].new_cache_namespace is True


def test_verify_records_the_runtime_storage_counters() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = pods(n=1) + [PodView("s-1", 1, "uid-1b", True, "127.0.0.11", NEW)]
    rs = until_verify(rs, back, T[3], 2)
    metrics = {"sglang:cached_tokens_total{storage}": 4032.0, "sglang:prefetched_tokens_total": 4032.0,
               "sglang:cached_tokens_total{device}": 7.0}
    rs = verified(rs, "s-1", 4032, None, POLICY, T[3], metrics)
    assert rs.results[0].metric_storage_cached_tokens == 4032
    assert rs.results[0].metric_prefetched_tokens == 4032 and "sglang" not in str(rs.results[0].wire())


def test_pods_replaced_by_someone_else_complete_the_rollout() -> None:
    """A pod deleted externally comes back on the new template: counted done, and the rollout completes."""
    target = "h/2"
    pods = [PodView(f"s-{i}", i, f"u{i}", True, f"10.0.0.{i}", target) for i in range(2)]
    prev = Restart.model_validate({"id": target, "phase": "Rolling", "pending": ["s-0"], "done": ["s-1"],
                                   "inFlight": [], "results": [], "started": "2026-01-01T00:00:00Z"})
    policy = Policy(1, 60, True)
    rs, actions = plan_rollout(prev, pods, target, 2, policy, "2026-01-01T00:01:00Z")
    assert actions == [] and rs.phase == "Complete" and rs.done == ["s-1", "s-0"]
    assert rs.finished == "2026-01-01T00:01:00Z"


# -- Availability from what the cluster really has --------------------------------------------------------


def _up(name: str, ordinal: int, uid: str, target: str = OLD, **kw: object) -> PodView:
    return PodView(name, ordinal, uid, True, f"127.0.0.{10 + ordinal}", target, **kw)  # type: ignore[arg-type]


def test_budget_is_max_unavailable_but_never_the_last_replica() -> None:
    assert allowed_down(1, 1) == 1  # a single replica can only restart by going down
    assert allowed_down(1, 2) == 1 and allowed_down(5, 3) == 2 and allowed_down(2, 5) == 2


def test_missing_and_terminating_pods_count_as_down() -> None:
    missing = pods()[:2]  # s-2 deleted by someone else, not yet recreated
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), missing, NEW, 3, POLICY, T[0])
    assert actions == [] and rs.in_flight == [] and rs.pending == ["s-1", "s-0"]  # one is down: wait
    terminating = pods()[:2] + [_up("s-2", 2, "uid-2-0", OLD, terminating=True)]
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), terminating, NEW, 3, POLICY, T[0])
    assert actions == [] and rs.in_flight[0].wire() == {"pod": "s-2", "step": "WaitingReady", "uid": "uid-2-0",
                                                        "since": T[0], "deletedAt": T[0]}


def test_a_done_pod_deleted_externally_blocks_the_next_restart_until_it_is_back() -> None:
    rs = Restart.model_validate({"id": NEW, "phase": "Rolling", "pending": ["s-1", "s-0"], "done": ["s-2"],
                                 "inFlight": [], "results": [], "started": T[0]})
    view = pods()[:2]  # s-2 (already restarted) was deleted by someone else
    rs, actions = plan_rollout(rs, view, NEW, 3, POLICY, T[1])
    assert actions == [] and rs.in_flight == [] and rs.pending == ["s-1", "s-0"]
    rs, actions = plan_rollout(rs, view + [_up("s-2", 2, "uid-2-9", NEW)], NEW, 3, POLICY, T[2])
    assert [(a.kind, a.pod) for a in actions] == [("canary", "s-1")]


def test_the_delete_waits_when_another_pod_went_down_after_the_canary() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    rs = canary_sent(rs, "s-2", 4096, None)
    view = pods()
    view[0] = PodView("s-0", 0, "uid-0-0", False, "127.0.0.10", OLD)  # s-0 stopped being ready meanwhile
    rs, actions = plan_rollout(rs, view, NEW, 3, POLICY, T[1])
    assert actions == [] and rs.in_flight[0].step == "Delete"
    assert not may_take_down(view, "s-2", "uid-2-0", 3, POLICY)  # the shell's re-check, on pods listed just now
    assert may_take_down(pods(), "s-2", "uid-2-0", 3, POLICY)
    assert may_take_down(view, "s-0", "uid-0-0", 3, POLICY)  # not serving: deleting it costs nothing


def test_two_deletes_in_one_pass_stay_within_max_unavailable() -> None:
    two = Policy(2, 600, True)
    rs, actions = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=4), NEW, 4, two, T[0])
    assert [a.pod for a in actions] == ["s-3", "s-2"]
    rs = canary_sent(canary_sent(rs, "s-3", 1, None), "s-2", 1, None)
    view = pods(n=4)
    view[0] = PodView("s-0", 0, "uid-0-0", False, None, OLD)  # one pod down already: room for one delete
    _, actions = plan_rollout(rs, view, NEW, 4, two, T[1])
    assert [(a.kind, a.pod) for a in actions] == [("delete", "s-3")]


def test_a_retargeted_rollout_keeps_its_in_flight_pod_and_takes_nothing_else_down() -> None:
    r2 = "h0/r2"
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    down = pods(n=1)
    rs, actions = plan_rollout(rs, down, r2, 2, POLICY, T[2])  # a second spec.restart right after the delete
    assert rs.id == r2 and actions == [] and rs.phase == "Rolling"
    assert [e.pod for e in rs.in_flight] == ["s-1"] and rs.pending == ["s-0"]
    rs, actions = plan_rollout(rs, down + [_up("s-1", 1, "uid-1-1", r2)], r2, 2, POLICY, T[3])
    assert [(a.kind, a.pod) for a in actions] == [("baseline", "s-1")]  # s-0 still waits for s-1's check


def test_a_carried_pod_that_came_back_with_the_older_template_is_rolled_again() -> None:
    r2 = "h0/r2"
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    rs, _ = plan_rollout(rs, pods(n=1), r2, 2, POLICY, T[2])
    rs, actions = plan_rollout(rs, pods(n=1) + [_up("s-1", 1, "uid-1-1", NEW)], r2, 2, POLICY, T[3])
    assert [(a.kind, a.pod) for a in actions] == [("canary", "s-1")]  # outdated for r2: its turn again, first


# -- The warm check survives a retry ------------------------------------------------------------------------


def _at_verify(storage: int = 0) -> tuple[dict, list[PodView]]:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = pods(n=1) + [_up("s-1", 1, "uid-1-1", NEW)]
    return until_verify(rs, back, T[2], 2, storage=storage), back


def test_a_crash_after_the_verify_request_is_not_a_false_cold_start() -> None:
    rs, back = _at_verify(storage=0)  # the baseline is in status before any canary goes out
    # The first verify loaded 4032 tokens from disk, then the operator died before writing status: the retry
    # is served from GPU memory (storage=0 in the answer), but the pod's counter shows the disk read.
    rs, actions = plan_rollout(rs, back, NEW, 2, POLICY, T[3])
    assert [a.kind for a in actions] == ["verify"]
    rs = verified(rs, "s-1", 0, None, POLICY, T[3], counters(4032))
    assert rs.phase == "Rolling" and rs.done == ["s-1"] and rs.results[0].warm is True


def test_a_crash_before_the_baseline_is_written_reads_it_again() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = pods(n=1) + [_up("s-1", 1, "uid-1-1", NEW)]
    first, actions = plan_rollout(rs, back, NEW, 2, POLICY, T[2])
    assert [a.kind for a in actions] == ["baseline"]
    _, again = plan_rollout(first, back, NEW, 2, POLICY, T[3])  # baseline_read's result was never written
    assert [a.kind for a in again] == ["baseline"]


def test_a_truly_cold_pod_still_pauses_and_missing_counters_are_retried() -> None:
    rs, _ = _at_verify(storage=0)
    retry = verified(rs, "s-1", 0, None, POLICY, T[3], {})  # no counters: storage=0 proves nothing
    assert retry.phase == "Rolling" and retry.in_flight[0].last_error
    cold = verified(rs, "s-1", 0, None, POLICY, T[3], counters(0))
    assert cold.phase == "Paused" and cold.reason == "ColdStart"
    busy, _ = _at_verify(storage=500)  # traffic had read other prefixes from disk before the check
    assert verified(busy, "s-1", 0, None, POLICY, T[3], counters(500)).reason == "ColdStart"


# -- Scale changes, external deletes, recovering pauses -----------------------------------------------------


def test_scaling_down_mid_rollout_drops_the_removed_pods_and_completes() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-2", 4096, None), "s-2", T[1])  # s-2 in flight, s-1 and s-0 pending
    rs, actions = plan_rollout(rs, pods(n=2), NEW, 1, POLICY, T[2])  # replicas 3 -> 1
    assert "s-2" in rs.done and "s-1" in rs.done and rs.pending == []
    assert [(a.kind, a.pod) for a in actions] == [("canary", "s-0")]
    rs = deleted(canary_sent(rs, "s-0", 1, None), "s-0", T[3])
    rs, _ = plan_rollout(rs, [], NEW, 0, POLICY, T[4])  # and to zero: nothing left to wait for
    assert rs.phase == "Complete" and rs.finished == T[4]


def test_scaling_up_mid_rollout_adds_nothing_outdated() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    grown = pods(n=2) + [_up("s-2", 2, "uid-2-0", NEW)]  # new pods come with the new template
    rs, _ = plan_rollout(rs, grown, NEW, 3, POLICY, T[1])
    assert rs.pending == ["s-0"] and [e.pod for e in rs.in_flight] == ["s-1"]


def test_a_pod_deleted_externally_during_its_check_is_waited_for_and_checked_again() -> None:
    rs, back = _at_verify()
    rs, actions = plan_rollout(rs, back[:1], NEW, 2, POLICY, T[3])  # s-1's successor deleted by someone
    assert actions == [] and rs.in_flight[0].step == "WaitingReady"
    again = back[:1] + [_up("s-1", 1, "uid-1-2", NEW)]
    rs, actions = plan_rollout(rs, again, NEW, 2, POLICY, T[4])
    assert [(a.kind, a.uid) for a in actions] == [("baseline", "uid-1-2")]  # a new baseline for the new pod


def test_a_pod_not_ready_pause_resumes_when_the_pod_becomes_ready() -> None:
    short = Policy(1, 3, True)
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, short, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[0])
    rs, _ = plan_rollout(rs, pods(n=1), NEW, 2, short, T[5])
    assert rs.reason == "PodNotReady" and "resumes by itself" in rs.message
    rs, actions = plan_rollout(rs, pods(n=1) + [_up("s-1", 1, "uid-1-1", NEW)], NEW, 2, short, T[9])
    assert rs.phase == "Rolling" and rs.reason is None and [a.kind for a in actions] == ["baseline"]


def test_a_warm_check_failed_pause_keeps_asking_and_resumes_when_the_pod_answers() -> None:
    short = Policy(1, 3, True)
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, short, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[0])
    back = pods(n=1) + [_up("s-1", 1, "uid-1-1", NEW)]
    rs = until_verify(rs, back, T[1], 2, short)
    rs = verified(rs, "s-1", None, "timed out", short, T[2])
    rs, _ = plan_rollout(rs, back, NEW, 2, short, T[9])
    assert rs.reason == "WarmCheckFailed"
    rs, actions = plan_rollout(rs, back, NEW, 2, short, T[10])
    assert [a.kind for a in actions] == ["verify"]  # still asked while paused
    rs = verified(rs, "s-1", 4032, None, short, T[11], counters(4032))
    assert rs.phase == "Rolling" and rs.reason is None and rs.done == ["s-1"]


def _restarted(storage: int, written: tuple[int, float] | None = None) -> Restart:
    """s-1 replaced (its canary 4096 tokens), its successor answering the replay with `storage` disk tokens."""
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None, written), "s-1", T[1])
    back = pods(n=1) + [PodView("s-1", 1, "uid-1b", True, "127.0.0.11", NEW)]
    rs = until_verify(rs, back, T[3], 2)
    return verified(rs, "s-1", storage, None, POLICY, T[3], counters(storage))


def test_a_partly_restored_canary_is_reported_partial_not_warm_and_the_rollout_goes_on() -> None:
    """4096 tokens: 63 full pages are cacheable (the last token is always computed); 2048 restored is half."""
    result = _restarted(2048).results[0]
    assert (result.warm, result.warmth, result.canary_hit_share) == (False, "Partial", round(2048 / 4032, 4))
    partial = _restarted(2048)  # not cold: the pod serves and the rollout goes on; CacheWarm says PartlyWarm
    assert partial.phase == "Rolling" and partial.reason is None and partial.done == ["s-1"]
    full = _restarted(4032).results[0]
    assert (full.warm, full.warmth, full.canary_hit_share) == (True, "Warm", 1.0)
    cold = _restarted(0)
    assert (cold.results[0].warmth, cold.results[0].canary_hit_share, cold.reason) == ("Cold", 0.0, "ColdStart")


def test_canary_warmth_without_the_length_or_page_size_is_any_hit() -> None:
    assert canary_warmth(64, None, 64) == (None, "Warm") and canary_warmth(64, 4096, 0) == (None, "Warm")
    assert canary_warmth(0, None, 64) == (None, "Cold")
    assert canary_warmth(64, 65, 64) == (1.0, "Warm") and canary_warmth(64, 64, 64) == (None, "Warm")


def test_the_replaced_pods_write_rate_is_recorded_and_the_slowest_measured_one_budgets() -> None:
    gib = 1 << 30
    rs = _restarted(4032, (3 * gib, 12.5))
    result = rs.results[0]
    assert (result.disk_written_bytes, result.disk_write_bytes_per_second) == (3 * gib, int(3 * gib / 12.5))
    assert measured_write_rate(rs, None) == 250_000_000  # 257,698,037 B/s, two significant figures
    small = _restarted(4032, (gib // 2, 10.0))  # half a GiB: mostly sync latency, not counted
    assert measured_write_rate(small, 400_000_000) == 400_000_000 and measured_write_rate(small, None) is None
    assert measured_write_rate(_restarted(4032), 7) == 7 and measured_write_rate(None, None) is None
    faster = result.model_copy(update={"disk_write_bytes_per_second": 9 * 10**8})
    both = rs.model_copy(update={"results": [result, faster]})
    assert measured_write_rate(both, None) == 250_000_000


def test_the_replaced_pods_prestop_is_reported_once_and_only_its_own() -> None:
    rs, _ = plan_rollout(Restart(id=OLD, phase="Complete"), pods(), NEW, 3, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-2", 4096, None), "s-2", T[1])
    back = pods()[:2] + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs = until_verify(rs, back, T[2])
    older = PreStopRecord("uid-2-x", "failed", "an earlier incarnation's")
    assert verified(rs, "s-2", 4032, None, POLICY, T[2], counters(0), older).results[0].pre_stop is None
    mine = PreStopRecord("uid-2-0", "failed", "flush: HTTP 400", "s-2", 1767225600, 12.0)
    cold = verified(rs, "s-2", 0, None, POLICY, T[2], counters(0), mine)
    assert cold.phase == "Paused" and cold.results[0].pre_stop.wire() == {
        "outcome": "failed", "message": "flush: HTTP 400", "seconds": 12.0, "finished": "2026-01-01T00:00:00Z"}
    assert failed_prestops(rs, cold) == cold.results and failed_prestops(cold, cold) == []
    # A new restart id restarts the cold pod again: the record its volume still holds is not its predecessor's.
    again, _ = plan_rollout(cold, back, "h0/r2", 3, POLICY, T[3])
    assert [(e.pod, e.uid) for e in again.in_flight] == [("s-2", "uid-2-1")]
    assert rollout.predecessor_prestop(again.in_flight[0], mine) is None


def test_a_groups_prestop_is_its_leaders() -> None:
    entry = RestartEntry(pod="s-0", step="Verify", uid="lead-0|work-0")
    assert rollout.predecessor_prestop(entry, PreStopRecord("lead-0", "ok")).outcome == "ok"
    assert rollout.predecessor_prestop(entry, PreStopRecord("lead-", "failed")) is None
    unknown = RestartEntry(pod="s-0", step="Verify", uid="")  # its predecessor was gone before the rollout saw it
    assert rollout.predecessor_prestop(unknown, PreStopRecord("", "failed")) is None
