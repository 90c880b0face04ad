"""Status derivation and condition bookkeeping (pure)."""

from __future__ import annotations

from qwen_hicache.cli import offline_meta
from qwen_hicache.conditions import Condition, merge, transitions
from qwen_hicache.plan import plan
from qwen_hicache.status import build_status
from resources import example, variant

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _status(doc: dict, ready: int = 0, old: dict | None = None, now: str = T0) -> dict:
    sts = {"status": {"readyReplicas": ready}}
    return build_status(plan(offline_meta(doc), doc["spec"]), sts, old, 3, now)


def _cond(status: dict, ctype: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_progressing_until_all_replicas_are_ready() -> None:
    s = _status(example(), ready=1)
    assert _cond(s, "Ready")["status"] == "False" and _cond(s, "Progressing")["status"] == "True"
    assert s["replicasSummary"] == "1/2" and s["observedGeneration"] == 3
    s = _status(example(), ready=2)
    assert _cond(s, "Ready")["reason"] == "AllReplicasReady" and _cond(s, "Progressing")["status"] == "False"


def test_same_observation_gives_identical_status() -> None:
    first = _status(example(), ready=1)
    assert _status(example(), ready=1, old=first, now=T1) == first


def test_transition_time_moves_only_on_flip() -> None:
    first = _status(example(), ready=1)
    second = _status(example(), ready=2, old=first, now=T1)
    assert _cond(second, "Ready")["lastTransitionTime"] == T1
    assert _cond(second, "SpecValid")["lastTransitionTime"] == T0


def test_invalid_spec_degrades_and_reports_the_field() -> None:
    s = _status(variant(**{"spec.runtime.tensorParallelSize": 0}))
    assert _cond(s, "Degraded")["status"] == "True"
    assert _cond(s, "SpecValid")["reason"] == "InvalidSpec"
    assert "spec.runtime.tensorParallelSize" in _cond(s, "SpecValid")["message"]
    assert "launch" not in s


def test_write_back_warns_through_cache_persistent() -> None:
    s = _status(variant(**{"spec.hicache.writePolicy": "write_back"}), ready=2)
    assert _cond(s, "CachePersistent") ["reason"] == "WriteBackNotPersisted"
    assert _cond(s, "Ready")["status"] == "True"


def test_transitions_report_only_changes() -> None:
    old = merge([Condition("Ready", "False", "A", "m")], None, 1, T0)
    assert transitions([Condition("Ready", "False", "A", "m")], old) == []
    assert [c.reason for c in transitions([Condition("Ready", "True", "B", "m")], old)] == ["B"]
