"""SIMULATION ONLY: the cluster DNS records pods resolve each other by (no CoreDNS runs here).

A pod with `spec.hostname` and `spec.subdomain` gets the record `<hostname>.<subdomain>.<ns>.svc.cluster.local`
when a headless Service named `<subdomain>` in its namespace selects it, and only while it is Ready unless the
Service sets `publishNotReadyAddresses` (what the LeaderWorkerSet's Service does, so workers reach a leader that is
not Ready yet). That is how `LWS_LEADER_ADDRESS` (`<lws>-<group>.<lws>.<ns>`) resolves in a real cluster.

`records()` computes the map from what the API server holds; `HostsFile` publishes it as JSON, which
`harness/sim/podnet/sitecustomize.py` consults (through ``QWEN_HICACHE_SIM_HOSTS``) before the host's resolver,
with a pod's search path (`<ns>.svc.cluster.local svc.cluster.local cluster.local`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
HOSTS_ENV = "QWEN_HICACHE_SIM_HOSTS"
CLUSTER_DOMAIN = "cluster.local"


def records(pods: list[Obj], services: list[Obj]) -> dict[str, str]:
    """`<hostname>.<subdomain>.<ns>` -> pod IP for every pod a headless Service publishes."""
    headless = {
        (s["metadata"]["namespace"], s["metadata"]["name"]): s["spec"]
        for s in services
        if (s.get("spec") or {}).get("clusterIP") == "None"
    }
    out: dict[str, str] = {}
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        hostname, subdomain, ip = spec.get("hostname"), spec.get("subdomain"), status.get("podIP")
        service = headless.get((meta["namespace"], subdomain))
        if not (hostname and subdomain and ip and service is not None) or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        if not service.get("selector") or any(labels.get(k) != v for k, v in service["selector"].items()):
            continue
        if service.get("publishNotReadyAddresses") or _ready(status):
            out[f"{hostname}.{subdomain}.{meta['namespace']}"] = ip
    return out


def _ready(status: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def lookup(table: dict[str, str], name: str, namespace: str | None) -> str | None:
    """A name as a pod's resolver would expand it: absolute, or with its search path (own namespace first)."""
    name = name.rstrip(".")
    for suffix in (f".svc.{CLUSTER_DOMAIN}", ".svc"):
        if name.endswith(suffix):
            return table.get(name[: -len(suffix)])
    if name in table:
        return table[name]
    return table.get(f"{name}.{namespace}") if namespace else None


class HostsFile:
    """The published records, rewritten atomically only when they change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: dict[str, str] | None = None
        self.publish({})

    def publish(self, table: dict[str, str]) -> None:
        if table == self.current:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(table, sort_keys=True))
        os.replace(partial, self.path)
        self.current = dict(table)
