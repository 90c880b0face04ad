"""Everything the operator derives from one valid spec, computed once per plan (cert-manager's `policies.Input`).

`plan()` builds one `Derived` and everything below reads it: the policy checks, the renderers, the status and
the rollout. Each fact is computed here and nowhere else: the resolved geometry, the sizing with its fit
against the smallest known node, the cache layout (fingerprint, its inputs, the stop budget), the runtime's
arguments, the config hash and rollout target, and the rollout's rules. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import fingerprint, launch, podlifecycle, rollout
from .constants import admin_secret_name
from .geometry import Geometry
from .runtime_flags import flag_names
from .sizing import DEFAULT_HICACHE_RATIO, Sizing, compute_sizing, node_fit
from .spec import QwenHiCacheServerSpec


@dataclass(frozen=True)
class CacheLayout:
    """How a pod uses its cache volume: the namespace (fingerprint and its inputs) and the stop budget."""

    fingerprint: str
    inputs: dict[str, object]
    drain: podlifecycle.DrainPlan


@dataclass(frozen=True)
class Derived:
    """One spec's derived facts; see the module docstring. Plain values only, so that reading one runs no code."""

    spec: QwenHiCacheServerSpec
    geometry: Geometry
    sizing: Sizing
    fit: tuple[str, ...]
    """Why the pod cannot fit the smallest known node's allocatable memory, or (multi-node) the largest known
    node's GPUs (empty when it fits or is unknown)."""
    launch: launch.LaunchSizing
    layout: CacheLayout
    command: launch.Command
    """The runtime container's derived arguments (everything but `runtime.extraArgs`), environment and startup
    allowance."""
    args: tuple[str, ...]
    """The runtime's full argument list (after the entrypoint), extra args last."""
    managed_flags: frozenset[str]
    """Flags the operator sets itself, plus those it always owns (extraArgs may not repeat them)."""
    config_hash: str
    target: str
    policy: rollout.Policy
    allowed_down: int
    """Pods (groups) that may be down at once: the rollout's and the PodDisruptionBudget's number."""
    problems: tuple[str, ...]
    """Sizing refusals: the disk's and the node fit's."""
    write_rate: int = 0
    """hicache.disk.writeBytesPerSecond, bytes."""
    measured_write_rate: int | None = None
    """The disk tier's write rate as the last rollout's replaced pods measured it (status.cache), if known."""


def gpu_fit(spec: QwenHiCacheServerSpec, node_gpus: int | None) -> tuple[str, ...]:
    """Why a multi-node server's pods cannot land: each needs `tensorParallelSize / nodesPerReplica` GPUs on one
    node, and the largest node the operator could read has fewer. Unknown (None): not checked. One node per
    replica is not checked here (its sizing has always been the memory fit only)."""
    per_pod = spec.runtime.tensor_parallel_size // spec.nodes
    if spec.nodes == 1 or node_gpus is None or node_gpus >= per_pod:
        return ()
    return (f"each of the {spec.nodes} pods of a replica needs {per_pod} GPUs ({spec.runtime.gpu_resource_name}: "
            f"tensorParallelSize {spec.runtime.tensor_parallel_size} / nodesPerReplica {spec.nodes}) on one node, but "
            f"the largest node that matches runtime.nodeSelector has {node_gpus}; raise nodesPerReplica or add "
            "nodes with more GPUs",)


def launch_sizing(sized: Sizing) -> launch.LaunchSizing:
    """The numbers launch and render need from the sizing (here, so that sizing needs no launch)."""
    return launch.LaunchSizing(
        host_size_gb=sized.host.hicache_size_gb,
        pod_memory_request_bytes=sized.pod_memory_request_bytes,
        pod_memory_limit_bytes=sized.pod_memory_limit_bytes,
        shm_bytes=sized.shm_bytes,
        disk_cap_bytes_per_rank=sized.disk.cap_bytes_per_rank,
        disk_volume_bytes=sized.disk.volume_bytes,
        host_ratio=sized.host.hicache_ratio or DEFAULT_HICACHE_RATIO,
        device_mamba_slots=sized.device.mamba_slots or None,
        device_kv_tokens=None if sized.device.kv_tokens_estimated else sized.device.kv_tokens,
        max_running_requests=sized.device.requests,
        host_bytes_per_rank=sized.host.total_bytes,
    )


def budget_rate(spec_rate: int, measured: int | None) -> int:
    """The write rate the flush budget assumes: hicache.disk.writeBytesPerSecond, or the rate the replaced pods'
    disk tiers measured when that is lower (a stop must not lose queued writes to a budget the disk misses)."""
    return min(spec_rate, measured) if measured else spec_rate


def derive(spec: QwenHiCacheServerSpec, geometry: Geometry, node_bytes: int | None = None,
           node_gpus: int | None = None, measured_write_rate: int | None = None,
           name: str = "") -> Derived:  # fmt: skip
    """Every derived fact of a spec whose geometry resolved (`name`: the resource's, for the names its pods refer
    to). Raises SizingError (or an ArithmeticError for absurd numbers) when it cannot be sized; the caller turns
    that into a condition."""
    sized = compute_sizing(spec, geometry)
    sizing = launch_sizing(sized)
    inputs = fingerprint.fingerprint_inputs(spec, geometry)
    fp = fingerprint.fingerprint_of(inputs)
    rate = budget_rate(sized.write_rate, measured_write_rate)
    drain = podlifecycle.drain_plan(spec, sizing.host_bytes_per_rank, rate)
    command = launch.command(spec, sizing, fp, admin_secret_name(name), drain.drain_seconds, drain.flush_seconds)
    fit = (*node_fit(sized, spec, node_bytes), *gpu_fit(spec, node_gpus))
    restarts = rollout.restarts(spec, fp)
    return Derived(
        spec=spec,
        geometry=geometry,
        sizing=sized,
        fit=fit,
        launch=sizing,
        layout=CacheLayout(fp, inputs, drain),
        command=command,
        args=(*command.managed_args, *spec.runtime.extra_args),
        managed_flags=flag_names(command.managed_args) | launch.ALWAYS_MANAGED,
        config_hash=restarts.config_hash,
        target=restarts.target,
        policy=restarts.policy,
        allowed_down=restarts.allowed_down,
        problems=(*sized.problems, *fit),
        write_rate=sized.write_rate,
        measured_write_rate=measured_write_rate,
    )
