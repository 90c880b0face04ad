"""Host RAM, pod memory, /dev/shm and disk-tier sizing from the model's geometry. Pure: no I/O, no cluster.

Every rule restates sglang 0.5.23 (+ runtime_patches/) and names the file:line it follows (paths inside the
`sglang` package); `tests/conformance/` executes those very constructors on CPU over a matrix of models, TP
sizes, host sizes, dtypes and speculative settings and requires the numbers here to agree exactly. Per rank:
- host KV bytes/token = (K + V head dims) x KV heads on the rank x (full-attention + 1 MTP draft layer)
  x KV dtype bytes (`mem_cache/pool_host/mha.py:290-296`);
- QSA index bytes/token = index heads x index dim x 2 (bf16) x (same layers) / compress ratio
  (`mem_cache/pool_host/qsa.py:26-64`);
- Mamba bytes/slot = (conv + SSM) x GDN layers + PLE side states (`mem_cache/pool_host/mamba.py:120-165,413`);
- `--hicache-size H` splits H GB between KV and Mamba in proportion to the device pools' bytes (target KV
  buffers vs the whole Mamba state incl. speculative verify scratch), scales the KV share by
  kv / (kv + compressed keys of target and draft), then `tokens = int(share * 1e9 // bytes_per_token)`
  rounded to pages plus one pad page; Mamba slots are `int(share * 1e9 // bytes_per_slot) + 1`
  (`mem_cache/hybrid_cache/hybrid_pool_assembler.py:239-264,1329-1340`, `mem_cache/pool_host/base.py:219-229`,
  `mem_cache/pool_host/mamba.py:167-177`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from . import status_model, units
from .disk_files import DiskFiles, disk_files
from .geometry import Geometry, GeometryError, profile_fields_merged, resolve_geometry
from .spec import QwenHiCacheServerSpec

GIB = 1 << 30
GB = 10**9

RUNTIME_RESERVE_BYTES = 10 * GIB
"""`HICACHE_HOST_MEMORY_RESERVE_BYTES` (pool_host/base.py): host RAM the runtime keeps out of its pools."""
DEFAULT_HICACHE_RATIO = 2.0
"""The runtime's `--hicache-ratio` default in cache mode."""
PROCESS_BYTES_PER_RANK = 6 * GIB
"""One TP worker process: CUDA context, torch/NCCL host buffers, Python heap, radix tree."""
PROCESS_BYTES_PER_POD = 4 * GIB
"""Tokenizer manager, detokenizer, HTTP server and multimodal processor, once per pod."""
STAGING_BYTES_PER_RANK = 2 * GIB
"""Weight-loading read buffers and HiCache write-back/IO staging per rank."""
MARGIN_FRACTION = Fraction(1, 10)
"""Page cache and allocator fragmentation on top of every counted term."""
SHM_BASE_BYTES = 4 * GIB
SHM_BYTES_PER_RANK = 2 * GIB
"""/dev/shm: NCCL intra-node buffers and torch multiprocessing tensors between workers and the tokenizer."""
DISK_HEADROOM_FRACTION = Fraction(1, 10)
"""Volume share kept free: filesystem metadata and reserved blocks, stale `.tmp` files the file backend never
cleans, and the LRU evictor's overshoot between scans."""
DEFAULT_REQUESTS = 128
"""`--max-running-requests` the operator renders when the spec leaves it unset (the runtime's own estimate needs
the profiled token capacity and the context length, `mem_cache/kv_cache_configurator.py:3123-3132`)."""
DEFAULT_MEM_FRACTION = 0.88
MAMBA_SLOTS_PER_REQUEST = 3
"""`MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` (`mem_cache/kv_cache_configurator.py:227`)."""
MAMBA_TRACKING_SLOTS = 2
"""Extra slots per request of the `extra_buffer` strategy with the overlap scheduler
(`mem_cache/allocation_sizing.py:11-19`, `mem_cache/kv_cache_configurator.py:3062-3088`); `auto` resolves to
`extra_buffer` for every supported model on CUDA (`arg_groups/mamba_hook.py`)."""
DRAFT_LAYERS = 1
"""MTP draft layers the runtime loads with speculative decoding, whatever `config.json` declares: NEXTN/EAGLE
on qwen3_next, qwen3_5 and qwen4_exp rewrite the draft to one MTP layer (`configs/model_config.py:1133-1181`)."""
FORCED_PAGE_SIZE_QSA = 64
"""qwen4_exp with a compressed QSA indexer: `_qwen4_exp_overrides` sets `page_size=64` whatever is passed
(`arg_groups/model_overrides/qwen4_exp.py:86-97`)."""

KV_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CONV_DTYPE_BYTES = 2
INDEX_DTYPE_BYTES = 2
PLE_STATE_DTYPE_BYTES = 2
NGRAM_ID_BYTES = 8
PLE_TABLE_BYTES_PER_ELEMENT = {
    "bfloat16": Fraction(2),
    "float8_e4m3fn": Fraction(1),
}


class SizingError(ValueError):
    """Input that cannot be sized at all; the message names the field and the fix."""


# --- per-rank shapes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankShapes:
    """Bytes per token and per state slot on one TP rank, as the runtime's pools lay them out."""

    kv_bytes_per_token_target: int
    """Device KV of the target's full-attention layers only (what `_split_hicache_size` weighs)."""
    kv_bytes_per_token: int
    """Host KV: target + the packed MTP draft layer."""
    draft_layers: int
    """MTP draft layers packed into the host KV and index pools (1 with speculative decoding, else 0)."""
    index_bytes_per_row: int
    """One compressed QSA key of one layer: index heads x index dim x bf16 (0 without QSA)."""
    index_bytes_per_page: int
    """QSA compressed keys of one page, all indexer layers (0 without QSA)."""
    conv_bytes_per_layer: int
    ssm_bytes_per_layer: int
    ple_bytes_per_slot: int
    mamba_bytes_per_slot: int
    """Host Mamba slot: (conv + SSM) x (GDN + packed draft GDN layers) + PLE side states."""


def _kv_heads_on_rank(g: Geometry, tp: int) -> int:
    """`ModelConfig.get_num_kv_heads`: heads split across ranks, at least one each."""
    return max(1, g.num_key_value_heads // tp)


def _gdn_per_layer(g: Geometry, tp: int, ssm_bytes: int) -> tuple[int, int]:
    """(conv, SSM) bytes per GDN layer per slot, from `Mamba2StateShape.create` with the group extension."""
    groups = g.linear_num_key_heads
    if groups % tp:
        groups = tp  # extra_groups_for_head_shards (n_groups < tp): replicate groups to follow head shards
    if g.linear_num_value_heads % tp:
        raise SizingError(
            f"linearNumValueHeads {g.linear_num_value_heads} is not divisible by tensorParallelSize {tp}: "
            "the runtime cannot shard the GDN heads; pick a TP size that divides it"
        )
    conv_dim = g.linear_value_head_dim * g.linear_num_value_heads + 2 * groups * g.linear_key_head_dim
    if conv_dim % tp:
        raise SizingError(f"GDN conv dim {conv_dim} is not divisible by tensorParallelSize {tp}")
    conv = conv_dim // tp * (g.linear_conv_kernel_dim - 1) * CONV_DTYPE_BYTES
    ssm = g.linear_num_value_heads // tp * g.linear_value_head_dim * g.linear_key_head_dim * ssm_bytes
    return conv, ssm


def _ple_bytes(g: Geometry) -> int:
    """PLE short-conv window rows (channels x (kernel-1) x ngram, bf16) + n-gram context (int64), per slot
    (`mem_cache/ple_state_pool.py`, registered as Mamba slot siblings)."""
    if not g.ple_short_conv_layers:
        return 0
    window = g.ple_channels * (g.ple_conv_kernel_size - 1) * g.ngram_size * PLE_STATE_DTYPE_BYTES
    return g.ple_short_conv_layers * window + max(g.ngram_size - 1, 0) * NGRAM_ID_BYTES


def check_page_size(g: Geometry, page_size: int) -> None:
    """A page size the runtime would replace or refuse is an error, not a silent mismatch."""
    if not g.qsa_compress_ratio:
        return
    if page_size != FORCED_PAGE_SIZE_QSA:
        raise SizingError(
            f"pageSize {page_size} is not what the runtime uses: for a model with a compressed QSA indexer "
            f"(qwen4_exp) sglang 0.5.23 forces --page-size {FORCED_PAGE_SIZE_QSA} "
            "(arg_groups/model_overrides/qwen4_exp.py:86-97), so the cache would be sized for pages that "
            f"never exist; set runtime.pageSize: {FORCED_PAGE_SIZE_QSA}"
        )


def rank_shapes(g: Geometry, tp: int, kv_dtype: str, ssm_dtype: str, mtp: bool, page_size: int) -> RankShapes:
    """Per-rank byte shapes for one geometry and runtime configuration."""
    check_page_size(g, page_size)
    kv_per_layer = (
        (g.head_dim + (g.v_head_dim or g.head_dim)) * _kv_heads_on_rank(g, tp) * KV_DTYPE_BYTES[kv_dtype]
    )
    draft_layers = DRAFT_LAYERS if mtp else 0
    kv_layers = g.full_attention_layers + draft_layers
    index_row = g.qsa_index_kv_heads * g.qsa_index_head_dim * INDEX_DTYPE_BYTES if g.qsa_compress_ratio else 0
    index_page = kv_layers * index_row * (page_size // g.qsa_compress_ratio) if index_row else 0
    conv, ssm = _gdn_per_layer(g, tp, SSM_DTYPE_BYTES[ssm_dtype]) if g.linear_attention_layers else (0, 0)
    gdn_layers = g.linear_attention_layers + (g.mtp_linear_layers if mtp else 0)
    ple = _ple_bytes(g) if g.linear_attention_layers else 0
    return RankShapes(
        kv_bytes_per_token_target=kv_per_layer * g.full_attention_layers,
        kv_bytes_per_token=kv_per_layer * kv_layers,
        draft_layers=draft_layers,
        index_bytes_per_row=index_row,
        index_bytes_per_page=index_page,
        conv_bytes_per_layer=conv,
        ssm_bytes_per_layer=ssm,
        ple_bytes_per_slot=ple,
        mamba_bytes_per_slot=(conv + ssm) * gdn_layers + ple,
    )


# --- device pools ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePools:
    """The GPU pools of one rank, which `--hicache-ratio` multiplies and `--hicache-size` is split by."""

    kv_tokens: int
    kv_tokens_estimated: bool
    mamba_slots: int
    mamba_slots_assumed: bool
    requests: int
    """`--max-running-requests` as rendered."""
    running_requests: int
    """What the runtime keeps: min(rendered, tokens // 2, slots // slots-per-request)
    (`mem_cache/kv_cache_configurator.py:3119-3150`); also the speculative state count."""
    spec_states: int
    """Mamba verify-scratch states (`mamba_spec_state_size = max_num_reqs`, kv_cache_configurator.py:1721); 0
    without speculative decoding."""
    kv_bytes: int
    """Target full-attention KV buffers (size + one pad page), as `get_kv_size_bytes` reports them."""
    index_bytes: int
    """Compressed QSA keys of target and draft pools (`qsa_kv_pool.py:173,203-212`)."""
    mamba_bytes: int
    """Mamba state (slots + 1 pad) plus speculative verify scratch, as `MambaPool.State.mem_usage_bytes()`."""


def _mamba_device_bytes(shapes: RankShapes, g: Geometry, slots: int, spec_states: int, draft_tokens: int) -> int:
    """`MambaPool.mamba_cache.mem_usage_bytes()` (`mem_cache/memory_pool.py:555-561`): conv and SSM state of
    slots+1 (`memory_pool.py:722-753`), plus, with speculative decoding, per draft token and state an SSM
    snapshot and a conv window of (spec_states+1) rows (`memory_pool.py:864-960`; the SSM snapshot is skipped
    only under `--enable-linear-replayssm-spec`, which the operator never renders and refuses in extraArgs)."""
    per_layer = shapes.conv_bytes_per_layer + shapes.ssm_bytes_per_layer
    state = (slots + 1) * per_layer * g.linear_attention_layers
    if not draft_tokens:
        return state
    return state + (spec_states + 1) * draft_tokens * per_layer * g.linear_attention_layers


def _estimate_kv_tokens(spec: QwenHiCacheServerSpec, g: Geometry, shapes: RankShapes, mamba_bytes: int) -> int:
    """Device KV tokens from GPU memory x memFractionStatic - weights - Mamba (no runtime log given). An
    estimate: the runtime profiles free GPU memory, which cannot be run here."""
    if g.gpu_weight_bytes is None:
        raise SizingError(
            "cannot estimate the device KV pool: set hicache.deviceKVTokens (the runtime logs '#tokens' at "
            "startup) or model.geometry.gpuWeightBytes"
        )
    rt = spec.runtime
    fraction = rt.mem_fraction_static or DEFAULT_MEM_FRACTION
    budget = rt.gpu_memory_gb * GB * fraction - g.gpu_weight_bytes / rt.tensor_parallel_size - mamba_bytes
    index_per_token = Fraction(shapes.index_bytes_per_page, rt.page_size)
    per_token = shapes.kv_bytes_per_token + index_per_token
    tokens = int(Fraction(max(int(budget), 0)) / per_token) // rt.page_size * rt.page_size
    if tokens <= 0:
        raise SizingError(
            f"the GPU has no room for a KV pool: {rt.gpu_memory_gb} GB x {fraction} leaves "
            f"{budget / GB:.1f} GB after weights and Mamba state; raise memFractionStatic or use more GPUs"
        )
    return tokens


def mamba_slots_per_request() -> int:
    """Device Mamba slots one running request needs with the flags the operator renders (radix cache on,
    overlap scheduler on, `mamba_radix_cache_strategy` auto = extra_buffer)."""
    return MAMBA_SLOTS_PER_REQUEST + MAMBA_TRACKING_SLOTS


def device_mamba_slots(spec: QwenHiCacheServerSpec) -> int:
    """`--max-mamba-cache-size` the operator renders: the spec's, else enough for every requested request."""
    rt = spec.runtime
    return rt.max_mamba_cache_size or (rt.max_running_requests or DEFAULT_REQUESTS) * mamba_slots_per_request()


def device_kv_cap(spec: QwenHiCacheServerSpec) -> int | None:
    """`hicache.deviceKVTokens` rounded down to whole pages, as the runtime aligns `--max-total-tokens`
    (`kv_cache_configurator.py`: the user cap, then page alignment): the device pool the operator renders and
    sizes against, so the runtime splits `--hicache-size` over the same pool (tests/conformance/
    test_gpu_run_sizing.py: with the pool it profiled itself instead, 13 host Mamba slots where 1,878 were sized)."""
    tokens = spec.hicache.device_kv_tokens
    return None if tokens is None else max(tokens // spec.runtime.page_size, 1) * spec.runtime.page_size


def device_pools(spec: QwenHiCacheServerSpec, g: Geometry, shapes: RankShapes) -> DevicePools:
    """Device pools per rank: explicit where the spec says so, otherwise estimated and flagged."""
    rt = spec.runtime
    requests = rt.max_running_requests or DEFAULT_REQUESTS
    slots = device_mamba_slots(spec)
    draft_tokens = rt.speculative.num_draft_tokens if rt.speculative else 0

    def running(tokens: int) -> int:
        capped = min(requests, tokens // 2)
        return min(capped, slots // mamba_slots_per_request()) if g.linear_attention_layers else capped

    def mamba_bytes(tokens: int) -> int:
        states = running(tokens) if draft_tokens else 0
        return _mamba_device_bytes(shapes, g, slots, states, draft_tokens) if g.linear_attention_layers else 0

    tokens = device_kv_cap(spec)
    if tokens is None:  # the estimate needs the Mamba bytes, which depend on the tokens only through a cap
        tokens = _estimate_kv_tokens(spec, g, shapes, mamba_bytes(1 << 40))
    spec_states = running(tokens) if draft_tokens else 0
    padded = tokens + rt.page_size
    index_rows = -(-padded // g.qsa_compress_ratio) if g.qsa_compress_ratio else 0
    return DevicePools(
        kv_tokens=tokens,
        kv_tokens_estimated=spec.hicache.device_kv_tokens is None,
        mamba_slots=slots if g.linear_attention_layers else 0,
        mamba_slots_assumed=rt.max_mamba_cache_size is None,
        requests=requests,
        running_requests=running(tokens),
        spec_states=spec_states,
        kv_bytes=padded * shapes.kv_bytes_per_token_target,
        index_bytes=index_rows * shapes.index_bytes_per_row * (g.full_attention_layers + shapes.draft_layers),
        mamba_bytes=mamba_bytes(tokens),
    )


# --- host pools -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostPools:
    """Host pools of one rank, rounded the way the runtime rounds them."""

    hicache_size_gb: int | None
    hicache_ratio: float | None
    kv_tokens: int
    mamba_slots: int
    kv_bytes: int
    index_bytes: int
    mamba_bytes: int
    total_bytes: int = field(init=False)
    """KV + QSA index + Mamba: the pinned host memory of one rank."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_bytes", self.kv_bytes + self.index_bytes + self.mamba_bytes)

    def pool_bytes(self) -> tuple[int, ...]:
        """Pools in the order a rank builds them: KV, Mamba, QSA indexer (`hybrid_pool_assembler.py:1341-1398`)."""
        return tuple(b for b in (self.kv_bytes, self.mamba_bytes, self.index_bytes) if b)


def _pages_plus_pad(tokens: int, page_size: int) -> int:
    """`HostKVCache.__init__` (`pool_host/base.py:226-229`): whole pages plus one padding page."""
    return (tokens // page_size + 1) * page_size


def _size_split(size_gb: int, dev: DevicePools, explicit_slots: bool) -> tuple[float, float]:
    """(KV GB, Mamba GB) of `--hicache-size`, in the runtime's own float order: `_split_hicache_size` weighs
    the target KV buffers against the Mamba state (`hybrid_pool_assembler.py:239-254`); with
    `--hicache-mamba-host-slots` (series patch 0002) the KV side takes all (`hybrid_pool_assembler.py:257-263`);
    for QSA the KV share is scaled by kv / (kv + compressed keys of target and draft) (`:1329-1340`)."""
    if explicit_slots or not dev.mamba_bytes:
        kv_share, mamba_share = size_gb * dev.kv_bytes / dev.kv_bytes, 0.0
    else:
        total = dev.kv_bytes + dev.mamba_bytes
        kv_share, mamba_share = size_gb * dev.kv_bytes / total, size_gb * dev.mamba_bytes / total
    if dev.index_bytes:
        kv_share *= dev.kv_bytes / (dev.kv_bytes + dev.index_bytes)
    return kv_share, mamba_share


def _host_size_gb(spec: QwenHiCacheServerSpec) -> int | None:
    """`--hicache-size` is an int of GB: a fractional request is floored, zero with no ratio is refused."""
    hc = spec.hicache
    if hc.host_memory_per_rank_gb is None:
        return None
    gb = math.floor(hc.host_memory_per_rank_gb)
    if gb <= 0 and hc.host_ratio is None:
        raise SizingError(
            f"hicache.hostMemoryPerRankGB {hc.host_memory_per_rank_gb} gives a host size of 0 GB "
            "(--hicache-size takes whole GB) and no hostRatio is set: "
            "set hostMemoryPerRankGB >= 1 or hostRatio"
        )
    return gb or None


def host_pools(spec: QwenHiCacheServerSpec, dev: DevicePools, shapes: RankShapes) -> HostPools:
    """Host pools per rank from `--hicache-size` or from a ratio of the device pools."""
    page = spec.runtime.page_size
    size_gb = _host_size_gb(spec)
    ratio = None
    explicit = spec.hicache.host_mamba_slots_per_rank
    if size_gb is not None:
        kv_share, mamba_share = _size_split(size_gb, dev, bool(explicit))
        tokens = _pages_plus_pad(int(kv_share * 1e9 // shapes.kv_bytes_per_token), page)
        # MambaPoolHost: size from its share, then page_num = size // 1 + 1 (pool_host/mamba.py:167-177)
        slots = int(mamba_share * 1e9 // shapes.mamba_bytes_per_slot) + 1 if dev.mamba_bytes else 0
    else:
        ratio = spec.hicache.host_ratio or DEFAULT_HICACHE_RATIO
        tokens = _pages_plus_pad(int(dev.kv_tokens * ratio), page)
        slots = int(dev.mamba_slots * ratio) + 1 if dev.mamba_bytes else 0
    if explicit and dev.mamba_bytes:
        slots = explicit + 1  # the patched pool allocates exactly N slots plus its pad slot
    return HostPools(
        hicache_size_gb=size_gb,
        hicache_ratio=ratio,
        kv_tokens=tokens,
        mamba_slots=slots,
        kv_bytes=tokens * shapes.kv_bytes_per_token,
        index_bytes=tokens // page * shapes.index_bytes_per_page,
        mamba_bytes=slots * shapes.mamba_bytes_per_slot,
    )


# --- pod memory, shm, disk ------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One explained addend of the pod memory limit."""

    name: str
    bytes: int
    why: str


def shm_bytes(tp: int) -> int:
    """/dev/shm size: a base for the tokenizer/multimodal path plus NCCL and IPC room per rank."""
    return SHM_BASE_BYTES + SHM_BYTES_PER_RANK * tp


def ple_table_bytes(g: Geometry) -> int:
    """Pinned PLE n-gram table, all ranks' shards together (0 unless the table is offloaded to pinned RAM)."""
    if not (g.ple_table_pinned and g.ple_table_rows and g.ple_table_dtype):
        return 0
    return math.ceil(g.ple_table_rows * g.ple_table_row_dim * PLE_TABLE_BYTES_PER_ELEMENT[g.ple_table_dtype])


def rank_budget_bytes(tp: int, host: HostPools) -> int:
    """Memory beyond all ranks' pools that the per-pool check needs in the worst build order: the last rank,
    building pool j after its earlier pools, sees the others' pools resident and must find tp x pool j free
    (`host_memory_budget_bytes` = (available - 10 GiB) // ranks per host). Zero at TP1."""
    need, before = 0, 0
    for pool in host.pool_bytes():
        need = max(need, (tp - 1) * host.total_bytes + before + tp * pool)
        before += pool
    return max(need - tp * host.total_bytes, 0)


def memory_terms(tp: int, host: HostPools, g: Geometry, shm: int) -> list[Term]:
    """Every term of the pod memory limit, with why it must be there."""
    terms = [
        Term(
            "hostPools",
            tp * host.total_bytes,
            f"{tp} rank(s) x {units.binary(host.total_bytes)} of pinned HiCache host pools (KV + QSA index + Mamba)",
        ),
        Term(
            "runtimeReserve",
            RUNTIME_RESERVE_BYTES,
            "the runtime refuses to allocate host pools unless 10 GiB of the cgroup stays free "
            "('Not enough host memory available', pool_host/base.py:28,84-108)",
        ),
        Term(
            "rankBudgetCheck",
            rank_budget_bytes(tp, host),
            "each rank checks each pool against (free - 10 GiB) / ranks per host while the other ranks may "
            "already hold theirs (pool_host/base.py:84-108,248-257, pool_host/mamba.py:189-197): room for the "
            "worst rank order",
        ),
        Term("pleTable", ple_table_bytes(g), "the PLE n-gram table in pinned host RAM, all ranks' shards"),
        Term(
            "processes",
            tp * PROCESS_BYTES_PER_RANK + PROCESS_BYTES_PER_POD,
            f"{tp} TP worker(s) x {units.binary(PROCESS_BYTES_PER_RANK)} (CUDA context, NCCL, Python) + "
            f"{units.binary(PROCESS_BYTES_PER_POD)} tokenizer/detokenizer/HTTP",
        ),
        Term(
            "staging",
            tp * STAGING_BYTES_PER_RANK,
            f"{tp} x {units.binary(STAGING_BYTES_PER_RANK)} weight-loading and HiCache IO staging buffers",
        ),
        Term("shm", shm, "the memory-backed /dev/shm emptyDir counts against the pod's memory limit"),
    ]
    terms = [t for t in terms if t.bytes]
    margin = math.ceil(sum(t.bytes for t in terms) * MARGIN_FRACTION)
    terms.append(
        Term(
            "margin",
            margin,
            f"{MARGIN_FRACTION.numerator * 100 // MARGIN_FRACTION.denominator}% "
            "for page cache and allocator fragmentation",
        )
    )
    return terms


def to_bytes(value: str, what: str) -> int:
    """A quantity in bytes (kubernetes' parser, rounded up), or a SizingError naming the field."""
    try:
        return units.to_bytes(value)
    except ValueError:
        raise SizingError(f"{what} {value!r} is not a quantity like 600Gi or 500G") from None


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


@dataclass(frozen=True)
class Disk:
    """The file tier: per-rank payload cap and the per-replica volume that holds all ranks' files."""

    cap_bytes_per_rank: int | None
    volume_bytes: int | None
    problems: tuple[str, ...] = ()


def _volume_for(cap: int, tp: int) -> int:
    """The volume (whole GiB) that holds `tp` ranks' caps plus the filesystem headroom."""
    return _round_up(math.ceil(cap * tp / (1 - DISK_HEADROOM_FRACTION)), GIB)


def ranks_per_pod(spec: QwenHiCacheServerSpec) -> int:
    """TP ranks on one pod: every rank on a single node, a node's share (`tp / nodesPerReplica`) across nodes."""
    return spec.runtime.tensor_parallel_size // spec.nodes


def size_disk(spec: QwenHiCacheServerSpec, min_cap: int) -> Disk:
    """Cap from the volume, the volume from the cap, or both checked against each other. A volume is one pod's,
    holding the caps of the ranks on that pod (all of them, or a node's share when nodesPerReplica > 1)."""
    d, tp = spec.hicache.disk, ranks_per_pod(spec)
    if not d.enabled:
        return Disk(None, None)
    usable = 1 - DISK_HEADROOM_FRACTION
    volume = to_bytes(d.size, "hicache.disk.size") if d.size else None
    cap = to_bytes(d.cap_per_rank, "hicache.disk.capPerRank") if d.cap_per_rank else None
    if volume is None and cap is None:
        raise SizingError("disk tier is enabled but has no size: set hicache.disk.size or capPerRank")
    if volume is None:
        volume = _volume_for(cap, tp)
    fits = math.floor(volume * usable / tp)
    if cap is None:
        cap = fits
    problems = []
    if cap > fits:
        problems.append(
            f"disk cap larger than the volume: capPerRank {units.binary(cap)} x {tp} rank(s) = "
            f"{units.binary(cap * tp)} exceeds {units.binary(volume, down=True)} x {float(usable):.0%} usable = "
            f"{units.binary(volume * usable, down=True)}; lower capPerRank to {units.binary(fits, down=True)} or raise "
            f"hicache.disk.size to {units.binary(_volume_for(cap, tp))}"
        )
    if cap < min_cap:
        problems.append(
            f"disk cap leaves no room: {units.binary(cap, down=True)} per rank cannot hold one page of KV, index "
            f"and Mamba state ({units.binary(min_cap)}); raise hicache.disk.size (or capPerRank)"
        )
    return Disk(cap, volume, tuple(problems))


# --- the result -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """Every derived number (bytes, tokens, slots are ints) and the explained pod-memory terms."""

    tensor_parallel_size: int
    page_size: int
    replicas: int
    geometry: Geometry
    shapes: RankShapes
    device: DevicePools
    host: HostPools
    terms: tuple[Term, ...]
    pod_memory_limit_bytes: int
    shm_bytes: int
    disk: Disk
    context_length: int | None
    disk_files: DiskFiles | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ranks_per_pod: int = 0
    """TP ranks one pod runs: all of them, or `tensorParallelSize / nodesPerReplica` across nodes (0: all)."""
    write_rate: int = 0
    """hicache.disk.writeBytesPerSecond, bytes (the stop budget's assumed disk rate)."""
    pod_memory_request_bytes: int = field(init=False)
    """Request = limit: pinned pools cannot be reclaimed, so the pod must be Guaranteed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pod_memory_request_bytes", self.pod_memory_limit_bytes)

    @property
    def pod_ranks(self) -> int:
        return self.ranks_per_pod or self.tensor_parallel_size

    @property
    def kv_tokens_per_mamba_slot(self) -> int:
        """Mean cached-prefix length at which both host pools fill together; shorter prefixes run out of
        Mamba slots first and leave host KV that cannot be restored."""
        return self.host.kv_tokens // self.host.mamba_slots if self.host.mamba_slots else 0

    @property
    def restorable_kv_tokens(self) -> int:
        """Host KV restorable with one Mamba checkpoint per cached prefix of contextLength tokens."""
        if not self.host.mamba_slots:
            return self.host.kv_tokens
        length = self.context_length or self.kv_tokens_per_mamba_slot
        return min(self.host.kv_tokens, self.host.mamba_slots * length)

    def as_status(self, fit: tuple[str, ...] = ()) -> status_model.Sizing:
        """`status.sizing`: every derived number, the terms and the problems (with the node fit's). Every
        field is set, None included, so `qwen-hicache size -o json` shows the same keys as before."""
        s, dev, host = self.shapes, self.device, self.host
        files = self.disk_files
        return status_model.Sizing(
            tensor_parallel_size=self.tensor_parallel_size,
            page_size=self.page_size,
            kv_bytes_per_token=s.kv_bytes_per_token,
            index_bytes_per_page=s.index_bytes_per_page,
            mamba_bytes_per_slot=s.mamba_bytes_per_slot,
            ple_state_bytes_per_slot=s.ple_bytes_per_slot,
            device_kv_tokens_per_rank=dev.kv_tokens,
            device_kv_tokens_estimated=dev.kv_tokens_estimated,
            device_mamba_slots_per_rank=dev.mamba_slots,
            device_mamba_slots_assumed=dev.mamba_slots_assumed,
            device_kv_bytes_per_rank=dev.kv_bytes,
            device_mamba_bytes_per_rank=dev.mamba_bytes,
            device_index_bytes_per_rank=dev.index_bytes,
            running_requests=dev.running_requests,
            mamba_spec_states=dev.spec_states,
            hicache_size_gb=host.hicache_size_gb,
            hicache_ratio=host.hicache_ratio,
            host_kv_tokens_per_rank=host.kv_tokens,
            host_mamba_slots_per_rank=host.mamba_slots,
            host_kv_bytes_per_rank=host.kv_bytes,
            host_index_bytes_per_rank=host.index_bytes,
            host_mamba_bytes_per_rank=host.mamba_bytes,
            host_bytes_per_rank=host.total_bytes,
            host_bytes_per_pod=host.total_bytes * self.pod_ranks,
            coverage_kv_tokens_per_mamba_slot=self.kv_tokens_per_mamba_slot,
            coverage_restorable_kv_tokens_per_rank=self.restorable_kv_tokens,
            coverage_fraction=round(self.restorable_kv_tokens / host.kv_tokens, 4) if host.kv_tokens else 0.0,
            pod_memory_request_bytes=self.pod_memory_request_bytes,
            pod_memory_limit_bytes=self.pod_memory_limit_bytes,
            shm_bytes=self.shm_bytes,
            disk_cap_bytes_per_rank=self.disk.cap_bytes_per_rank,
            disk_volume_bytes=self.disk.volume_bytes,
            disk_headroom_fraction=float(DISK_HEADROOM_FRACTION),
            **({"pages_per_rank": files.pages, "files_per_rank": files.files,
                "files_per_rank_by_pool": files.files_by_pool} if files else {}),
            memory_terms=[status_model.MemoryTerm(name=t.name, bytes=t.bytes, why=t.why) for t in self.terms],
            notes=list(self.notes),
            problems=[*self.problems, *fit],
        )


def smallest_node(spec: QwenHiCacheServerSpec, observed_bytes: int | None) -> int | None:
    """The node memory to fit: the smaller of the spec's `runtime.nodeMemory` hint and the nodes the operator
    could read (None when neither is known)."""
    hint = to_bytes(spec.runtime.node_memory, "runtime.nodeMemory") if spec.runtime.node_memory else None
    known = [b for b in (hint, observed_bytes) if b is not None]
    return min(known) if known else None


def node_fit(sizing: Sizing, spec: QwenHiCacheServerSpec, observed_bytes: int | None) -> list[str]:
    """`check_fit` against the smallest node the pod may land on (`smallest_node`)."""
    return check_fit(sizing, smallest_node(spec, observed_bytes))


def check_fit(sizing: Sizing, node_allocatable_bytes: int | None) -> list[str]:
    """Problems when the pod cannot fit a node's allocatable memory; each names the numbers and the fix."""
    if node_allocatable_bytes is None or sizing.pod_memory_limit_bytes <= node_allocatable_bytes:
        return []
    tp = sizing.pod_ranks
    scaling = ("hostPools", "rankBudgetCheck", "margin")
    fixed = sum(t.bytes for t in sizing.terms if t.name not in scaling)
    pools = sum(t.bytes for t in sizing.terms if t.name in scaling[:2])
    # the pools and the budget check grow in proportion to the host size per rank
    room = node_allocatable_bytes / (1 + MARGIN_FRACTION) - fixed
    share = sizing.host.total_bytes / pools if pools else 1 / tp
    per_rank_gb = math.floor(room * share / GB) if room > 0 else 0
    fix = (
        f"lower hicache.hostMemoryPerRankGB to {per_rank_gb} or less, or use nodes with at least "
        f"{units.binary(sizing.pod_memory_limit_bytes)} allocatable"
        if per_rank_gb >= 1
        else f"use nodes with at least {units.binary(sizing.pod_memory_limit_bytes)} allocatable memory (lowering "
        f"hicache.hostMemoryPerRankGB cannot make it fit: the other terms alone need "
        f"{units.binary(math.ceil(fixed * (1 + MARGIN_FRACTION)))})"
    )
    return [
        f"pod needs {units.binary(sizing.pod_memory_limit_bytes)} memory "
        f"({tp} x {units.binary(sizing.host.total_bytes)} host pools + "
        f"{units.binary(pools - tp * sizing.host.total_bytes)} "
        f"for the per-rank budget check + {units.binary(fixed)} reserve, processes, PLE table and shm + margin) but "
        f"the node has {units.binary(node_allocatable_bytes, down=True)} allocatable: {fix}"
    ]


def resolve_kv_dtype(requested: str, g: Geometry) -> str:
    """`auto` as `configure_kv_cache_dtype` resolves it (`mem_cache/kv_cache_dtype.py:49-58`): FP8 E4M3 when the
    checkpoint declares `kv_cache_quant_algo: FP8`, else the model dtype (bf16 for every supported model)."""
    if requested != "auto":
        return requested
    return "fp8_e4m3" if g.checkpoint_kv_fp8 else "bf16"


def _input_notes(spec: QwenHiCacheServerSpec, g: Geometry) -> list[str]:
    """Inputs the runtime treats differently from how they read: said in status, never silent."""
    notes = []
    merged = profile_fields_merged(spec.model)
    if merged:
        notes.append(
            f"model.geometry is merged onto profile {spec.model.profile!r} (the default unless model.profile is "
            f"set): {', '.join(merged)} come from the profile; set them in model.geometry if the model differs"
        )
    if spec.runtime.kv_cache_dtype == "auto":
        known = g.checkpoint_kv_fp8 is not None
        resolved = resolve_kv_dtype("auto", g)
        notes.append(
            f"kvCacheDtype auto: the runtime uses {resolved} KV"
            + (" (the checkpoint's quantization_config)" if known else
               " unless the checkpoint's quantization_config declares kv_cache_quant_algo FP8 (then FP8 E4M3); "
               "set kvCacheDtype or model.geometry.checkpointKvFp8 to be sure")
        )
    return notes


def _notes(dev: DevicePools, host: HostPools) -> list[str]:
    notes = []
    if dev.running_requests < dev.requests:
        notes.append(
            f"maxRunningRequests {dev.requests} is capped by the runtime to {dev.running_requests} "
            f"(min of the request count, device KV tokens / 2 and {dev.mamba_slots} Mamba slots / "
            f"{mamba_slots_per_request()} per request, mem_cache/kv_cache_configurator.py:3119-3150)"
        )
    if dev.kv_tokens_estimated:
        notes.append(
            "deviceKVTokens is estimated from gpuMemoryGB; set hicache.deviceKVTokens from the runtime log"
        )
    if dev.mamba_slots_assumed:
        notes.append(
            f"runtime.maxMambaCacheSize unset: the operator renders {dev.mamba_slots} device Mamba slots "
            f"({mamba_slots_per_request()} per requested request, so the runtime does not cap the requests)"
        )
    if host.kv_tokens <= dev.kv_tokens:
        notes.append(
            f"host KV ({host.kv_tokens:,} tokens) is not larger than device KV ({dev.kv_tokens:,}): with "
            "write_through the host tier fills with duplicates of device pages; a hybrid disk hit that finds no "
            "evictable host room is refused whole and recomputed, which on the engine refused a restart's disk hits "
            "(sglang:storage_prefetch_unfulfilled_tokens_total{reason=\"host_capacity\"}, bench/gpu_engine.md); "
            "raise hostMemoryPerRankGB or lower deviceKVTokens"
        )
    return notes


def compute_sizing(spec: QwenHiCacheServerSpec, g: Geometry | None = None) -> Sizing:
    """All sizing for one spec and its resolved geometry (resolved here when not given); raises SizingError for
    input that cannot be sized at all. The node fit is `node_fit`'s (derive runs it once, against the smallest
    known node)."""
    if g is None:
        try:
            g = resolve_geometry(spec.model)
        except GeometryError as err:
            raise SizingError(str(err)) from err
    rt = spec.runtime
    tp, page = rt.tensor_parallel_size, rt.page_size
    ssm_dtype = rt.mamba_ssm_dtype or g.mamba_ssm_dtype or "float32"
    kv_dtype = resolve_kv_dtype(rt.kv_cache_dtype, g)
    shapes = rank_shapes(g, tp, kv_dtype, ssm_dtype, rt.speculative is not None, page)
    dev = device_pools(spec, g, shapes)
    host = host_pools(spec, dev, shapes)
    pod_ranks = ranks_per_pod(spec)  # the pod-level terms count this pod's ranks; per-rank shapes use all of TP
    shm = shm_bytes(pod_ranks)
    terms = memory_terms(pod_ranks, host, g, shm)
    limit = _round_up(sum(t.bytes for t in terms), GIB)
    disk = size_disk(
        spec, page * shapes.kv_bytes_per_token + shapes.index_bytes_per_page + shapes.mamba_bytes_per_slot
    )
    files = None
    if disk.cap_bytes_per_rank:  # one flat directory per rank: how many files the cap implies (disk_files.py)
        pools = {"kv": page * shapes.kv_bytes_per_token, "indexer": shapes.index_bytes_per_page,
                 "mamba": shapes.mamba_bytes_per_slot}  # fmt: skip
        files = disk_files(disk.cap_bytes_per_rank, pools)
    return Sizing(
        tp,
        page,
        spec.replicas,
        g,
        shapes,
        dev,
        host,
        tuple(terms),
        limit,
        shm,
        disk,
        rt.context_length,
        files,
        problems=list(disk.problems),
        notes=[*_input_notes(spec, g), *_notes(dev, host), *([files.warning] if files and files.warning else [])],
        ranks_per_pod=pod_ranks if spec.nodes > 1 else 0,
        write_rate=to_bytes(spec.hicache.disk.write_bytes_per_second, "hicache.disk.writeBytesPerSecond"),
    )
