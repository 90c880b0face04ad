"""SIMULATION ONLY: a pod's own network namespace, approximated for Python programs run by the kubelet stand-in.

In a real pod, binding 0.0.0.0 reaches only the pod's interface. Here every pod shares the host's network, so
a wildcard bind is narrowed to the pod IP (``QWEN_HICACHE_SIM_POD_IP``): nothing a test starts listens beyond
loopback, and two pods can use the same port. Loaded through PYTHONPATH only for processes the stand-in runs.

Names are resolved as a pod's cluster DNS would first (``QWEN_HICACHE_SIM_HOSTS``, the records harness.sim.dns
publishes, with the pod's namespace as its search path), then by the host's resolver.
"""

import json
import os
import socket

_POD_IP = os.environ.get("QWEN_HICACHE_SIM_POD_IP")
_HOSTS = os.environ.get("QWEN_HICACHE_SIM_HOSTS")
_NAMESPACE = os.environ.get("QWEN_HICACHE_SIM_POD_NAMESPACE")
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

_DNS_PY = "QWEN_HICACHE_SIM_DNS_PY"

if _HOSTS:
    _getaddrinfo, _gethostbyname = socket.getaddrinfo, socket.gethostbyname

    def _cluster_ip(host: object) -> object:
        """The record's IP for a cluster name, else the name unchanged (read fresh: records follow pods)."""
        if not isinstance(host, str) or "." not in host or host.replace(".", "").isdigit():
            return host
        try:
            from harness.sim.dns import lookup
        except ImportError:  # an image without the harness: the kubelet stand-in mounts dns.py (stdlib only)
            import importlib.util

            spec = importlib.util.spec_from_file_location("qwen_hicache_sim_dns", os.environ[_DNS_PY])
            dns = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(dns)  # type: ignore[union-attr]
            lookup = dns.lookup

        try:
            with open(_HOSTS) as fh:
                table = json.load(fh)
        except (OSError, ValueError):
            return host
        return lookup(table, host, _NAMESPACE) or host

    def _pod_getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
        return _getaddrinfo(_cluster_ip(host), *args, **kwargs)  # type: ignore[arg-type]

    def _pod_gethostbyname(host: str) -> str:
        return _gethostbyname(_cluster_ip(host))  # type: ignore[arg-type]

    socket.getaddrinfo = _pod_getaddrinfo  # type: ignore[assignment]
    socket.gethostbyname = _pod_gethostbyname  # type: ignore[assignment]
