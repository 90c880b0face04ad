"""Shared test inputs: the shipped example and the bad specs both the schema and pydantic must refuse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "qwenhicache.yaml"


def example() -> dict[str, Any]:
    """A fresh copy of examples/qwenhicache.yaml."""
    return yaml.safe_load(EXAMPLE.read_text())


def variant(**changes: Any) -> dict[str, Any]:
    """The example with dotted-path changes, e.g. variant(**{"spec.runtime.tensorParallelSize": 4})."""
    doc = copy.deepcopy(example())
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


DELETE = object()

# The golden renders' inputs (tests/golden): one of each kind of server the operator renders.
VARIANTS: dict[str, dict[str, Any]] = {
    "example": example(),
    "tp1": variant(**{
        "spec.runtime.tensorParallelSize": 1, "spec.hicache.hostMemoryPerRankGB": 20, "spec.replicas": 1,
        "spec.runtime.speculative": None, "spec.runtime.gpuMemoryGB": 141,
    }),
    "tp4": variant(**{
        "spec.runtime.tensorParallelSize": 4, "spec.hicache.hostMemoryPerRankGB": 16,
        "spec.hicache.disk": {"enabled": True, "size": "1Ti", "storageClassName": "fast-nvme", "retention": "Delete"},
        "spec.runtime.extraArgs": ["--chunked-prefill-size", "8192"],
        "spec.runtime.env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
    }),
    "tp4-2nodes": variant(**{
        "spec.nodesPerReplica": 2, "spec.runtime.tensorParallelSize": 4, "spec.hicache.hostMemoryPerRankGB": 16,
        "spec.hicache.disk": {"enabled": True, "size": "1Ti", "retention": "Delete"},
    }),
}


def operator_settings(**changes: Any) -> Any:
    """The operator's settings for tests: a 1 s resync, a 0.3 s rollout poll, nodes never cached (`changes` win)."""
    from qwen_hicache.settings import Settings

    return Settings(**{"resync_seconds": 1, "rollout_poll_seconds": 0.3, "node_cache_seconds": 0, **changes})


def derived(doc: dict[str, Any], node_bytes: int | None = None) -> Any:
    """What `plan` derives from a document's spec (qwen_hicache.derive.Derived)."""
    from qwen_hicache.derive import derive
    from qwen_hicache.geometry import resolve_geometry
    from qwen_hicache.plan import parse_spec

    spec = parse_spec(doc["spec"])
    return derive(spec, resolve_geometry(spec.model), node_bytes, name=doc.get("metadata", {}).get("name", ""))

# (id, dotted changes, a fragment both pydantic and the API server must put in their message)
BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("tp-zero", {"spec.runtime.tensorParallelSize": 0}, "tensorParallelSize"),
    ("tp-not-divisible-by-nodes", {"spec.nodesPerReplica": 3},
     "runtime.tensorParallelSize must be divisible by nodesPerReplica"),
    ("dist-init-port-is-the-http-port", {"spec.nodesPerReplica": 2, "spec.runtime.distInitPort": 30000},
     "runtime.distInitPort must differ from runtime.port"),
    ("page-not-power-of-two", {"spec.runtime.pageSize": 48}, "pageSize must be a power of two"),
    ("unknown-write-policy", {"spec.hicache.writePolicy": "write_sometimes"}, "writePolicy"),
    ("disk-without-size", {"spec.hicache.disk": {"enabled": True}}, "disk tier is enabled but has no size"),
    ("layer-first-layout", {"spec.hicache.memLayout": "layer_first", "spec.hicache.ioBackend": "kernel"},
     "accepts only memLayout page_first or page_first_direct"),
    ("layout-io-mismatch", {"spec.hicache.ioBackend": "direct"}, "page_first_direct goes with ioBackend direct"),
    ("size-and-ratio", {"spec.hicache.hostRatio": 2.0}, "set hostMemoryPerRankGB or hostRatio, not both"),
    ("host-size-zero", {"spec.hicache.hostMemoryPerRankGB": 0}, "hostMemoryPerRankGB"),
    ("no-revision", {"spec.model.revision": DELETE}, "revision"),
    ("unknown-field", {"spec.runtime.tpSize": 2}, "tpSize"),
    ("draft-larger-than-page", {"spec.runtime.pageSize": 2}, "pageSize must be at least speculative.numDraftTokens"),
    ("replicas-negative", {"spec.replicas": -1}, "replicas"),
]
