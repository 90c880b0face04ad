"""The async rollout driver: retries within seconds, never raises, holds no thread while it waits."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from qwen_hicache import driver

LOG = logging.getLogger("test")


class Clock:
    """A fake sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_retry_delay_backs_off_to_a_few_seconds_at_most() -> None:
    assert [driver.retry_delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


def test_drive_retries_failed_steps_quickly_and_ends_when_the_rollout_is_over() -> None:
    clock, outcomes = Clock(), iter([ConnectionError("api down"), RuntimeError("409"), None, None])
    rounds = {"n": 0}

    async def fetch() -> dict:
        rounds["n"] += 1
        return {"round": rounds["n"]}

    async def step(server: dict) -> None:
        if (err := next(outcomes)) is not None:
            raise err

    why = asyncio.run(driver.drive(fetch, lambda s: s["round"] <= 4, step, clock.sleep, lambda: False, 2.0, LOG))
    assert why == "done"
    assert clock.slept == [0.5, 1.0, 2.0, 2.0]  # two quick retries, then the normal poll; failures reset


def test_drive_survives_a_failing_fetch_and_stops_when_told() -> None:
    clock, calls = Clock(), []

    async def fetch() -> dict:
        calls.append(1)
        raise OSError("connection refused")

    async def step(server: dict) -> None:
        raise AssertionError("never reached")

    why = asyncio.run(driver.drive(fetch, lambda s: True, step, clock.sleep, lambda: len(calls) >= 6, 2.0, LOG))
    assert why == "stopped" and clock.slept == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_drive_ends_when_the_resource_is_gone() -> None:
    async def fetch() -> None:
        return None

    async def step(server: dict) -> None:
        raise AssertionError("never reached")

    assert asyncio.run(driver.drive(fetch, lambda s: True, step, Clock().sleep, lambda: False, 2.0, LOG)) == "done"


def test_retrying_gives_up_after_the_schedule_without_raising() -> None:
    tries = []

    async def step() -> None:
        tries.append(time.monotonic())
        raise ConnectionError("api down")

    assert asyncio.run(driver.retrying(step, LOG, "reconcile", schedule=(0.01, 0.02))) is False
    assert len(tries) == 3


def test_retrying_stops_at_the_first_success() -> None:
    tries = []

    async def step() -> None:
        tries.append(1)
        if len(tries) < 2:
            raise ConnectionError("blip")

    assert asyncio.run(driver.retrying(step, LOG, "reconcile", schedule=(0.01, 0.01, 0.01))) is True
    assert len(tries) == 2


def test_many_waiting_rollouts_share_a_small_pool_and_hold_no_thread_while_waiting() -> None:
    """40 rollouts of 5 steps each on a 2-thread pool: every step runs, and at no time do more than 2 threads
    work; while they all wait between steps the pool is idle (a sync daemon would hold 40 threads)."""
    pool = driver.StepPool(2)
    busy, peak, lock, done = [0], [0], threading.Lock(), []

    def blocking_step(i: int) -> None:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.002)
        with lock:
            busy[0] -= 1
        done.append(i)

    async def one(i: int) -> str:
        left = [5]

        async def fetch() -> int:
            return left[0]

        async def step(_: int) -> None:
            await pool.run(blocking_step, i)
            left[0] -= 1

        return await driver.drive(fetch, lambda n: n > 0, step, asyncio.sleep, lambda: False, 0.01, LOG)

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(40)))

    try:
        assert asyncio.run(main()) == ["done"] * 40
    finally:
        pool.shutdown()
    assert len(done) == 200 and peak[0] <= 2


def test_step_pool_carries_context_variables() -> None:
    """Kopf's event poster is found through context variables: a step must see the caller's."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    pool = driver.StepPool(1)

    async def main() -> str:
        var.set("from the handler")
        return await pool.run(var.get)

    try:
        assert asyncio.run(main()) == "from the handler"
    finally:
        pool.shutdown()


@pytest.mark.parametrize("exc", [asyncio.CancelledError])
def test_cancellation_is_not_swallowed(exc: type[BaseException]) -> None:
    async def fetch() -> dict:
        raise exc()

    async def step(server: dict) -> None:
        return None

    with pytest.raises(exc):
        asyncio.run(driver.drive(fetch, lambda s: True, step, Clock().sleep, lambda: False, 2.0, LOG))


def _pod(name: str, uid: str, rv: str) -> dict:
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": rv}}


def test_world_mark_changes_with_the_resource_or_any_pod_and_ignores_list_order() -> None:
    server = {"metadata": {"resourceVersion": "10"}}
    pods = [_pod("s-0", "a", "1"), _pod("s-1", "b", "2")]
    mark = driver.world_mark(server, pods)
    assert driver.world_mark(server, pods[::-1]) == mark
    assert driver.world_mark({"metadata": {"resourceVersion": "11"}}, pods) != mark  # spec or status written
    assert driver.world_mark(server, [pods[0], _pod("s-1", "b", "3")]) != mark  # a pod's status moved
    assert driver.world_mark(server, [pods[0], _pod("s-1", "c", "2")]) != mark  # a new incarnation
    assert driver.world_mark(server, pods[:1]) != mark  # a pod is gone


def test_quiet_gate_skips_only_an_unchanged_world_after_a_step_that_did_nothing() -> None:
    gate = driver.QuietGate(full_every=10.0)
    assert gate.due("m1", 0.0)  # the first step always runs
    gate.stepped("m1", 0.0, acted=False)
    assert not gate.due("m1", 2.0)  # nothing changed, nothing in flight: one pod list, no reconcile
    assert gate.due("m2", 2.0)  # something changed
    assert gate.due("m1", 10.0)  # timeouts are still noticed
    gate.stepped("m1", 12.0, acted=True)
    assert gate.due("m1", 14.0)  # a canary, delete or warm check was attempted: look again
