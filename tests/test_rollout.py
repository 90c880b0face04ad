"""The restart state machine, step by step, with simulated pods (pure)."""

from __future__ import annotations

from qwen_hicache.plan import parse_spec
from qwen_hicache.rollout import (
    PodView,
    Policy,
    canary_prompt,
    canary_sent,
    deleted,
    is_active,
    plan_rollout,
    target_of,
    verified,
)
from resources import example, variant

OLD, NEW = "h0/", "h0/r1"
POLICY = Policy(max_unavailable=1, timeout_seconds=600, require_warm=True)
T = [f"2026-01-01T00:00:{i:02d}Z" for i in range(60)]


def pods(target: str = OLD, n: int = 3, ready: bool = True, gen: int = 0) -> list[PodView]:
    return [PodView(f"s-{i}", i, f"uid-{i}-{gen}", ready, f"127.0.0.{10 + i}", target) for i in range(n)]


def test_nothing_to_do_when_pods_are_current() -> None:
    rs, actions = plan_rollout(None, pods(NEW), NEW, 3, POLICY, T[0])
    assert rs["phase"] == "Complete" and actions == []
    assert not is_active(rs, NEW) and is_active(rs, "h1/")


def test_one_pod_at_a_time_canary_delete_wait_verify() -> None:
    rs, actions = plan_rollout({"id": OLD, "phase": "Complete"}, pods(), NEW, 3, POLICY, T[0])
    assert rs["pending"] == ["s-1", "s-0"] and [a.kind for a in actions] == ["canary"]
    assert actions[0].pod == "s-2" and actions[0].ip == "127.0.0.12"
    rs = canary_sent(rs, "s-2", 4096, None)
    rs, actions = plan_rollout(rs, pods(), NEW, 3, POLICY, T[1])
    assert [(a.kind, a.pod, a.uid) for a in actions] == [("delete", "s-2", "uid-2-0")]
    rs = deleted(rs, "s-2", T[1])
    gone = pods()[:2]
    rs, actions = plan_rollout(rs, gone, NEW, 3, POLICY, T[2])
    assert actions == [] and rs["inFlight"][0]["step"] == "WaitingReady"
    back = gone + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs, actions = plan_rollout(rs, back, NEW, 3, POLICY, T[5])
    assert [(a.kind, a.pod) for a in actions] == [("verify", "s-2")]
    rs = verified(rs, "s-2", 4032, None, POLICY, T[5])
    assert rs["done"] == ["s-2"] and rs["results"][0] == {
        "pod": "s-2", "warm": True, "storageTokens": 4032, "timeToReadySeconds": 4}
    rs, actions = plan_rollout(rs, back, NEW, 3, POLICY, T[6])
    assert [(a.kind, a.pod) for a in actions] == [("canary", "s-1")]


def test_a_second_pod_never_goes_down_while_another_is_unready() -> None:
    current = pods()
    current[0] = PodView("s-0", 0, "uid-0-0", False, None, OLD)
    rs, actions = plan_rollout({"id": OLD, "phase": "Complete"}, current, NEW, 3, POLICY, T[0])
    assert actions == [] and rs["inFlight"] == [] and rs["pending"] == ["s-2", "s-1", "s-0"]


def test_max_unavailable_never_takes_all_replicas() -> None:
    wide = Policy(max_unavailable=5, timeout_seconds=600, require_warm=True)
    rs, actions = plan_rollout({"id": OLD, "phase": "Complete"}, pods(), NEW, 3, wide, T[0])
    assert len(actions) == 2 and len(rs["pending"]) == 1


def test_resume_after_operator_restart_does_not_delete_a_replaced_pod_twice() -> None:
    rs, _ = plan_rollout({"id": OLD, "phase": "Complete"}, pods(), NEW, 3, POLICY, T[0])
    rs = canary_sent(rs, "s-2", 4096, None)
    # The operator deleted s-2 and died before recording it; its successor already runs the new target.
    replaced = pods()[:2] + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    _, actions = plan_rollout(rs, replaced, NEW, 3, POLICY, T[1])
    assert actions[0].kind == "delete" and actions[0].uid == "uid-2-0"  # uid precondition: a no-op on the server


def test_cold_start_pauses_and_a_new_restart_id_retries() -> None:
    rs, _ = plan_rollout({"id": OLD, "phase": "Complete"}, pods(), NEW, 3, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-2", 4096, None), "s-2", T[1])
    back = pods()[:2] + [PodView("s-2", 2, "uid-2-1", True, "127.0.0.12", NEW)]
    rs, _ = plan_rollout(rs, back, NEW, 3, POLICY, T[2])
    rs = verified(rs, "s-2", 0, None, POLICY, T[2])
    assert rs["phase"] == "Paused" and rs["reason"] == "ColdStart" and "s-2" in rs["message"]
    assert plan_rollout(rs, back, NEW, 3, POLICY, T[3])[1] == []  # nothing else is restarted
    rs2, actions = plan_rollout(rs, back, "h0/r2", 3, POLICY, T[4])
    assert rs2["phase"] == "Rolling" and actions[0].kind == "canary"


def test_no_answer_is_retried_then_times_out() -> None:
    short = Policy(1, 3, True)
    rs, _ = plan_rollout({"id": OLD, "phase": "Complete"}, pods(n=2), NEW, 2, short, T[0])
    rs = deleted(canary_sent(rs, "s-1", None, "refused"), "s-1", T[0])
    assert rs["inFlight"][0]["canaryError"] == "refused"
    rs, actions = plan_rollout(rs, pods(n=1), NEW, 2, short, T[5])
    assert rs["phase"] == "Paused" and rs["reason"] == "PodNotReady" and actions == []


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
    rs, _ = plan_rollout({"id": OLD, "phase": "Complete"}, old, NEW, 2, policy, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = old[:1] + [PodView("s-1", 1, "uid-1b", True, "127.0.0.1", NEW, "v1-new")]
    rs, _ = plan_rollout(rs, back, NEW, 2, policy, T[2])
    rs = verified(rs, "s-1", 0, None, policy, T[2])
    assert rs["phase"] == "Rolling" and rs["results"][0]["newCacheNamespace"] is True


def test_verify_records_the_runtime_storage_counters() -> None:
    rs, _ = plan_rollout({"id": OLD, "phase": "Complete"}, pods(n=2), NEW, 2, POLICY, T[0])
    rs = deleted(canary_sent(rs, "s-1", 4096, None), "s-1", T[1])
    back = pods(n=1) + [PodView("s-1", 1, "uid-1b", True, "127.0.0.11", NEW)]
    rs, _ = plan_rollout(rs, back, NEW, 2, POLICY, T[3])
    metrics = {"sglang:cached_tokens_total{storage}": 4032.0, "sglang:prefetched_tokens_total": 4032.0,
               "sglang:cached_tokens_total{device}": 7.0}
    rs = verified(rs, "s-1", 4032, None, POLICY, T[3], metrics)
    assert rs["results"][0]["metricStorageCachedTokens"] == 4032
    assert rs["results"][0]["metricPrefetchedTokens"] == 4032 and "sglang" not in str(rs["results"][0])


def test_pods_replaced_by_someone_else_complete_the_rollout() -> None:
    """A pod deleted externally comes back on the new template: counted done, and the rollout completes."""
    target = "h/2"
    pods = [PodView(f"s-{i}", i, f"u{i}", True, f"10.0.0.{i}", target) for i in range(2)]
    prev = {"id": target, "phase": "Rolling", "pending": ["s-0"], "done": ["s-1"], "inFlight": [], "results": [],
            "started": "2026-01-01T00:00:00Z"}
    policy = Policy(1, 60, True)
    rs, actions = plan_rollout(prev, pods, target, 2, policy, "2026-01-01T00:01:00Z")
    assert actions == [] and rs["phase"] == "Complete" and rs["done"] == ["s-1", "s-0"]
    assert rs["finished"] == "2026-01-01T00:01:00Z"
