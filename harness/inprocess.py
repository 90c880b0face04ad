"""Run the operator in a background thread of this process (the demo and the benchmark use it).

Unlike `kopf.testing.KopfRunner`, this does not capture stdout, so the caller can keep printing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import kopf


@contextlib.contextmanager
def operator_thread(namespaces: tuple[str, ...] = (), timeout: float = 30, settings: Any = None
                    ) -> Iterator[threading.Thread]:  # fmt: skip
    """Start the operator's handlers (standalone, no peering) with `settings` (a qwen_hicache.settings.Settings;
    from the environment when None); stop them cleanly on exit."""
    from qwen_hicache.handlers import register
    from qwen_hicache.settings import Settings

    registry = register(settings or Settings.load(), kopf.OperatorRegistry())
    stop = threading.Event()
    ready = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    standalone=True, clusterwide=not namespaces, namespaces=namespaces,
                    stop_flag=stop, ready_flag=ready, registry=registry,
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
