"""Status derivation and condition bookkeeping (pure)."""

from __future__ import annotations

from qwen_hicache.cli import offline_meta
from qwen_hicache.conditions import condition, merge, transitions
from qwen_hicache.diskusage import DiskUsage
from qwen_hicache.plan import plan
from qwen_hicache.status import Observed, build_status, cache_history
from qwen_hicache.status_model import Cache, Restart, read_status
from resources import example, variant

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _status(doc: dict, ready: int = 0, old: dict | None = None, now: str = T0, restart: dict | None = None) -> dict:
    typed = Restart.model_validate(restart) if restart else None
    obs = Observed(sts={"status": {"readyReplicas": ready}}, restart=typed)
    return build_status(plan(offline_meta(doc), doc["spec"]), obs, read_status(old), 3, now).wire()


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
    old = merge([condition("Ready", "False", "A", "m")], None, 1, T0)
    assert transitions([condition("Ready", "False", "A", "m")], old) == []
    assert [c.reason for c in transitions([condition("Ready", "True", "B", "m")], old)] == ["B"]


def test_paused_rollout_degrades_and_cold_start_clears_cache_warm() -> None:
    rs = {"id": "h/1", "phase": "Paused", "reason": "ColdStart", "message": "pod flash-next-1 came back cold",
          "pending": [], "done": ["flash-next-2"], "inFlight": [], "results": []}
    s = _status(example(), ready=2, restart=rs)
    assert _cond(s, "Degraded")["reason"] == "ColdStart" and _cond(s, "CacheWarm")["status"] == "False"
    assert s["restart"]["phase"] == "Paused"


def test_rolling_restart_is_progress_and_warm_results_set_cache_warm() -> None:
    rs = {"id": "h/1", "phase": "Rolling", "pending": ["flash-next-0"], "done": ["flash-next-1"],
          "inFlight": [], "results": [{"pod": "flash-next-1", "warm": True, "storageTokens": 4096,
                                       "timeToReadySeconds": 3}]}
    s = _status(example(), ready=2, restart=rs)
    assert _cond(s, "Progressing")["reason"] == "RollingRestart"
    assert "1/2 done" in _cond(s, "Progressing")["message"]
    assert _cond(s, "CacheWarm")["status"] == "True" and "4096 tokens" in _cond(s, "CacheWarm")["message"]


def test_cache_status_remembers_previous_fingerprints_up_to_the_keep_count() -> None:
    s = _status(example())
    fp = s["cache"]["fingerprint"]
    assert s["cache"]["directory"].endswith(fp)
    new, old = Cache.model_validate(s["cache"]), Cache(fingerprint="v1-old", previous_fingerprints=["v1-older"])
    assert cache_history(new, old, keep=1).previous_fingerprints == ["v1-old"]
    assert "previousFingerprints" not in cache_history(new, old, keep=0).wire()


def test_replica_cache_reports_disk_use_namespace_age_and_restored_tokens() -> None:
    from qwen_hicache.status import replica_cache

    now = "2026-01-03T00:00:00Z"
    usage = (("qwen-0", DiskUsage(used_bytes=600, cap_bytes=1000, used_ratio=0.6, page_files=3,
                                  namespace_created_at=1767225600, fingerprint="fp")),  # 2026-01-01T00:00:00Z
             ("qwen-1", None), ("qwen-2", None))
    old = read_status({"replicaCache": [{"pod": "qwen-1", "diskUsedBytes": 900, "diskCapBytes": 1000,
                                         "diskUsedRatio": 0.9}]})
    restart = Restart.model_validate({"id": "h/1", "phase": "Complete", "results": [
        {"pod": "qwen-1", "warm": True, "storageTokens": 4032}, {"pod": "qwen-0", "warm": False, "storageTokens": 0}]})
    entries, summary = replica_cache(usage, restart, old, now)
    assert [e.wire() for e in entries] == [
        {"pod": "qwen-0", "diskUsedBytes": 600, "diskCapBytes": 1000, "diskUsedRatio": 0.6, "diskPageFiles": 3,
         "namespaceCreated": "2026-01-01T00:00:00Z", "namespaceAge": "2d", "lastRestoredTokens": 0},
        {"pod": "qwen-1", "diskUsedBytes": 900, "diskCapBytes": 1000, "diskUsedRatio": 0.9, "lastRestoredTokens": 4032},
    ]  # qwen-2 never answered: left out; qwen-1 keeps its last numbers
    assert summary == "disk 90% | 1/2 warm | ns 2d"
    assert len(summary) < 30  # one printer column
    assert replica_cache((("qwen-0", None),), None, read_status({}), now) == (None, None)


def test_refused_change_reports_what_runs_and_keeps_the_rollout() -> None:
    applied = _status(example(), ready=2)
    rollout = {"id": "abc/1", "phase": "Rolling", "pending": [], "done": [], "inFlight": [], "results": [],
               "started": T0}
    applied["restart"] = rollout
    refused = variant(**{"spec.runtime.tensorParallelSize": 0})
    obs = Observed(sts={"spec": {"replicas": 2}, "status": {"readyReplicas": 2}},
                   restart=Restart.model_validate(rollout))
    s = build_status(plan(offline_meta(refused), refused["spec"]), obs, read_status(applied), 4, T1).wire()
    for key in ("launch", "sizing", "cache"):
        assert s[key] == applied[key], key  # the running pods' configuration, not the refused one's
    assert s["restart"] == rollout and s["replicasSummary"] == "2/2"
    assert _cond(s, "Ready")["status"] == "True"
    degraded = _cond(s, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "previously applied configuration keeps running" in degraded["message"]


def test_refused_new_resource_describes_nothing() -> None:
    refused = variant(**{"spec.hicache.hostMemoryPerRank": "100000Ti"})
    s = build_status(plan(offline_meta(refused), refused["spec"]), Observed(), None, 1, T0).wire()
    assert not {"launch", "sizing", "cache"} & set(s) and _cond(s, "Ready")["status"] == "False"


def test_a_partly_warm_restart_sets_cache_warm_false_with_the_hit_share() -> None:
    rs = {"id": "h/1", "phase": "Complete", "pending": [], "done": ["flash-next-1", "flash-next-0"], "inFlight": [],
          "results": [{"pod": "flash-next-1", "warm": True, "warmth": "Warm", "canaryHitShare": 1.0,
                       "storageTokens": 4032},
                      {"pod": "flash-next-0", "warm": False, "warmth": "Partial", "canaryHitShare": 0.25,
                       "storageTokens": 1008}]}  # fmt: skip
    s = _status(example(), ready=2, restart=rs)
    warm = _cond(s, "CacheWarm")
    assert (warm["status"], warm["reason"]) == ("False", "PartlyWarm")
    assert "flash-next-0 25%" in warm["message"] and "1 of 2" in warm["message"]
