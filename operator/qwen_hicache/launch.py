"""Derive the SGLang command line and environment from the spec: the only place runtime flags are spelled.

Pure functions. The operator refuses `extraArgs`/`env` that would override what it derives here, because
a silently overridden flag would make the status, the sizing and the cache fingerprint lie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .constants import JIT_CACHE_DIR, PRESTOP_RECORD
from .spec import QwenHiCacheServerSpec

MODEL_MOUNT = "/models"
CACHE_MOUNT = "/var/cache/hicache"
ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]

STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
MAX_SIZE_ENV = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
ADMIN_KEY_ENV = "QWEN_HICACHE_ADMIN_API_KEY"
ADMIN_SECRET_KEY = "api-key"
DRAIN_TIMEOUT_ENV = "SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT"
"""Runtime patch 0003: seconds the SIGTERM path keeps writing queued disk backups (default 8)."""
JIT_CACHE_ROOT = f"{CACHE_MOUNT}/{JIT_CACHE_DIR}"
"""Compiled kernels per cache namespace: `JIT_CACHE_ROOT/<fingerprint>`."""
JIT_CACHE_ENV = (("SGLANG_JIT_CACHE_DIR", "jit"), ("TRITON_CACHE_DIR", "triton"),
                 ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("CUDA_CACHE_PATH", "nv"), ("TILELANG_CACHE_DIR", "tilelang"),
                 ("FLASHINFER_WORKSPACE_BASE", ""), ("SGLANG_CUTE_AOT_CACHE_DIR", "cute_aot"),
                 ("SGLANG_DG_CACHE_DIR", "deep_gemm"))  # fmt: skip
"""The runtime's compile caches, each at the subdirectory the runtime gives it under SGLANG_CACHE_DIR (its
`third_party_cache_defaults()` and its CuTe and DeepGEMM caches; its own JIT's default sits beside them), so a
restarted pod loads its kernels instead of building them again (H100: a start took 318 s with empty Triton caches,
108 s with warm ones). Not SGLANG_CACHE_DIR itself: it also places the PLE table's file backend, which is no cache.
A name the spec's `runtime.env` sets keeps the spec's value."""
MANAGED_ENV = frozenset({
    STORAGE_DIR_ENV, MAX_SIZE_ENV, ADMIN_KEY_ENV, DRAIN_TIMEOUT_ENV, "QWEN_HICACHE_PORT", "QWEN_HICACHE_DRAIN_SECONDS",
    "QWEN_HICACHE_FLUSH_SECONDS", "QWEN_HICACHE_FINGERPRINT",
})


@dataclass(frozen=True)
class LaunchSizing:
    """The numbers render needs from sizing, decoupled from how sizing derives them."""

    host_size_gb: int | None
    """`--hicache-size` (whole GB per rank), or None to use `--hicache-ratio`."""
    pod_memory_request_bytes: int
    pod_memory_limit_bytes: int
    shm_bytes: int
    disk_cap_bytes_per_rank: int | None
    disk_volume_bytes: int | None
    host_ratio: float = 2.0
    """`--hicache-ratio` when no size is set (always passed: unset, the runtime sizes from free RAM)."""
    device_mamba_slots: int | None = None
    """`--max-mamba-cache-size` the sizing assumed (always passed, so the runtime matches the numbers)."""
    device_kv_tokens: int | None = None
    """`--max-total-tokens`: the device KV pool the spec states (page-aligned), so the runtime builds the pool the
    host pools were sized against instead of profiling free GPU memory; None (estimated) renders nothing."""
    max_running_requests: int | None = None
    """`--max-running-requests` the sizing assumed (always passed: it sets the Mamba verify-scratch count)."""
    host_bytes_per_rank: int = 0
    """Pinned host pool bytes per rank (what a flush may have to write)."""


def model_path(spec: QwenHiCacheServerSpec) -> str:
    """Where the weights appear inside the runtime container."""
    sub = spec.model.weights.path.strip("/")
    return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT


def _model_flags(spec: QwenHiCacheServerSpec, sizing: LaunchSizing) -> list[str]:
    rt = spec.runtime
    args = [
        "--model-path", model_path(spec),
        "--served-model-name", spec.model.served_name,
        "--host", "0.0.0.0",
        "--port", str(rt.port),
        "--tp-size", str(rt.tensor_parallel_size),
        "--page-size", str(rt.page_size),
        "--kv-cache-dtype", rt.kv_cache_dtype,
    ]
    optional = {
        "--dtype": rt.dtype,
        "--quantization": rt.quantization,
        "--context-length": rt.context_length,
        "--max-running-requests": sizing.max_running_requests or rt.max_running_requests,
        "--mamba-ssm-dtype": rt.mamba_ssm_dtype,
        "--mem-fraction-static": rt.mem_fraction_static,
    }
    if sizing.device_mamba_slots:
        optional["--max-mamba-cache-size"] = sizing.device_mamba_slots
    if sizing.device_kv_tokens:
        optional["--max-total-tokens"] = sizing.device_kv_tokens
    for flag, value in optional.items():
        if value is not None:
            args += [flag, str(value)]
    if rt.speculative:
        sp = rt.speculative
        args += [
            "--speculative-algorithm", sp.algorithm,
            "--speculative-num-steps", str(sp.num_steps),
            "--speculative-num-draft-tokens", str(sp.num_draft_tokens),
            "--speculative-eagle-topk", str(sp.eagle_topk),
        ]
    return args


def _hicache_flags(spec: QwenHiCacheServerSpec, sizing: LaunchSizing) -> list[str]:
    hc = spec.hicache
    args = ["--enable-hierarchical-cache"]
    if sizing.host_size_gb is not None:
        args += ["--hicache-size", str(sizing.host_size_gb)]
    else:
        args += ["--hicache-ratio", str(sizing.host_ratio)]
    if hc.host_mamba_slots_per_rank:
        args += ["--hicache-mamba-host-slots", str(hc.host_mamba_slots_per_rank)]
    args += [
        "--hicache-write-policy", hc.write_policy,
        "--hicache-io-backend", hc.io_backend,
        "--hicache-mem-layout", hc.mem_layout,
    ]
    if hc.disk.enabled:
        args += [
            "--hicache-storage-backend", "file",
            "--hicache-storage-prefetch-policy", hc.prefetch_policy,
        ]
    return args


MEMORY_FLAGS = frozenset({
    "--enable-linear-replayssm", "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len",
    "--mamba-radix-cache-strategy", "--disable-radix-cache", "--disable-overlap-schedule",
    "--mamba-full-memory-ratio", "--speculative-draft-kv-cache-dtype", "--qsa-indexer-dtype",
    "--enable-unified-memory", "--hicache-host-memory-fraction", "--max-total-tokens",
})
"""Flags that change what the runtime allocates for the host pools or the split weights (Mamba verify scratch,
slots per request, draft/index dtypes): the operator sizes for their defaults, so extraArgs may not set them."""

OBSERVABILITY = ["--enable-metrics", "--enable-cache-report"]
ADMIN = [f"--admin-api-key=$({ADMIN_KEY_ENV})"]
"""The key comes from a Secret through the environment (Kubernetes expands `$(VAR)` in args). One argument, so
a key that starts with `-` (older Secrets held `token_urlsafe` keys) is never taken for a flag."""


def managed_args(spec: QwenHiCacheServerSpec, sizing: LaunchSizing) -> list[str]:
    """The arguments the operator derives (derive.Derived keeps them; extraArgs follow them)."""
    return [*_model_flags(spec, sizing), *_hicache_flags(spec, sizing), *OBSERVABILITY, *ADMIN]


def launch_args(spec: QwenHiCacheServerSpec, sizing: LaunchSizing) -> list[str]:
    """The runtime's full argument list (after the entrypoint), extra args last."""
    return [*managed_args(spec, sizing), *spec.runtime.extra_args]


GROUP_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")
"""A multi-node group's flags (render_lws sets them on every pod of a group)."""
ALWAYS_MANAGED = frozenset({"--hicache-storage-backend", "--hicache-ratio", "--hicache-size",
                            "--hicache-mamba-host-slots", *MEMORY_FLAGS, *GROUP_FLAGS})
"""Flags the operator owns whether or not it renders them for this spec (extra args may not set them)."""


def cache_dir(fingerprint: str) -> str:
    """The runtime's storage directory: one namespace per configuration on the cache volume."""
    return f"{CACHE_MOUNT}/{fingerprint}"


def jit_cache_dir(fingerprint: str) -> str:
    """Where this namespace's compiled kernels live on the cache volume."""
    return f"{JIT_CACHE_ROOT}/{fingerprint}"


def jit_cache_env(fingerprint: str, taken: set[str]) -> list[dict[str, Any]]:
    """The compile caches on the volume (`JIT_CACHE_ENV`), but for names in `taken` (the spec's own)."""
    base = jit_cache_dir(fingerprint)
    return [{"name": k, "value": f"{base}/{sub}" if sub else base} for k, sub in JIT_CACHE_ENV if k not in taken]


def launch_env(spec: QwenHiCacheServerSpec, sizing: LaunchSizing, fingerprint: str, admin_secret: str,
               drain_seconds: int, flush_seconds: int) -> list[dict[str, Any]]:  # fmt: skip
    """Environment of the runtime container: file tier and compile caches on the volume, admin key, drain settings
    (the stop budget's terms, `podlifecycle.DrainPlan`), then the user's env."""
    env: list[dict[str, Any]] = []
    if spec.hicache.disk.enabled:
        env.append({"name": STORAGE_DIR_ENV, "value": cache_dir(fingerprint)})
        env.append({"name": "QWEN_HICACHE_FINGERPRINT", "value": fingerprint})
        if sizing.disk_cap_bytes_per_rank:
            env.append({"name": MAX_SIZE_ENV, "value": str(sizing.disk_cap_bytes_per_rank)})
        # What the preStop flush could not write is drained at SIGTERM within the same budget.
        env.append({"name": DRAIN_TIMEOUT_ENV, "value": str(flush_seconds)})
        env += prestop_record_env()
        env += jit_cache_env(fingerprint, {e.name for e in spec.runtime.env})
    env.append({"name": ADMIN_KEY_ENV,
                "valueFrom": {"secretKeyRef": {"name": admin_secret, "key": ADMIN_SECRET_KEY}}})
    env += [
        {"name": "QWEN_HICACHE_PORT", "value": str(spec.runtime.port)},
        {"name": "QWEN_HICACHE_DRAIN_SECONDS", "value": str(drain_seconds)},
        {"name": "QWEN_HICACHE_FLUSH_SECONDS", "value": str(flush_seconds)},
    ]
    env += [{"name": e.name, "value": e.value} for e in spec.runtime.env]
    return env


@dataclass(frozen=True)
class Command:
    """The runtime container as derived once per spec (derive.Derived.command): what render puts in the pod."""

    managed_args: tuple[str, ...]
    """The arguments the operator derives; extraArgs follow them."""
    env: tuple[dict[str, Any], ...]
    startup_failures: int
    """The startup probe's failure threshold at STARTUP_PROBE_PERIOD (covers runtime.startupTimeoutSeconds)."""


STARTUP_PROBE_PERIOD = 10
"""Seconds between startup probes."""


def command(spec: QwenHiCacheServerSpec, sizing: LaunchSizing, fingerprint: str, admin_secret: str,
            drain_seconds: int, flush_seconds: int) -> Command:  # fmt: skip
    """The runtime container's arguments, environment (`launch_env`) and startup allowance."""
    return Command(tuple(managed_args(spec, sizing)),
                   tuple(launch_env(spec, sizing, fingerprint, admin_secret, drain_seconds, flush_seconds)),
                   startup_failure_threshold(spec, STARTUP_PROBE_PERIOD))


def prestop_record_env() -> list[dict[str, Any]]:
    """Where the preStop records its outcome, and whose it is (the successor's check matches the uid)."""
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    return [{"name": "QWEN_HICACHE_PRESTOP_RECORD", "value": f"{CACHE_MOUNT}/{PRESTOP_RECORD}"},
            {"name": "QWEN_HICACHE_POD_NAME", "valueFrom": field("metadata.name")},
            {"name": "QWEN_HICACHE_POD_UID", "valueFrom": field("metadata.uid")}]


def startup_failure_threshold(spec: QwenHiCacheServerSpec, period_seconds: int) -> int:
    """Startup probe attempts that cover the allowed model-loading time."""
    return max(1, math.ceil(spec.runtime.startup_timeout_seconds / period_seconds))
