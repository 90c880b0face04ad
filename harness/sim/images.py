"""SIMULATION ONLY: which local command stands in for a container's image (no images are pulled here).

- The runtime container (named ``sglang``, the patched SGLang image) runs the engine stand-in
  (``harness.sim.engine``) with the container's args, on the pod IP and its ``http`` port.
- The operator image (``.../qwen-hicache-operator:<tag>``) runs its own command (``python -m
  qwen_hicache.cli run ...``) with this checkout's interpreter, which has the operator installed.
- Init containers and hooks run their ``sh -c`` scripts on the host (busybox-like shell images).
- A ``python3 -c SCRIPT`` container (the runtime image's ``cache-usage`` sidecar: stdlib only) runs the script
  with this interpreter.
- Anything else has no stand-in: the pod stays ``ErrImagePull`` (stricter than a cluster that could pull it).

Extra stand-ins (a router image, say) are registered with ``register()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
RUNTIME_CONTAINER = "sglang"
# builder(container, args already expanded) -> argv, or None when it does not stand in for this container
Builder = Callable[[Obj, list[str]], list[str] | None]
_BUILDERS: list[Builder] = []
_PYTHONS = {"python", "python3", "/usr/bin/python3", "/usr/local/bin/python", "/usr/local/bin/python3"}


def register(builder: Builder) -> None:
    """Add a stand-in, tried before the built-in ones."""
    _BUILDERS.insert(0, builder)


def repository(image: str) -> str:
    """`registry/path/name:tag@digest` -> `name`."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def _runtime(container: Obj, args: list[str]) -> list[str] | None:
    if container["name"] != RUNTIME_CONTAINER:
        return None
    return [sys.executable, "-m", "harness.sim.engine", *args]  # the image's entrypoint is the stand-in


def _operator(container: Obj, argv: list[str]) -> list[str] | None:
    if repository(container.get("image", "")) != "qwen-hicache-operator" or not argv:
        return None
    return [sys.executable if argv[0] in _PYTHONS else argv[0], *argv[1:]]


def _python(container: Obj, argv: list[str]) -> list[str] | None:
    """A stdlib-Python program in any image (the cache-usage sidecar): this interpreter runs it for real."""
    return [sys.executable, *argv[1:]] if len(argv) > 1 and argv[0] in _PYTHONS and argv[1] == "-c" else None


def _shell(container: Obj, argv: list[str]) -> list[str] | None:
    return argv if argv and argv[0] in ("sh", "/bin/sh", "bash", "/bin/bash") else None


def command_for(container: Obj, argv: list[str], args_only: list[str]) -> list[str] | None:
    """The host argv standing in for `container` (`argv` = command + args, `args_only` = args), or None."""
    for builder in _BUILDERS:
        if (found := builder(container, argv)) is not None:
            return found
    return (_runtime(container, args_only) or _operator(container, argv) or _python(container, argv)
            or _shell(container, argv))
