"""The typed `status`: the CRD's status schema is generated from these models (see crd.py), like the spec's.

Every module that reports builds these objects (plan: launch and cache; sizing; the rollout: restart; the
router seam: router; status: the conditions, replicaCache and the whole), and the reconciler serializes the
result once (`wire()`) to compute the patch. Unknown keys are refused (`extra="forbid"`). Every field is
optional: a blocked or brand-new resource has only conditions.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, WithJsonSchema

from .conditions import Condition
from .geometry import Geometry
from .typed import ApiModel

Obj = dict[str, Any]
log = logging.getLogger(__name__)


def _open_string(values: tuple[str, ...], what: str) -> WithJsonSchema:
    """A typed name in Python, a plain string in the CRD: a value a newer operator adds must never make the API
    server refuse the whole status write of an older CRD."""
    return WithJsonSchema({"type": "string", "description": f"{what}: {', '.join(values)}."})


STEPS = ("Canary", "Delete", "WaitingReady", "Verify")
PHASES = ("Rolling", "Paused", "Complete")
Step = Annotated[Literal["Canary", "Delete", "WaitingReady", "Verify"], _open_string(STEPS, "The step")]
Phase = Annotated[Literal["Rolling", "Paused", "Complete"], _open_string(PHASES, "The phase")]


class Record(ApiModel):
    """A status record a state machine updates in place (the rollout's): mutable, still strict."""

    model_config = ConfigDict(**{**ApiModel.model_config, "frozen": False})


class Launch(ApiModel):
    """The launch configuration the pods run (of the last applied spec)."""

    image: str | None = None
    tensor_parallel_size: int | None = None
    gpus_per_pod: int | None = None
    host_memory_per_rank_gb: Annotated[int | None, Field(alias="hostMemoryPerRankGB")] = None
    """`--hicache-size`: pinned host pool per TP rank, GB (absent when sized by `--hicache-ratio`)."""
    args: list[str] | None = None
    """The runtime's command-line arguments, exactly as rendered."""
    render_version: str | None = None
    """Version of the operator's rendering; a change alone never restarts pods."""


class MemoryTerm(ApiModel):
    """One explained addend of the pod memory limit."""

    name: str
    bytes: int
    why: str


class Sizing(ApiModel):
    """Every number derived from the spec and the model geometry (sizing.Sizing.as_status)."""

    tensor_parallel_size: int | None = None
    page_size: int | None = None
    """Tokens per KV page."""
    kv_bytes_per_token: int | None = None
    """Host KV bytes per token on one rank (target layers plus the packed MTP draft layer)."""
    index_bytes_per_page: int | None = None
    """QSA compressed-key index bytes per page on one rank (0 without QSA)."""
    mamba_bytes_per_slot: int | None = None
    """Conv + SSM state bytes of one request slot on one rank."""
    ple_state_bytes_per_slot: int | None = None
    """PLE short-conv state bytes of one slot on one rank."""
    device_kv_tokens_per_rank: Annotated[int | None, Field(alias="deviceKVTokensPerRank")] = None
    """GPU KV pool of one rank, tokens."""
    device_kv_tokens_estimated: Annotated[bool | None, Field(alias="deviceKVTokensEstimated")] = None
    """True when the device KV pool was estimated from GPU memory (hicache.deviceKVTokens unset)."""
    device_mamba_slots_per_rank: int | None = None
    device_mamba_slots_assumed: bool | None = None
    """True when the device Mamba slot count is the runtime's default, not given."""
    device_kv_bytes_per_rank: Annotated[int | None, Field(alias="deviceKVBytesPerRank")] = None
    device_mamba_bytes_per_rank: int | None = None
    device_index_bytes_per_rank: int | None = None
    running_requests: int | None = None
    """Requests the runtime keeps running at once (after its own caps)."""
    mamba_spec_states: int | None = None
    """Speculative Mamba states the runtime allocates."""
    hicache_size_gb: Annotated[int | None, Field(alias="hicacheSizeGB")] = None
    """`--hicache-size` per rank, GB (absent when sized by ratio)."""
    hicache_ratio: float | None = None
    """`--hicache-ratio` (absent when sized in GB)."""
    host_kv_tokens_per_rank: Annotated[int | None, Field(alias="hostKVTokensPerRank")] = None
    host_mamba_slots_per_rank: int | None = None
    host_kv_bytes_per_rank: Annotated[int | None, Field(alias="hostKVBytesPerRank")] = None
    host_index_bytes_per_rank: int | None = None
    host_mamba_bytes_per_rank: int | None = None
    host_bytes_per_rank: int | None = None
    """All pinned host pools of one rank."""
    host_bytes_per_pod: int | None = None
    coverage_kv_tokens_per_mamba_slot: Annotated[int | None, Field(alias="coverageKVTokensPerMambaSlot")] = None
    """Host KV tokens per host Mamba slot: the prefix length a restored state can cover on average."""
    coverage_restorable_kv_tokens_per_rank: Annotated[
        int | None, Field(alias="coverageRestorableKVTokensPerRank")] = None
    """Host KV tokens that have a Mamba state to restore with."""
    coverage_fraction: float | None = None
    """coverageRestorableKVTokensPerRank / hostKVTokensPerRank."""
    pod_memory_request_bytes: int | None = None
    pod_memory_limit_bytes: int | None = None
    shm_bytes: int | None = None
    """Size of the memory-backed /dev/shm."""
    disk_cap_bytes_per_rank: int | None = None
    """Page payload the disk tier may hold per rank."""
    disk_volume_bytes: int | None = None
    """Size of each replica's cache volume (all ranks plus headroom)."""
    disk_headroom_fraction: float | None = None
    pages_per_rank: int | None = None
    """Pages a full disk cap holds per rank."""
    files_per_rank: int | None = None
    """Page files a full disk cap writes per rank (one per page and pool)."""
    files_per_rank_by_pool: dict[str, int] | None = None
    memory_terms: list[MemoryTerm] | None = None
    """The addends of the pod memory limit, each with its reason."""
    notes: list[str] | None = None
    """Advice that does not block (e.g. a host tier no larger than the device tier)."""
    problems: list[str] | None = None
    """Sizing refusals."""


class FingerprintInputs(ApiModel):
    """Everything the cache fingerprint hashes: a change of any of these starts a new cache namespace."""

    fingerprint_version: int | None = None
    runtime_image: str | None = None
    """The image identity (digest, or the tag when not pinned)."""
    runtime_parent: str | None = None
    runtime_series: str | None = None
    model_revision: str | None = None
    served_name: str | None = None
    geometry: Geometry | None = None
    """The geometry fields that change a stored page's bytes."""
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    mamba_ssm_dtype: str | None = None
    mamba_conv_dtype: str | None = None
    page_size: int | None = None
    mem_layout: str | None = None
    io_backend: str | None = None
    speculative_algorithm: str | None = None
    draft_layers: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    nodes: int | None = None
    """Nodes per replica (multi-node servers only): each node's volume holds its own ranks' shards."""
    ranks_per_node: int | None = None
    """TP ranks on each node (multi-node servers only)."""
    model_overrides: list[str] | None = None
    """Byte-affecting runtime.extraArgs (flags with their values)."""


class Cache(ApiModel):
    """The disk cache's identity and stop budget."""

    fingerprint: str | None = None
    """The cache namespace (directory) the pods read and write."""
    directory: str | None = None
    inputs: FingerprintInputs | None = None
    drain_seconds: int | None = None
    """Time budgeted to finish running requests before stopping."""
    flush_seconds: int | None = None
    """Time budgeted to flush the host tier to disk before stopping."""
    termination_grace_period_seconds: int | None = None
    measured_write_bytes_per_second: int | None = None
    """The disk tier's write rate as measured by the runtime (patch 0006's written bytes over its commits' wall
    time, all ranks) on the pods the last rollout replaced, the slowest of them; absent until measured. Below
    hicache.disk.writeBytesPerSecond it is what flushSeconds and the grace period are budgeted with."""
    previous_fingerprints: list[str] | None = None
    """Earlier cache namespaces still kept on the volumes, newest first."""


class RestartEntry(Record):
    """A pod being restarted: Canary -> Delete -> WaitingReady -> Verify."""

    pod: str
    step: Step
    uid: str | None = None
    """The uid of the incarnation being replaced (a delete never hits its successor)."""
    since: str | None = None
    same_cache: bool | None = None
    """Whether the successor reads the same cache namespace (else it cannot come back warm)."""
    canary_tokens: int | None = None
    canary_error: str | None = None
    disk_written_bytes: int | None = None
    """What the replaced pod's disk tier had written (all ranks) when its canary was sent."""
    disk_write_seconds: float | None = None
    """The wall time its commits took (first write to the end of the sync; the longest rank)."""
    deleted_at: str | None = None
    ready_at: str | None = None
    ready_uid: str | None = None
    """The successor's uid when it turned Ready (a second replacement restarts the wait)."""
    baseline_uid: str | None = None
    baseline_storage: int | None = None
    """The successor's `sglang:cached_tokens_total{storage}` before the canary, kept so a retried warm check
    still sees what the first one loaded from disk."""
    last_error: str | None = None
    """The last warm-check attempt's failure (retried until podTimeoutSeconds)."""


WARMTHS = ("Warm", "Partial", "Cold")
Warmth = Annotated[Literal["Warm", "Partial", "Cold"], _open_string(WARMTHS, "How warm the canary came back")]


OUTCOMES = ("ok", "failed", "timeout")
PreStopOutcome = Annotated[Literal["ok", "failed", "timeout"], _open_string(OUTCOMES, "How the preStop ended")]


class PreStop(ApiModel):
    """How the replaced pod's preStop ended, as it recorded it on the cache volume (podlifecycle)."""

    outcome: PreStopOutcome
    """ok: the final flush wrote the queued pages; failed or timeout: queued backups may be lost, so the pod can
    come back partly cold."""
    message: str | None = None
    seconds: float | None = None
    """How long the preStop took."""
    finished: str | None = None
    """When it ended."""


class RestartResult(Record):
    """One pod's warm-start check."""

    pod: str
    warm: bool
    """The replayed canary was served from the disk tier, all of it (see warmth)."""
    warmth: Warmth | None = None
    """Warm: every cacheable page of the canary came from disk; Partial: some of them; Cold: none."""
    canary_hit_share: float | None = None
    """Tokens restored from disk / the canary's cacheable tokens (all full pages but the last token)."""
    storage_tokens: int
    """Canary tokens served from disk (`cached_tokens_details.storage`)."""
    time_to_ready_seconds: int | None = None
    new_cache_namespace: bool | None = None
    """The pod moved to a new cache namespace: no warm start expected."""
    metric_storage_cached_tokens: int | None = None
    """The runtime's `sglang:cached_tokens_total{storage}` after the replay."""
    metric_prefetched_tokens: int | None = None
    """The runtime's `sglang:prefetched_tokens_total` after the replay."""
    metric_storage_baseline: int | None = None
    """The storage counter before the canary (the warm check compares against it)."""
    disk_write_bytes_per_second: int | None = None
    """The replaced pod's disk tier write rate over its life (diskWrittenBytes / its commits' wall time)."""
    disk_written_bytes: int | None = None
    """Bytes that rate is measured on (a small basis is all syncs: it counts only from MEASURE_MIN_BYTES)."""
    pre_stop: PreStop | None = None
    """The replaced pod's preStop (wait and final flush), when it left a record (disk tier only)."""


class Restart(Record):
    """The cache-aware rolling restart: its whole state (see rollout.py)."""

    id: str
    """The target (config hash / spec.restart) every pod should run."""
    phase: Phase
    pending: list[str] = Field(default_factory=list)
    """Pods still to restart, in order."""
    done: list[str] = Field(default_factory=list)
    in_flight: list[RestartEntry] = Field(default_factory=list)
    results: list[RestartResult] = Field(default_factory=list)
    started: str | None = None
    finished: str | None = None
    reason: str | None = None
    """Why the rollout paused (only while Paused)."""
    message: str | None = None
    """What a human must do to resume (only while Paused)."""
    partition: int | None = None
    """Multi-node servers: the LeaderWorkerSet partition the operator holds in this rollout (groups below it
    keep their revision); it only goes down within a rollout."""


class RouterWorker(ApiModel):
    """One serving pod as each router sees it."""

    pod: str
    routers: dict[str, str] | None = None
    """Router pod -> the worker's state there (ready, draining, absent, ...)."""


class Router(ApiModel):
    """The cache-aware router in front of the replicas."""

    endpoint: str | None = None
    policy: str | None = None
    prefix_tokens: int | None = None
    load_factor: float | None = None
    replicas: int | None = None
    image: str | None = None
    smg_version: str | None = None
    drained: list[str] | None = None
    """Pods the rollout has taken out of the router."""
    ready_routers: int | None = None
    workers: list[RouterWorker] | None = None


class ReplicaCache(ApiModel):
    """One replica's disk tier, as its cache-usage sidecar reports it."""

    pod: str
    disk_used_bytes: int | None = None
    disk_page_files: int | None = None
    disk_cap_bytes: int | None = None
    disk_used_ratio: float | None = None
    namespace_created: str | None = None
    """When the current cache namespace was created."""
    namespace_age: str | None = None
    """Coarse age of the namespace (hours or days)."""
    old_namespaces_bytes: int | None = None
    """Bytes held by earlier cache namespaces on the volume."""
    last_restored_tokens: int | None = None
    """Canary tokens restored from disk at the pod's last verified restart."""


class GroupNode(ApiModel):
    """One node (pod) of a multi-node replica: readiness and its own disk tier (its cache-usage sidecar)."""

    node: int
    """The node rank (LWS worker index; 0 is the leader)."""
    pod: str
    ready: bool = False
    disk_used_bytes: int | None = None
    disk_cap_bytes: int | None = None
    disk_used_ratio: float | None = None
    disk_page_files: int | None = None


class GroupRestart(ApiModel):
    """A group's last verified restart: the canary replayed at its leader (a disk hit is the MIN over all ranks,
    so it speaks for every node)."""

    warm: bool
    storage_tokens: int = 0


class GroupStatus(ApiModel):
    """One replica of a multi-node server (a LeaderWorkerSet group)."""

    group: int
    leader: str
    ready_nodes: int
    nodes: list[GroupNode]
    last_restart: GroupRestart | None = None


class QwenHiCacheServerStatus(ApiModel):
    """Observed state, written by the operator once per reconcile. It always describes what runs: a refused
    spec change leaves launch, sizing and cache as last applied and says so in the conditions."""

    observed_generation: int | None = None
    replicas: int | None = None
    """Desired serving pods."""
    ready_replicas: int | None = None
    replicas_summary: str | None = None
    """Ready/desired."""
    conditions: Annotated[list[Condition] | None, Field(json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})] = None
    """One per type (a list-type map keyed by `type`)."""
    launch: Launch | None = None
    sizing: Sizing | None = None
    cache: Cache | None = None
    restart: Restart | None = None
    admin_secret: str | None = None
    """The Secret holding the runtime's admin API key."""
    router: Router | None = None
    replica_cache: list[ReplicaCache] | None = None
    cache_summary: str | None = None
    """Fullest replica's disk vs cap, warm/restarted pods of the last rollout, namespace age."""
    groups: list[GroupStatus] | None = None
    """Multi-node servers (`nodesPerReplica > 1`): one entry per replica's LeaderWorkerSet group."""


def validate_status(status: Obj) -> QwenHiCacheServerStatus:
    """Parse a status as stored (camelCase); raises pydantic.ValidationError on an unknown key or bad type."""
    return QwenHiCacheServerStatus.model_validate(status)


def read_status(status: Obj | None) -> QwenHiCacheServerStatus:
    """The stored status, typed. A part that does not parse (written by another operator version) is left out
    and logged, never fatal: each reconcile rebuilds the status from the cluster anyway."""
    status = status or {}
    try:
        return QwenHiCacheServerStatus.model_validate(status)
    except ValidationError:
        pass
    parts = {}
    for key, value in status.items():
        try:
            QwenHiCacheServerStatus.model_validate({key: value})
            parts[key] = value
        except ValidationError as err:
            log.warning("ignoring status.%s that does not parse: %s", key, err)
    return QwenHiCacheServerStatus.model_validate(parts)


def restart_of(status: Obj | None) -> Restart | None:
    """Only `status.restart`, typed (the rollout daemon's filter reads nothing else)."""
    return read_status({"restart": (status or {}).get("restart")}).restart if (status or {}).get("restart") else None
