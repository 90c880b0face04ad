"""SIMULATION ONLY: a pod's own network namespace, approximated for Python programs run by the kubelet stand-in.

In a real pod, binding 0.0.0.0 reaches only the pod's interface. Here every pod shares the host's network, so
a wildcard bind is narrowed to the pod IP (``QWEN_HICACHE_SIM_POD_IP``): nothing a test starts listens beyond
loopback, and two pods can use the same port. Loaded through PYTHONPATH only for processes the stand-in runs.
"""

import os
import socket

_POD_IP = os.environ.get("QWEN_HICACHE_SIM_POD_IP")
_WILDCARDS = {"", "0.0.0.0", "::", "0:0:0:0:0:0:0:0"}

if _POD_IP:
    _bind = socket.socket.bind

    def _pod_bind(self: socket.socket, address: object) -> None:
        if isinstance(address, tuple) and address and address[0] in _WILDCARDS and self.family == socket.AF_INET:
            address = (_POD_IP, *address[1:])
        elif isinstance(address, tuple) and address and address[0] in _WILDCARDS and self.family == socket.AF_INET6:
            raise OSError(97, "IPv6 is not available in the simulated pod network")
        return _bind(self, address)

    socket.socket.bind = _pod_bind  # type: ignore[method-assign]
