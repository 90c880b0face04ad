"""The cache fingerprint: everything that changes the bytes of a stored page but is not in SGLang's file key.

SGLang 0.5.23 names a page file by a SHA-256 chain over token ids, the served name and the TP rank/size
only. A new weights revision, a smaller KV dtype, a layout change or MTP on->off would then reinterpret
old bytes silently. So each configuration gets its own directory, `<cache mount>/<fingerprint>`, and a
marker file in it; a directory whose marker disagrees is never used.

Inputs (documented in the README; `FINGERPRINT_VERSION` changes when this list changes):
runtime image (digest when given by digest) and runtime parent + patch series, model revision, served
name, resolved geometry, dtype, quantization, KV cache dtype, Mamba SSM and conv dtypes, page size,
memory layout, IO backend, speculative algorithm and draft layers, TP and PP size, and any extra runtime
flag that overrides the model's configuration or computes pages differently (deterministic inference); across
nodes also the node count and the ranks per node (the same TP size split otherwise would put ranks on volumes that
lack their files: cold by design, said so).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import runtime_flags
from .geometry import Geometry, resolve_geometry
from .spec import QwenHiCacheServerSpec

FINGERPRINT_VERSION = 1
RUNTIME_PARENT = "sglang==0.5.23"
RUNTIME_SERIES = "0.5.23-qhc.13"
"""`series_version` of runtime_patches/manifest.json that the runtime image carries (a test keeps them equal)."""
MAMBA_CONV_DTYPE = "bfloat16"
SIZING_ONLY_GEOMETRY = frozenset({
    "checkpointKvFp8", "pleTableRows", "pleTableRowDim", "pleTableDtype", "pleTablePinned", "gpuWeightBytes",
    "maxContextLength",
})
"""Geometry fields that size memory (or bound the context) but never change the bytes of a stored page."""
BYTE_AFFECTING_EXTRA_FLAGS = frozenset({
    "--json-model-override-args", "--qsa-indexer-dtype",
    "--speculative-draft-kv-cache-dtype", "--mamba-ssm-dtype", "--kv-cache-quant-algo",
    "--enable-deterministic-inference",
})
"""Extra flags that change page bytes. Deterministic inference computes KV with batch-invariant kernels so that a
cache hit equals a recompute bit for bit; a page written without it breaks that promise."""


def _image_identity(image: str) -> str:
    """The digest when the image is pinned by one (a retag then does not change the cache), else the ref."""
    return image.split("@", 1)[1] if "@" in image else image


def _extra_overrides(args: list[str]) -> list[str]:
    """Extra flags (with their values) that change page bytes, each named as the runtime's parser reads it (an
    abbreviation argparse accepts is the same setting); a flag spelled out stays exactly as written."""
    out, take_next = [], False
    for arg in args:
        if take_next:
            out.append(arg)
            take_next = False
            continue
        resolved = runtime_flags.resolve(arg)
        option = resolved.option if resolved else None
        if option in BYTE_AFFECTING_EXTRA_FLAGS:
            written = arg.split("=", 1)[0]
            out.append(option + arg[len(written):])
            take_next = "=" not in arg and option not in runtime_flags.table().switches
    return out


def fingerprint_inputs(spec: QwenHiCacheServerSpec, geometry: Geometry | None = None) -> dict[str, Any]:
    """Every input of the fingerprint, named; shown in status so a cold start can be explained. `geometry`: the
    spec's resolved geometry (derive passes the one it resolved; resolved here otherwise)."""
    rt, hc = spec.runtime, spec.hicache
    geometry = geometry or resolve_geometry(spec.model)
    speculative = rt.speculative
    return {
        "fingerprintVersion": FINGERPRINT_VERSION,
        "runtimeImage": _image_identity(rt.image),
        "runtimeParent": RUNTIME_PARENT,
        "runtimeSeries": RUNTIME_SERIES,
        "modelRevision": spec.model.revision,
        "servedName": spec.model.served_name,
        "geometry": {k: v for k, v in geometry.wire().items() if k not in SIZING_ONLY_GEOMETRY},
        "dtype": rt.dtype,
        "quantization": rt.quantization or "none",
        "kvCacheDtype": rt.kv_cache_dtype,
        "mambaSsmDtype": rt.mamba_ssm_dtype or geometry.mamba_ssm_dtype or "float32",
        "mambaConvDtype": MAMBA_CONV_DTYPE,
        "pageSize": rt.page_size,
        "memLayout": hc.mem_layout,
        "ioBackend": hc.io_backend,
        "speculativeAlgorithm": speculative.algorithm if speculative else "none",
        "draftLayers": (geometry.mtp_layers or 0) if speculative else 0,
        "tensorParallelSize": rt.tensor_parallel_size,
        "pipelineParallelSize": 1,
        "modelOverrides": _extra_overrides(rt.extra_args),
        **({"nodes": spec.nodes, "ranksPerNode": rt.tensor_parallel_size // spec.nodes} if spec.nodes > 1 else {}),
    }


def fingerprint_of(inputs: dict[str, Any]) -> str:
    """`v<version>-<16 hex>`: short enough for a directory name, stable across operator releases."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return f"v{FINGERPRINT_VERSION}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def fingerprint(spec: QwenHiCacheServerSpec) -> str:
    """The fingerprint of a spec (see `fingerprint_inputs`)."""
    return fingerprint_of(fingerprint_inputs(spec))
