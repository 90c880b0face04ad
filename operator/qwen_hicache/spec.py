"""The QwenHiCacheServer API: the single source of truth for the CRD schema, defaults and validation.

Every rule here exists twice on purpose: as a pydantic check (so `render`/`size` refuse bad input with
no cluster) and as an OpenAPI constraint or CEL rule in the generated CRD (so the API server refuses it
before the operator ever sees it). `tests/test_spec.py` checks that both agree.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Any, Literal

from kubernetes.utils import parse_quantity
from pydantic import AfterValidator, Field, model_validator

from .constants import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION  # noqa: F401 - re-exported
from .geometry import Geometry
from .typed import ApiModel, cel

Obj = dict[str, Any]

PROFILES = ("qwen3.8-flash-next",)
PAGE_SIZES = [2**i for i in range(11)]
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_QUALIFIED = rf"({DNS_SUBDOMAIN[1:-1]}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?"
QUALIFIED_NAME = f"^{_QUALIFIED}$"
"""A label key or taint key (`prefix/name`, name at most 63 characters), as core/v1 validates it."""
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
_PATH_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]+)?"
IMAGE_REFERENCE = (
    rf"^({_DOMAIN}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""An image reference as container runtimes parse it (distribution's grammar); anything else never pulls."""
MAX_NAME_LENGTH = 52
"""The StatefulSet controller labels each pod with `controller-revision-hash: <name>-<hash of up to 10
characters>`, a label value of at most 63 characters, so longer names never get pods."""
NAME_RULE = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MESSAGE = (f"metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a "
                f"letter; it names the Services) of at most {MAX_NAME_LENGTH} characters (the StatefulSet's "
                "controller-revision-hash label adds up to 11)")

KvCacheDtype = Literal["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
SsmDtype = Literal["float32", "bfloat16", "float16"]
WritePolicy = Literal["write_through", "write_through_selective", "write_back"]
PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]
MemLayout = Literal["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]
IoBackend = Literal["kernel", "direct"]


_DRAFT_PAGE_MESSAGE = "pageSize must be at least speculative.numDraftTokens"


_PAGE_MESSAGE = f"pageSize must be a power of two between 1 and {PAGE_SIZES[-1]}"
_PAGE_RULE = {"x-kubernetes-validations": [cel(f"self in {PAGE_SIZES}", _PAGE_MESSAGE)]}


def _power_of_two(value: int) -> int:
    if value not in PAGE_SIZES:
        raise ValueError(_PAGE_MESSAGE)
    return value


def quantity_rule(field: str, low: str | None, high: str | None, inclusive_low: bool = True) -> Obj:
    """CEL (Kubernetes quantity library) bounds on a quantity string; `_in_range` enforces the same in Python."""
    rules = []
    if low is not None:
        op = ">=" if inclusive_low else ">"
        rules.append(cel(f"quantity(self).compareTo(quantity('{low}')) {op} 0",
                         f"{field} must be {'at least' if inclusive_low else 'more than'} {low}"))
    if high is not None:
        rules.append(cel(f"quantity(self).compareTo(quantity('{high}')) <= 0", f"{field} must be at most {high}"))
    return {"maxLength": 64, "x-kubernetes-validations": rules}


def _in_range(value: str | None, field: str, low: str | None, high: str | None, inclusive_low: bool = True) -> None:
    if value is None:
        return
    amount = parse_quantity(value)
    if low is not None and (amount < parse_quantity(low) if inclusive_low else amount <= parse_quantity(low)):
        raise ValueError(f"{field} must be {'at least' if inclusive_low else 'more than'} {low}")
    if high is not None and amount > parse_quantity(high):
        raise ValueError(f"{field} must be at most {high}")


class WeightsVolume(ApiModel):
    """Where the weights are: an existing PersistentVolumeClaim, mounted read-only."""

    claim_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_LABEL.replace("a-z0-9]", "a-z0-9.]"))]
    """Name of the PersistentVolumeClaim in the resource's namespace that holds the weights."""
    path: Annotated[str, Field(pattern=r"^[^/].*|^$", max_length=1024)] = ""
    """Directory inside the claim that holds `config.json` and the weights (relative, no leading slash)."""


class ModelSpec(ApiModel):
    """What is served. The revision and geometry identify the bytes of every cached page."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("has(self.profile) || has(self.geometry)", "model needs a built-in profile or explicit geometry"),
            ]
        }
    }

    weights: WeightsVolume
    """Weights volume (read-only)."""
    served_name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
    """Name clients use in requests (`--served-model-name`); part of every disk-cache file name."""
    revision: Annotated[str, Field(min_length=7, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]*$")]
    """Commit or digest of the weights. Required: the disk cache is only valid for these exact weights."""
    profile: Literal[PROFILES] | None = "qwen3.8-flash-next"  # type: ignore[valid-type]
    """Built-in model geometry (`qwen3.8-flash-next`). Explicit `geometry` fields override it."""
    geometry: Geometry | None = None
    """Explicit model geometry; each field set here overrides the profile."""


class SpeculativeSpec(ApiModel):
    """Speculative decoding (MTP draft). Its draft state is part of every cached page."""

    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = "NEXTN"
    """`--speculative-algorithm`."""
    num_steps: Annotated[int, Field(ge=1, le=16)] = 3
    """`--speculative-num-steps`."""
    num_draft_tokens: Annotated[int, Field(ge=1, le=64)] = 4
    """`--speculative-num-draft-tokens`."""
    eagle_topk: Annotated[int, Field(ge=1, le=16)] = 1
    """`--speculative-eagle-topk`."""


class EnvVar(ApiModel):
    """A literal environment variable for the runtime container."""

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    """Variable name."""
    value: str = ""
    """Variable value."""


_TOLERATION_RULES = [
    ("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
     "a toleration with operator Exists must not have a value"),
    ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
     "a toleration without a key must have operator Exists (it then tolerates every taint)"),
    ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
     "tolerationSeconds is only allowed with effect NoExecute"),
]


class Toleration(ApiModel):
    """A pod toleration, as in core/v1 (the API server's pod validation rules, checked up front)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [cel(r, m) for r, m in _TOLERATION_RULES]}
    }

    key: Annotated[str, Field(max_length=317, pattern=QUALIFIED_NAME)] | None = None
    """Taint key."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Exists` or `Equal`."""
    value: Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)] | None = None
    """Taint value for `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all."""
    toleration_seconds: Annotated[int, Field(ge=-(2**62), le=2**62)] | None = None
    """For `NoExecute`: how long the pod stays bound after the taint appears."""

    @model_validator(mode="after")
    def _core_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError(_TOLERATION_RULES[0][1])
        if not self.key and self.operator != "Exists":
            raise ValueError(_TOLERATION_RULES[1][1])
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(_TOLERATION_RULES[2][1])
        return self


_NODE_SELECTOR_KEY_MESSAGE = "runtime.nodeSelector keys must be label keys ([prefix/]name, name at most 63 characters)"
_NODE_MEMORY_RANGE = ("1Gi", "1Pi")
_NODE_MEMORY_RULE = quantity_rule("runtime.nodeMemory", *_NODE_MEMORY_RANGE)


class RuntimeSpec(ApiModel):
    """The SGLang runtime: image, parallelism, memory and decoding settings, placement."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!has(self.speculative) || self.pageSize >= self.speculative.numDraftTokens",
                    _DRAFT_PAGE_MESSAGE,
                ),
                cel(f"!has(self.nodeSelector) || self.nodeSelector.all(k, k.matches(r'{QUALIFIED_NAME}'))",
                    _NODE_SELECTOR_KEY_MESSAGE),
            ]
        }
    }

    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_REFERENCE)]
    """Patched runtime image (`Dockerfile.hicache`), by digest preferred (`repo@sha256:...`)."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Pull policy for the runtime image."""
    tensor_parallel_size: Annotated[int, Field(ge=1, le=16)] = 1
    """`--tp-size`; also the number of GPUs per pod."""
    context_length: Annotated[int, Field(ge=256, le=2**31 - 1)] | None = None
    """`--context-length`; the model's own maximum when unset."""
    max_running_requests: Annotated[int, Field(ge=1, le=4096)] | None = None
    """`--max-running-requests`."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """`--kv-cache-dtype`; `auto` uses the model dtype (bf16)."""
    mamba_ssm_dtype: SsmDtype | None = None
    """`--mamba-ssm-dtype` for the GDN/Mamba recurrent state; the runtime's default (float32) when unset."""
    max_mamba_cache_size: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    """`--max-mamba-cache-size`: device Mamba state slots."""
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = None
    """`--mem-fraction-static`."""
    page_size: Annotated[int, AfterValidator(_power_of_two), Field(json_schema_extra=_PAGE_RULE)] = 64
    """`--page-size` in tokens: a power of two; 64 is the file tier's unit (one file per page)."""
    speculative: SpeculativeSpec | None = None
    """Speculative decoding; off when unset."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 30000
    """HTTP port of the runtime."""
    dist_init_port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    """Port of the rendezvous at a group's leader (`--dist-init-addr <leader>:<port>`) when `nodesPerReplica > 1`;
    20000 when unset."""
    extra_args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256)] = []
    """Extra runtime flags, appended last. Flags the operator derives from the spec are refused here."""
    env: Annotated[list[EnvVar], Field(max_length=256)] = []
    """Extra environment variables for the runtime container."""
    gpu_resource_name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9.-]+/[A-Za-z0-9._-]+$")] = (
        "nvidia.com/gpu"
    )
    """Extended resource that provides GPUs; the pod asks for `tensorParallelSize` of it."""
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]],
        Field(max_length=64),
    ] = {}
    """Node labels the pods must match."""
    tolerations: Annotated[list[Toleration], Field(max_length=64)] = []
    """Tolerations for GPU node taints."""
    startup_timeout_seconds: Annotated[int, Field(ge=60, le=86400)] = 3600
    """How long model loading may take before the startup probe gives up."""
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    """`--dtype` of weights and activations (part of the cache fingerprint)."""
    quantization: Annotated[str, Field(pattern=r"^[a-z0-9_]+$")] | None = None
    """`--quantization` method, e.g. `fp8` (part of the cache fingerprint)."""
    max_request_seconds: Annotated[int, Field(ge=1, le=86400)] = 600
    """Longest request the server is expected to run; the drain before a stop waits at most this long."""
    gpu_memory_gb: Annotated[float, Field(gt=0, le=100_000, alias="gpuMemoryGB")] = 141.0
    """Memory of one GPU in GB, used to estimate the device pools when `hicache.deviceKVTokens` is unset."""
    node_memory: Annotated[str, Field(pattern=QUANTITY, json_schema_extra=_NODE_MEMORY_RULE)] | None = None
    """Allocatable memory of the target nodes (quantity); sizing refuses a pod that cannot fit."""

    @model_validator(mode="after")
    def _draft_fits_page(self) -> RuntimeSpec:
        if self.speculative and self.page_size < self.speculative.num_draft_tokens:
            raise ValueError(_DRAFT_PAGE_MESSAGE)
        bad = sorted(k for k in self.node_selector if not re.match(QUALIFIED_NAME, k) or len(k) > 317)
        if bad:
            raise ValueError(f"{_NODE_SELECTOR_KEY_MESSAGE}: {', '.join(map(repr, bad))}")
        _in_range(self.node_memory, "runtime.nodeMemory", *_NODE_MEMORY_RANGE)
        return self


_DISK_SIZE_MESSAGE = "disk tier is enabled but has no size: set hicache.disk.size (volume per replica) or capPerRank"


_SIZE_RANGE = ("1Mi", "1Pi")
_CAP_RANGE = ("1Mi", "1Pi")
_RATE_RANGE = ("1Mi", "1Ti")
"""A slower assumed disk would stretch the termination grace period beyond reason (0 B/s: ~1,900 years)."""
_SIZE_RULE = quantity_rule("hicache.disk.size", *_SIZE_RANGE)
_CAP_RULE = quantity_rule("hicache.disk.capPerRank", *_CAP_RANGE)
_RATE_RULE = quantity_rule("hicache.disk.writeBytesPerSecond", *_RATE_RANGE)


class DiskTierSpec(ApiModel):
    """The file tier (`--hicache-storage-backend file`) on a per-replica persistent volume."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!self.enabled || has(self.size) || has(self.capPerRank)",
                    _DISK_SIZE_MESSAGE,
                ),
            ]
        }
    }

    enabled: bool = False
    """Keep pages in files on a persistent volume per replica, so restarts warm-start."""
    size: Annotated[str, Field(pattern=QUANTITY, json_schema_extra=_SIZE_RULE)] | None = None
    """Volume size per replica (a Kubernetes quantity, e.g. `600Gi`), shared by all TP ranks."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """StorageClass of the cache volumes; the cluster default when unset."""
    cap_per_rank: Annotated[str, Field(pattern=QUANTITY, json_schema_extra=_CAP_RULE)] | None = None
    """File-tier payload cap per TP rank; derived from `size` when unset, and `size` from it when only it is set."""
    retention: Literal["Retain", "Delete"] = "Retain"
    """What happens to the cache volumes when the resource is deleted or scaled down."""
    keep_old_namespaces: Annotated[int, Field(ge=0, le=16)] = 1
    """Old cache namespaces (directories of earlier fingerprints) kept on each volume; older ones are removed
    at pod start, when no process can read them."""
    write_bytes_per_second: Annotated[str, Field(pattern=QUANTITY, json_schema_extra=_RATE_RULE)] = "500Mi"
    """Assumed sustained disk write rate per pod; sizes the flush time in the termination grace period."""

    @model_validator(mode="after")
    def _size_when_enabled(self) -> DiskTierSpec:
        if self.enabled and self.size is None and self.cap_per_rank is None:
            raise ValueError(_DISK_SIZE_MESSAGE)
        _in_range(self.size, "hicache.disk.size", *_SIZE_RANGE)
        _in_range(self.cap_per_rank, "hicache.disk.capPerRank", *_CAP_RANGE)
        _in_range(self.write_bytes_per_second, "hicache.disk.writeBytesPerSecond", *_RATE_RANGE)
        return self


_LAYOUT_IO_RULE = "(self.memLayout == 'page_first_direct') == (self.ioBackend == 'direct')"
_LAYOUT_IO_MESSAGE = "memLayout page_first_direct goes with ioBackend direct, and page_first with kernel"
_HYBRID_LAYOUT_MESSAGE = "the hybrid (Mamba) host pool accepts only memLayout page_first or page_first_direct"


class HiCacheSpec(ApiModel):
    """The hierarchical cache: GPU -> host RAM -> files."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.memLayout in ['page_first', 'page_first_direct']", _HYBRID_LAYOUT_MESSAGE),
                cel(_LAYOUT_IO_RULE, _LAYOUT_IO_MESSAGE),
                cel(
                    "!(has(self.hostMemoryPerRankGB) && has(self.hostRatio))",
                    "set hostMemoryPerRankGB or hostRatio, not both",
                ),
            ]
        }
    }

    host_memory_per_rank_gb: Annotated[float | None, Field(gt=0, le=100_000, alias="hostMemoryPerRankGB")] = None
    """`--hicache-size`: host RAM per TP rank in GB (1e9 bytes) for the KV, index and Mamba host pools."""
    host_ratio: Annotated[float, Field(gt=1, le=1000)] | None = None
    """`--hicache-ratio`: host pools as a multiple of the device pools (used when no size is set)."""
    write_policy: WritePolicy = "write_through"
    """`--hicache-write-policy`. `write_back` never writes un-evicted prefixes to disk (no warm restart)."""
    prefetch_policy: PrefetchPolicy = "timeout"
    """`--hicache-storage-prefetch-policy`; `wait_complete` when a restore must be proven."""
    mem_layout: MemLayout = "page_first"
    """`--hicache-mem-layout`; hybrid models need `page_first` or `page_first_direct`."""
    io_backend: IoBackend = "kernel"
    """`--hicache-io-backend`: `kernel` with page_first, `direct` with page_first_direct."""
    host_mamba_slots_per_rank: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """`--hicache-mamba-host-slots` (runtime series patch 0002): host Mamba states per rank, sized on their own so
    restorable coverage is explicit; `hostMemoryPerRankGB` then covers the KV-side pools alone."""
    device_kv_tokens: Annotated[int | None, Field(ge=1, le=10**10, alias="deviceKVTokens")] = None
    """Device KV pool per rank in tokens (whole pages), rendered as `--max-total-tokens`: the runtime builds this
    pool (a GPU without room for it builds less and logs a warning) and the host pools are sized against it. Unset,
    the runtime sizes the pool from free GPU memory and the operator's host sizing is an estimate."""
    disk: DiskTierSpec = DiskTierSpec()
    """The disk tier; off unless enabled with a size."""

    @model_validator(mode="after")
    def _consistent(self) -> HiCacheSpec:
        if self.mem_layout not in ("page_first", "page_first_direct"):
            raise ValueError(_HYBRID_LAYOUT_MESSAGE)
        if (self.mem_layout == "page_first_direct") != (self.io_backend == "direct"):
            raise ValueError(_LAYOUT_IO_MESSAGE)
        if self.host_memory_per_rank_gb is not None and self.host_ratio is not None:
            raise ValueError("set hostMemoryPerRankGB or hostRatio, not both")
        return self


class RolloutSpec(ApiModel):
    """Cache-aware rolling restarts: one pod at a time, each verified warm before the next."""

    max_unavailable: Annotated[int, Field(ge=1, le=64)] = 1
    """Pods restarted at the same time (never all replicas when there are several)."""
    pod_timeout_seconds: Annotated[int, Field(ge=30, le=86400)] = 3600
    """How long a restarted pod may take to become ready and warm before the rollout pauses."""
    require_warm_start: bool = True
    """Pause the rollout when a restarted pod serves the canary without a disk-cache hit (not without a disk
    tier: nothing could come back warm)."""


RouterPolicy = Literal["prefix_hash", "cache_aware", "consistent_hashing", "power_of_two", "round_robin", "random"]


class RouterSpec(ApiModel):
    """A cache-affine router (Shepherd Model Gateway, `smg`) in front of the replicas.

    Workers are the StatefulSet pods' stable DNS names (`<pod>.<server>-headless.<ns>.svc.cluster.local`),
    listed in a file the operator owns, so a restarted pod (new IP) is the same worker and the default
    `prefix_hash` policy sends a prefix where its pages are, also after a router restart (the hash ring is
    built from the names alone). Rolling restarts take a pod out of that list before deleting it and put it
    back after its warm-start check."""

    enabled: bool | None = None
    """Run the router; on by default when `replicas > 1`. The client Service then points at the router."""
    image: Annotated[str, Field(min_length=1, max_length=512)] = "qwen-hicache-router:smg-1.13.0"
    """Router image (`images/router`: `smg` from PyPI), by digest preferred."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Pull policy for the router image."""
    replicas: Annotated[int, Field(ge=1, le=16)] = 1
    """Router pods. `prefix_hash` routes identically in every router pod (no shared state needed)."""
    policy: RouterPolicy = "prefix_hash"
    """`--policy`. `prefix_hash` is deterministic (survives router restarts); `cache_aware` keeps its prefix
    trees in router memory, lost when the router restarts."""
    prefix_tokens: Annotated[int, Field(ge=1, le=65536)] = 256
    """`--prefix-token-count` for `prefix_hash` (untokenized text: four characters per token). Set it to about
    the length of the shared system prompt plus a few tokens, so each conversation hashes on its own opening
    and every later turn of it hashes the same."""
    load_factor: Annotated[float, Field(ge=1.0, le=100.0)] = 1.25
    """`--prefix-hash-load-factor`: a replica above this multiple of the mean in-flight load (and above it by
    `balanceAbsThreshold` requests) gets no new prefixes, so one hot prefix cannot overload one replica."""
    balance_abs_threshold: Annotated[int, Field(ge=0, le=100000)] = 4
    """`--prefix-hash-balance-abs-threshold` (and `--balance-abs-threshold` for cache_aware)."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    """HTTP port of the router container (the client Service keeps `runtime.port`)."""
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 29000
    """`--prometheus-port`."""
    cpu: Annotated[str, Field(pattern=QUANTITY)] = "1"
    """CPU request of a router pod (the limit is twice this)."""
    memory: Annotated[str, Field(pattern=QUANTITY)] = "1Gi"
    """Memory request and limit of a router pod."""

    def active(self, replicas: int) -> bool:
        """Whether the router runs for this many serving replicas."""
        return self.enabled if self.enabled is not None else replicas > 1


_NODES_MESSAGE = ("runtime.tensorParallelSize must be divisible by nodesPerReplica: each node of a replica runs "
                  "tensorParallelSize / nodesPerReplica TP ranks, one per GPU")
_NODES_CHANGE_MESSAGE = ("nodesPerReplica cannot change on an existing server: its pods, cache volumes and cache "
                         "layout are built per node; delete the server (its cache volumes are kept) and create it "
                         "again with the new value")
_DIST_PORT_MESSAGE = "runtime.distInitPort must differ from runtime.port"
_NODES = "(has(self.nodesPerReplica) ? self.nodesPerReplica : 1)"


class QwenHiCacheServerSpec(ApiModel):
    """Desired state of one SGLang HiCache serving deployment."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(f"self.runtime.tensorParallelSize % {_NODES} == 0", _NODES_MESSAGE),
                cel(f"{_NODES} == {_NODES.replace('self', 'oldSelf')}", _NODES_CHANGE_MESSAGE),
                cel("!has(self.runtime.distInitPort) || self.runtime.distInitPort != self.runtime.port",
                    _DIST_PORT_MESSAGE),
            ]
        }
    }

    model: ModelSpec
    """The model and its weights."""
    runtime: RuntimeSpec
    """The SGLang runtime."""
    hicache: HiCacheSpec = HiCacheSpec()
    """The hierarchical KV cache."""
    replicas: Annotated[int, Field(ge=0, le=64)] = 1
    """Number of serving pods; each has `tensorParallelSize` GPUs and its own disk-cache volume."""
    restart: Annotated[str, Field(max_length=128)] | None = None
    """Set to a new value (an id or a timestamp) to request a cache-aware rolling restart."""
    rollout: RolloutSpec = RolloutSpec()
    """How restarts roll through the replicas."""
    router: RouterSpec = RouterSpec()
    """The cache-affine router in front of the replicas (on by default when `replicas > 1`)."""
    nodes_per_replica: Annotated[int, Field(ge=1, le=16)] | None = None
    """Nodes (pods) per replica; 1 when unset. Above 1 each replica is a LeaderWorkerSet group of this many pods,
    `tensorParallelSize / nodesPerReplica` GPUs and TP ranks each, every pod with its own cache volume; only the
    leader (node 0) serves requests. Needs the LeaderWorkerSet controller (v0.8 or later). Fixed at creation."""

    @cached_property
    def nodes(self) -> int:
        """Nodes per replica (`nodesPerReplica`, default 1); computed once, by the validation below."""
        return self.nodes_per_replica or 1

    @cached_property
    def router_on(self) -> bool:
        """Whether the router runs for this server (`router.active`); computed once, by the validation below."""
        return self.router.active(self.replicas)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> QwenHiCacheServerSpec:
        """A copy whose once-computed values (`nodes`, `router_on`) follow the copy's own fields."""
        copied = super().model_copy(update=update, deep=deep)
        for once in ("nodes", "router_on"):
            copied.__dict__.pop(once, None)
        return copied

    @model_validator(mode="after")
    def _nodes_split_tp(self) -> QwenHiCacheServerSpec:
        _ = self.router_on  # the readers of a parsed spec find both values ready
        if self.runtime.tensor_parallel_size % self.nodes:
            raise ValueError(f"{_NODES_MESSAGE} (tensorParallelSize {self.runtime.tensor_parallel_size}, "
                             f"nodesPerReplica {self.nodes})")
        if self.runtime.dist_init_port is not None and self.runtime.dist_init_port == self.runtime.port:
            raise ValueError(_DIST_PORT_MESSAGE)
        return self


NAME_RULES = [
    cel(f"self.metadata.name.size() <= {MAX_NAME_LENGTH}", NAME_MESSAGE),
    cel(f"self.metadata.name.matches(r'{NAME_RULE}')", NAME_MESSAGE),
]
"""Root-level CEL rules on the resource's own name (the only metadata a CRD schema may check)."""


def name_problem(name: str) -> str | None:
    """`NAME_MESSAGE` when `name` breaks NAME_RULES (same rules, checked in Python for `render`)."""
    ok = len(name) <= MAX_NAME_LENGTH and re.match(NAME_RULE, name)
    return None if ok else f"{NAME_MESSAGE}; got {name!r} ({len(name)} characters)"

