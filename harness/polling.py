"""One polling loop for the places that wait on something outside the process (demo, harness, tools)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30, interval: float = 0.2) -> Any:
    """Poll until `check()` is truthy and return it; TimeoutError naming what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
