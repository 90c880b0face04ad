"""Advance rollouts without holding worker threads (the async half of the Kopf shell).

A rollout lasts as long as its pods take to restart (minutes with real models). A synchronous Kopf daemon
sleeps in one of Kopf's handler threads all that time, so a dozen rollouts starve create/update handlers of
every other resource. Here the loop is a coroutine that sleeps on the event loop; each reconcile step runs in
a thread of a bounded pool of its own, only for the step's duration, so Kopf's handler executor is never
used by rollouts. Errors (API server away, a conflict) are retried within seconds inside the loop: an
exception escaping a Kopf daemon would park it in Kopf's 60 s back-off.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0)
"""Back-off after consecutive failed steps; the last value repeats (recovery within seconds, not a minute)."""


class StepPool:
    """A bounded thread pool for blocking reconcile steps, separate from Kopf's handler executor."""

    def __init__(self, workers: int, name: str = "rollout-step") -> None:
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the pool; the caller's coroutine waits without holding a thread. The caller's
        context variables go along (Kopf finds its event poster through them, as in its own sync handlers)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, ctx.run, functools.partial(fn, *args))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def world_mark(server: dict[str, Any], pods: Sequence[dict[str, Any]]) -> Hashable:
    """What a rollout step's decision depends on, as seen by the API server: the resource (spec and status, by
    resourceVersion) and every pod of it (incarnation and resourceVersion). Equal marks: nothing changed."""
    def meta(o: dict[str, Any]) -> dict[str, Any]:
        return o.get("metadata") or {}

    return meta(server).get("resourceVersion"), tuple(sorted(
        (meta(p).get("name"), meta(p).get("uid"), meta(p).get("resourceVersion")) for p in pods))


@dataclass
class QuietGate:
    """Skip a rollout's full reconcile while nothing it depends on changed.

    A rollout spends most of its life waiting for a pod to restart; a full reconcile per poll (every child
    read, the plan, the status diff) for each of 50 rollouts saturated the API server and the operator and
    delayed everything else (a new resource waited 12.9 s for its StatefulSet). A poll now costs one read of the
    resource when the world is unchanged (its pods come from a Kopf index a watch keeps current). A full step still
    runs when the last one acted (a canary, a delete, a warm check: its effect may show only in the engine) and at
    least every `full_every` seconds (timeouts)."""

    full_every: float
    _mark: Hashable = None
    _at: float = -math.inf

    def due(self, mark: Hashable, now: float) -> bool:
        return self._mark is None or mark != self._mark or now - self._at >= self.full_every

    def stepped(self, mark: Hashable, now: float, acted: bool) -> None:
        self._mark, self._at = (None if acted else mark), now


def retry_delay(failures: int, schedule: Sequence[float] = RETRY_SECONDS) -> float:
    """Seconds to wait after `failures` consecutive failures (>= 1)."""
    return schedule[min(failures, len(schedule)) - 1]


async def drive(fetch: Callable[[], Awaitable[Any]], wanted: Callable[[Any], bool],
                step: Callable[[Any], Awaitable[object]], sleep: Callable[[float], Awaitable[object]],
                stopped: Callable[[], bool], poll: float, log: logging.Logger) -> str:
    """Fetch, check, step, sleep, until the rollout is over (`"done"`) or the daemon is stopped (`"stopped"`).

    A failure of `fetch` or `step` is logged and retried after `retry_delay` (never raised)."""
    failures = 0
    while not stopped():
        try:
            server = await fetch()
            if server is None or not wanted(server):
                return "done"
            await step(server)
            failures, delay = 0, poll
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure of a step is retried here, never by Kopf
            failures += 1
            delay = retry_delay(failures)
            log.warning("rollout step failed (%d in a row), retrying in %.1fs: %s", failures, delay, err)
        await sleep(delay)
    return "stopped"


async def retrying(step: Callable[[], Awaitable[object]], log: logging.Logger, what: str,
                   schedule: Sequence[float] = RETRY_SECONDS) -> bool:
    """Run `step` until it succeeds, at most len(schedule)+1 times; False (logged) when every try failed.

    For event handlers, which Kopf never retries: the periodic resync is the last resort after this."""
    for attempt in range(len(schedule) + 1):
        try:
            await step()
            return True
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - logged; retried below or left to the resync timer
            if attempt == len(schedule):
                log.warning("%s failed %d times, leaving it to the periodic resync: %s", what, attempt + 1, err)
                return False
            log.info("%s failed, retrying in %.1fs: %s", what, schedule[attempt], err)
            await asyncio.sleep(schedule[attempt])
    return False
