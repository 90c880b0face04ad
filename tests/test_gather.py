"""The shell's readings of what the cluster reports (gather.py's pure parts)."""

from __future__ import annotations

from qwen_hicache.cli import offline_meta
from qwen_hicache.gather import pod_problems as _pod_problems
from qwen_hicache.plan import plan
from qwen_hicache.status import CRASH_LOOPING, POD_FAILING, Observed, PodProblem, build_status
from resources import example

LOG_TAIL = "Traceback (most recent call last):\n  ...\nValueError: --admin-api-key expected one argument"


def _pod(**status: object) -> dict:
    return {"metadata": {"name": "flash-next-0"}, "status": status}


def test_a_crash_looping_runtime_is_degraded_with_its_last_log_lines() -> None:
    looping = _pod(containerStatuses=[{
        "name": "sglang", "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": LOG_TAIL}}}])  # fmt: skip
    problems = _pod_problems([looping, _pod(containerStatuses=[{"name": "sglang", "state": {"running": {}}}])])
    message = f"pod flash-next-0: container sglang in a crash loop, restarted 4 times, last exit 2: {LOG_TAIL}"
    assert problems == (PodProblem(CRASH_LOOPING, message),)
    doc = example()
    status = build_status(plan(offline_meta(doc), doc["spec"]), Observed(sts={"status": {}}, pod_problems=problems),
                          None, 1, "2026-01-01T00:00:00Z").wire()
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLooping"
    assert "expected one argument" in degraded["message"]


def test_an_init_failure_is_pod_failing_and_long_messages_keep_their_tail() -> None:
    guard = _pod(initContainerStatuses=[{"name": "cache-guard", "state": {"terminated": {
        "exitCode": 3, "message": "x" * 5000 + " foreign cache"}}}])  # fmt: skip
    ((reason, problem),) = [(p.reason, p.message) for p in _pod_problems([guard])]
    assert reason == POD_FAILING and problem.startswith("pod flash-next-0: init container cache-guard exited 3: x")
    assert problem.endswith("foreign cache") and len(problem) < 700
    restarted_fine = _pod(containerStatuses=[{"name": "sglang", "restartCount": 1, "state": {"running": {}},
                                             "lastState": {"terminated": {"exitCode": 137}}}])  # fmt: skip
    assert _pod_problems([restarted_fine]) == ()


def test_a_server_without_a_disk_tier_never_pauses_for_a_cold_start() -> None:
    from resources import variant

    assert plan(offline_meta(example()), example()["spec"]).derived.policy.require_warm
    diskless = variant(**{"spec.hicache.disk": {"enabled": False}})
    assert not plan(offline_meta(diskless), diskless["spec"]).derived.policy.require_warm
