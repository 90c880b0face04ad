"""Policy checks for what the schema cannot express."""

from __future__ import annotations

from qwen_hicache.cli import offline_meta
from qwen_hicache.plan import objects, plan
from qwen_hicache.policies import evaluate
from resources import derived, example, variant


def _reasons(doc: dict) -> list[tuple[str, bool]]:
    return [(p.reason, p.blocking) for p in evaluate(derived(doc))]


def test_example_has_no_problems() -> None:
    assert _reasons(example()) == []


def test_extra_args_may_not_override_managed_flags() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--tp-size=4", "--log-level", "info", "--hicache-ratio", "3"]})
    problems = evaluate(derived(doc))
    assert problems[0].reason == "ManagedFlagInExtraArgs" and problems[0].blocking
    assert "--hicache-ratio, --tp-size" in problems[0].message
    assert "--log-level" not in problems[0].message


def test_env_may_not_override_the_file_tier() -> None:
    doc = variant(**{"spec.runtime.env": [{"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "value": "/tmp"}]})
    assert _reasons(doc) == [("ManagedEnvInSpec", True)]


def test_duplicate_env_is_refused() -> None:
    doc = variant(**{"spec.runtime.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]})
    assert _reasons(doc) == [("DuplicateEnv", True)]


def test_write_back_with_disk_is_a_warning_not_a_block() -> None:
    doc = variant(**{"spec.hicache.writePolicy": "write_back", "spec.runtime.extraArgs": ["--tp-size", "1"]})
    assert _reasons(doc) == [("ManagedFlagInExtraArgs", True), ("WriteBackNotPersisted", False)]


def test_aliases_and_abbreviations_of_managed_flags_are_refused() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--tensor-parallel-size", "4", "--hicache-si=9", "--enable-hicache"]})
    problems = evaluate(derived(doc))
    assert problems[0].reason == "ManagedFlagInExtraArgs"
    assert "--tensor-parallel-size (the runtime reads it as --tp-size)" in problems[0].message
    assert "--hicache-si (the runtime reads it as --hicache-size)" in problems[0].message


def test_config_file_flag_is_refused() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--config", "/etc/sglang.yaml"]})
    assert ("ManagedFlagInExtraArgs", True) in _reasons(doc)


def test_unknown_and_ambiguous_flags_are_refused_by_name() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--no-such-flag", "--hicache", "x"]})
    problems = [p for p in evaluate(derived(doc)) if p.reason == "UnknownRuntimeFlag"]
    assert "--no-such-flag is not a flag of sglang 0.5.23" in problems[0].message
    assert "--hicache is ambiguous" in problems[0].message


def test_mutable_image_tag_is_a_warning() -> None:
    doc = variant(**{"spec.runtime.image": "registry.example.com/sglang:latest"})
    assert _reasons(doc) == [("ImageNotPinned", False)]


def test_speculative_settings_the_runtime_rewrites_are_refused() -> None:
    doc = variant(**{"spec.runtime.speculative": {"numSteps": 3, "numDraftTokens": 8, "eagleTopk": 1}})
    problems = evaluate(derived(doc))
    assert problems[0].reason == "SpeculativeRewritten" and "numDraftTokens: 4" in problems[0].message


def test_a_multi_node_server_renders_groups_not_a_statefulset() -> None:
    doc = variant(**{"spec.nodesPerReplica": 2})
    p = plan(offline_meta(doc), doc["spec"])
    assert not p.blocked, p.problems
    assert {o["kind"] for o in objects(p)} >= {"LeaderWorkerSet", "PodDisruptionBudget"}
    assert "StatefulSet" not in {o["kind"] for o in objects(p)}


def test_a_node_count_no_node_can_hold_is_refused_with_the_numbers() -> None:
    doc = variant(**{"spec.nodesPerReplica": 2, "spec.runtime.tensorParallelSize": 8})
    p = plan(offline_meta(doc), doc["spec"], node_gpus=2)
    assert p.blocked and not p.children
    assert [x.reason for x in p.problems if x.blocking] == ["SizingInvalid"]
    assert "needs 4 GPUs" in p.problems[0].message and "has 2" in p.problems[0].message
    assert not plan(offline_meta(doc), doc["spec"], node_gpus=4).blocked  # a node with 4 GPUs holds a pod
    assert not plan(offline_meta(doc), doc["spec"], node_gpus=None).blocked  # nodes unreadable: not checked
    one = variant(**{"spec.runtime.tensorParallelSize": 8})
    assert not plan(offline_meta(one), one["spec"], node_gpus=2).blocked  # one node per replica: unchanged


def test_a_groups_flags_are_the_operators_under_any_spelling() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--nnodes", "2", "--node-rank=1", "--nccl-init-addr", "h:1"]})
    problems = evaluate(derived(doc))
    assert problems[0].reason == "ManagedFlagInExtraArgs"
    for flag in ("--dist-init-addr", "--nnodes", "--node-rank"):
        assert flag in problems[0].message


def test_a_disk_slower_than_budgeted_warns_and_budgets_the_flush_with_the_measured_rate() -> None:
    doc = example()
    spec_rate = derived(doc)
    slow = derive_with(doc, measured=100 << 20)  # 100 MiB/s measured vs the example's writeBytesPerSecond
    assert slow.measured_write_rate == 100 << 20 < slow.write_rate
    assert slow.layout.drain.flush_seconds > spec_rate.layout.drain.flush_seconds
    assert slow.layout.drain.grace_seconds > spec_rate.layout.drain.grace_seconds
    p = plan(offline_meta(doc), doc["spec"], measured_write_rate=100 << 20)
    warn = [x for x in p.problems if x.reason == "DiskSlowerThanBudgeted"]
    assert warn and not warn[0].blocking and warn[0].condition == "DiskWriteRate" and "100Mi/s" in warn[0].message
    assert p.cache.measured_write_bytes_per_second == 100 << 20
    assert p.cache.flush_seconds == slow.layout.drain.flush_seconds
    fast = plan(offline_meta(doc), doc["spec"], measured_write_rate=10 * spec_rate.write_rate)
    assert not [x for x in fast.problems if x.reason == "DiskSlowerThanBudgeted"]
    assert fast.cache.flush_seconds == spec_rate.layout.drain.flush_seconds  # never shorter than the spec's


def derive_with(doc: dict, measured: int) -> object:
    from qwen_hicache.derive import derive
    from qwen_hicache.geometry import resolve_geometry
    from qwen_hicache.plan import parse_spec

    spec = parse_spec(doc["spec"])
    return derive(spec, resolve_geometry(spec.model), measured_write_rate=measured)
