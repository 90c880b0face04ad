"""Run the operator in a background thread of this process (the demo and the benchmark use it).

Unlike `kopf.testing.KopfRunner`, this does not capture stdout, so the caller can keep printing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import kopf


@contextlib.contextmanager
def operator_thread(namespaces: tuple[str, ...] = (), timeout: float = 30) -> Iterator[threading.Thread]:
    """Start the registered handlers (standalone, no peering); stop them cleanly on exit."""
    from qwen_hicache import handlers  # noqa: F401 - registers the handlers

    stop = threading.Event()
    ready = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    standalone=True, clusterwide=not namespaces, namespaces=namespaces,
                    stop_flag=stop, ready_flag=ready,
                )
            )
        except BaseException as err:  # noqa: BLE001 - reported to the caller below
            errors.append(err)
            ready.set()

    thread = threading.Thread(target=main, name="qwen-hicache-operator", daemon=True)
    thread.start()
    if not ready.wait(timeout) or errors:
        stop.set()
        raise RuntimeError(f"the operator did not start: {errors[0] if errors else 'timeout'}")
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout)
    if errors:
        raise RuntimeError(f"the operator failed: {errors[0]}") from errors[0]
