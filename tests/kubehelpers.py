"""Polling and lookup helpers shared by the integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from qwen_hicache.spec import GROUP, PLURAL, VERSION


def eventually(check: Callable[[], Any], timeout: float = 30, interval: float = 0.2) -> Any:
    """Poll until `check` returns a truthy value (returned) or raise with its last result."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:  # noqa: BLE001 - keep polling; report the last failure
            last = err
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s; last: {last!r}")


def get_server(custom: client.CustomObjectsApi, ns: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def condition(obj: dict, ctype: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == ctype), None)
