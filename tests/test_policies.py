"""Policy checks for what the schema cannot express."""

from __future__ import annotations

from qwen_hicache.launch import LaunchSizing
from qwen_hicache.plan import parse_spec
from qwen_hicache.policies import evaluate
from resources import example, variant

SIZING = LaunchSizing(30, 1, 1, 1, 1, 1)


def _reasons(doc: dict) -> list[tuple[str, bool]]:
    return [(p.reason, p.blocking) for p in evaluate(parse_spec(doc["spec"]), SIZING)]


def test_example_has_no_problems() -> None:
    assert _reasons(example()) == []


def test_extra_args_may_not_override_managed_flags() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--tp-size=4", "--log-level", "info", "--hicache-ratio", "3"]})
    problems = evaluate(parse_spec(doc["spec"]), SIZING)
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
