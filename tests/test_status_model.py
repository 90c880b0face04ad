"""The typed status (qwen_hicache.status_model): every status build_status writes validates with unknown keys
refused, and the CRD's status schema is generated from it."""

from __future__ import annotations

import copy

import pytest
from fakekube import merge_patch
from pydantic import ValidationError
from qwen_hicache import crd, diskusage, router
from qwen_hicache.cli import offline_meta
from qwen_hicache.plan import plan
from qwen_hicache.reconciler import _merge_diff, _status_delta
from qwen_hicache.rollout import PodView, Policy, baseline_read, canary_sent, deleted, plan_rollout, target_of, verified
from qwen_hicache.status import POD_FAILING, Observed, PodProblem, build_status
from qwen_hicache.status_model import Restart, read_status, validate_status
from resources import example, variant
from test_router import Harness, _router_pod

from harness.sim.routerlab import lab_spec

T = [f"2026-01-01T00:00:{i:02d}Z" for i in range(60)]
POLICY = Policy(max_unavailable=1, timeout_seconds=600, require_warm=True, fingerprint="fp")
EXPORTER = """qwen_hicache_disk_used_bytes{tp_rank="0"} 600
qwen_hicache_disk_used_bytes{tp_rank="1"} 400
qwen_hicache_disk_page_files{tp_rank="0"} 3
qwen_hicache_disk_cap_bytes{tp_rank="0"} 1000
qwen_hicache_disk_cap_bytes{tp_rank="1"} 1000
qwen_hicache_disk_old_namespaces_bytes 77
qwen_hicache_cache_namespace_created_timestamp_seconds 1767225600
qwen_hicache_cache_namespace_info{fingerprint="fp"} 1
"""


def _pods(target: str, gen: int = 0) -> list[PodView]:
    return [PodView(f"flash-next-{i}", i, f"uid-{i}-{gen}", True, f"10.0.0.{i}", target, "fp") for i in range(2)]


def _rollouts(target: str) -> list[Restart]:
    """Restart states of a real rollout, step by step: rolling, paused cold, complete."""
    rs, _ = plan_rollout(Restart(id="old", phase="Complete"), _pods("old"), target, 2, POLICY, T[0])
    rolling = canary_sent(rs, "flash-next-1", 4096, "a canary error")
    rs = deleted(rolling, "flash-next-1", T[1])
    rs, _ = plan_rollout(rs, _pods("old")[:1] + _pods(target, 1)[1:], target, 2, POLICY, T[3])
    rs = baseline_read(rs, "flash-next-1", "uid-1-1", {"sglang:cached_tokens_total{storage}": 0.0})
    metrics = {"sglang:cached_tokens_total{storage}": 4032.0, "sglang:prefetched_tokens_total": 4032.0}
    cold = verified(rs, "flash-next-1", 0, None, POLICY, T[4], {"sglang:cached_tokens_total{storage}": 0.0})
    waiting = verified(rs, "flash-next-1", None, "connection refused", POLICY, T[4])
    done = verified(rs, "flash-next-1", 4032, None, POLICY, T[4], metrics)
    done, _ = plan_rollout(done, _pods(target, 1)[1:] + _pods("old")[:1], target, 2, POLICY, T[5])
    done = canary_sent(done, "flash-next-0", 4096, None)
    done = deleted(done, "flash-next-0", T[6])
    done, _ = plan_rollout(done, _pods(target, 1), target, 2, POLICY, T[8])
    done = verified(done, "flash-next-0", 4032, None, POLICY, T[9])
    assert cold.phase == "Paused" and done.phase == "Complete" and waiting.in_flight[0].last_error
    return [rolling, waiting, cold, done]


def _router_status(monkeypatch: pytest.MonkeyPatch, restart: Restart) -> object:
    monkeypatch.setattr(router, "router_workers", lambda ip, port: {"chat-0": "ready", "chat-1": "draining"})
    return Harness([_router_pod("10.0.0.9")]).sync(lab_spec(2), restart)


def _statuses(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    docs = [example(), variant(**{"spec.hicache.disk": {"enabled": False}}),
            variant(**{"spec.runtime.tensorParallelSize": 1}),
            variant(**{"spec.runtime.tensorParallelSize": 0}), variant(**{"spec.hicache.hostMemoryPerRankGB": 4000}),
            variant(**{"spec.hicache.writePolicy": "write_back"}), variant(**{"spec.replicas": 0})]
    usage = (("flash-next-0", diskusage.parse(EXPORTER)), ("flash-next-1", None))
    out = []
    for doc in docs:
        p = plan(offline_meta(doc), doc["spec"])
        out.append(build_status(p, Observed(), None, 1, T[0]).wire())
        if p.spec is None:
            continue
        for restart in _rollouts(target_of(p.spec)):
            obs = Observed(sts={"status": {"readyReplicas": 1}}, restart=restart, admin_secret="flash-next-admin",
                           router=_router_status(monkeypatch, restart), disk_usage=usage,
                           pod_problems=(PodProblem(POD_FAILING, GUARD_FAILED),))
            first = build_status(p, obs, read_status(out[-1]), 2, T[10]).wire()
            out += [first, build_status(p, replace_usage(obs), read_status(first), 2, T[11]).wire()]
    return out


GUARD_FAILED = "pod flash-next-0: init container cache-guard exited 3: foreign cache"


def replace_usage(obs: Observed) -> Observed:
    """The next reconcile, where no sidecar answered: entries carried over from the previous status."""
    from dataclasses import replace

    return replace(obs, disk_usage=(("flash-next-0", None),), apply_error="boom")


def test_every_status_the_operator_writes_validates_against_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = _statuses(monkeypatch)
    keys: set[str] = set()
    for status in statuses:
        validate_status(status)
        keys |= set(status)
    assert {"launch", "sizing", "cache", "restart", "router", "replicaCache", "cacheSummary", "adminSecret"} <= keys
    paused = [s for s in statuses if (s.get("restart") or {}).get("phase") == "Paused"]
    assert paused and all(s["restart"]["reason"] == "ColdStart" for s in paused)
    assert all("metricStorageCachedTokens" in s["restart"]["results"][0] for s in paused)
    assert all(s["restart"]["results"][0]["metricStorageBaseline"] == 0 for s in paused)
    assert any("namespaceAge" in e for s in statuses for e in s.get("replicaCache") or [])


def test_a_typod_or_mistyped_key_is_refused() -> None:
    doc = example()
    status = build_status(plan(offline_meta(doc), doc["spec"]), Observed(), None, 1, T[0]).wire()
    for path in (("sizing", "hostKVTokenPerRank"), ("cache", "fingerprnt"), ("launchh",)):
        bad = copy.deepcopy(status)
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = 1
        with pytest.raises(ValidationError, match=path[-1]):
            validate_status(bad)
    with pytest.raises(ValidationError):
        validate_status({**status, "restart": {"id": "x", "phase": "Rolling", "inFlight": [{"pod": "p", "stp": "x"}]}})


def test_every_sizing_key_is_in_the_model() -> None:
    """Derived from Sizing.as_status itself (TP 1 and TP 2 sizings)."""
    from qwen_hicache.status_model import Sizing

    for doc in (example(), variant(**{"spec.runtime.tensorParallelSize": 1})):
        sizing = plan(offline_meta(doc), doc["spec"]).sizing.explicit()
        wire_names = {f.alias for f in Sizing.model_fields.values()}
        assert set(sizing) <= wire_names, set(sizing) - wire_names


def test_crd_status_schema_is_structural_and_documented() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in schema
    restart = schema["properties"]["restart"]
    assert restart["description"] and restart["properties"]["reason"]["description"]
    assert restart["properties"]["inFlight"]["items"]["properties"]["step"]["type"] == "string"
    assert schema["properties"]["sizing"]["properties"]["memoryTerms"]["items"]["required"] == ["name", "bytes", "why"]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and "anyOf" not in node and node.get("additionalProperties") is not True
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema)


def test_status_delta_replaces_sub_objects_so_left_out_keys_go() -> None:
    paused = {"restart": {"id": "a", "phase": "Paused", "reason": "ColdStart", "message": "m", "finished": "t0",
                          "done": ["p-1"]}, "replicas": 2, "cacheSummary": "disk 1%"}
    complete = {"restart": {"id": "b", "phase": "Rolling", "done": []}, "replicas": 2}
    delta = _status_delta(complete, paused)
    assert delta == {"restart": {"id": "b", "phase": "Rolling", "reason": None, "message": None, "finished": None,
                                 "done": []}, "cacheSummary": None}
    assert _status_delta(paused, paused) == {}
    assert _merge_diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}) == {"a": {"c": None}}


def test_status_delta_applied_to_the_old_status_gives_the_new(monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = _statuses(monkeypatch)
    for old, new in zip(statuses, statuses[1:], strict=False):
        assert merge_patch(old, _status_delta(new, old)) == new
