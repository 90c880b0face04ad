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
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
