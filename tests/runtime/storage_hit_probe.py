"""A cache-mode storage hit larger than the free host capacity, through one tree's own code on CPU.

    python storage_hit_probe.py TREE WORKDIR

Drives, in one interpreter per tree, what happens between the storage hit query and the radix insert:

* the scheduler-side allocation: ``UnifiedRadixCache._drain_storage_control_queues_impl`` (its
  ``_try_alloc_storage_hit``), with the methods it reaches (``revoke_pending_prefetch``,
  ``_retire_ongoing_prefetch``, ``_alloc_prefetch_aux_staging``, the accounting helpers) compiled out of
  TREE's unified_radix_cache.py (the module itself imports the OpenAI protocol models, absent here), on a
  real ``HybridCacheController`` (``allocate_storage_hit``, ``append_host_mem_release``) over a real
  ``HostPoolGroup`` of an ``MHATokenToKVPoolHost`` (8 host pages) and a ``MambaPoolHost``;
* the prefetch IO thread's transfer: ``HybridCacheController._page_transfer`` (KV pages, then the Mamba
  sidecar with its trailing key re-aligned by ``_sync_trailing_keys``) from a real ``HiCacheFile`` that the
  controller's own ``_page_backup`` filled as a write-through storage backup does (KV pages + the node's Mamba
  state under its last page hash, the key ``MambaComponent.build_hicache_transfers(BACKUP_STORAGE)`` gives);
* the result check: ``UnifiedRadixCache._check_hybrid_prefetch_result`` (all-or-nothing for Mamba/SWA).

The stand-ins: the radix tree's host eviction (``evict_host``: frees the pages of other host nodes only when
the scenario says they are evictable), the Mamba component's staging alloc (the real host pool's ``alloc``),
and the ack sync thread (its reduction over one rank is the identity: the acks are applied as
``_drain_ack_prefetch`` applies them).
"""

from __future__ import annotations

import ast
import json
import logging
import sys
import traceback
from collections import defaultdict
from pathlib import Path
from queue import Queue
from types import SimpleNamespace
from typing import NamedTuple

import cpu_stub

TREE, WORK = Path(sys.argv[1]), Path(sys.argv[2])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.buffer_mode.storage_existence_cache import (  # noqa: E402
    StorageExistenceCache,
    default_belief_policy,
)
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage_prefetch import StoragePrefetchRetries  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

PAGE, HIT_PAGES, FREE_PAGES = 64, 4, 3  # other host nodes hold all host KV pages but 3: a 4-page hit does not fit
URC = "sglang/srt/mem_cache/unified_radix_cache.py"
CACHE_METHODS = (
    "_drain_storage_control_queues_impl", "revoke_pending_prefetch", "_retire_ongoing_prefetch",
    "_prefetch_occupied_span", "_alloc_prefetch_aux_staging", "_finish_storage_prefetch",
    "_resolve_storage_prefetch_tokens", "_record_storage_prefetch_hit", "_account_prefetch_outcome",
    "_invalidate_absent_from_hit_query", "_log_storage_prefetch_deferred", "discard_storage_prefetch_accounting",
    "_check_hybrid_prefetch_result", "_belief_policy",
)  # fmt: skip


def _cache_class() -> type:
    """UnifiedRadixCache's methods named above, compiled out of TREE's source into a bare class."""
    module = ast.parse((TREE / URC).read_text())
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "UnifiedRadixCache")
    fns = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name in CACHE_METHODS]
    assert {f.name for f in fns} == set(CACHE_METHODS), set(CACHE_METHODS) - {f.name for f in fns}
    record = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "_OngoingPrefetch")
    namespace: dict = {
        "torch": torch, "PoolName": hs.PoolName, "PoolHitPolicy": hs.PoolHitPolicy, "PoolTransfer": hs.PoolTransfer,
        "default_belief_policy": default_belief_policy, "logger": logging.getLogger("probe"), "Queue": Queue,
        "NamedTuple": NamedTuple,
    }  # fmt: skip
    flags = annotations.compiler_flag  # the source module's own `from __future__ import annotations`
    exec(compile(ast.Module([record, *fns], []), str(TREE / URC), "exec", flags=flags, dont_inherit=True), namespace)
    methods = {f.name: namespace[f.name] for f in fns}
    return type("UnifiedRadixCacheMethods", (), {**methods, "OngoingPrefetch": namespace["_OngoingPrefetch"]})


def kv_host() -> MHATokenToKVPoolHost:
    layers, heads, dim, device_pages = 2, 2, 16, 4
    k = tuple(torch.zeros(PAGE * device_pages, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    v = tuple(torch.zeros(PAGE * device_pages, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    ptrs = [torch.tensor([t.data_ptr() for t in x], dtype=torch.uint64) for x in (k, v)]
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1], layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )  # fmt: skip
    return MHATokenToKVPoolHost(
        info, 2.0, 0, PAGE, "page_first", pin_memory=False, device_capacity_tokens=PAGE * device_pages,
        start_layer=0, end_layer=layers,
    )  # fmt: skip


def mamba_host() -> MambaPoolHost:
    layers, slots = 2, 8
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 2, 4, 4, dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 8, 3, dtype=torch.bfloat16),),
    )
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, layout="page_first")


def storage(path: Path) -> hs.HiCacheFile:
    cfg = hs.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="Qwen/storage-hit",
    )  # fmt: skip
    return hs.HiCacheFile(cfg, file_path=str(path))


def controller(group: HostPoolGroup, store: hs.HiCacheFile) -> HybridCacheController:
    """A HybridCacheController with what the hit allocation, the transfer and the backup touch."""
    ctrl = object.__new__(HybridCacheController)
    ctrl.__dict__.update(
        mem_pool_host=group, storage_host_pool=group.anchor_entry.host_pool, page_size=PAGE, storage_backend=store,
        host_memory_mode="cache", enable_storage=True, prefetch_tokens_occupied=0,
        storage_config=SimpleNamespace(is_storage_writer=True, pp_rank=0),
        prefetch_hit_queue=Queue(), ack_prefetch_queue=Queue(), ack_backup_queue=Queue(),
        host_mem_release_queue=Queue(), extra_host_mem_release_queues={hs.PoolName.MAMBA: Queue()},
        prefetch_buffer=Queue(), prefetch_sync_queue=Queue(),
    )  # fmt: skip
    ctrl.page_get_func = ctrl._generic_page_get
    ctrl.page_set_func = ctrl._generic_page_set
    return ctrl


def admit_prefetch(cache, ctrl, rid: str, tokens: list, hashes: list, hybrid: bool) -> PrefetchOperation:
    """The prefetch as UnifiedRadixCache's prefetch start builds it (MambaComponent's PREFETCH placeholder
    transfer), after the hit query found every page (what _storage_hit_query leaves on it), through the scheduler's
    own storage-hit drain (allocate_storage_hit)."""
    request = CacheRequestHandle(rid=rid, attempt_id=0)
    comp_xfers = {}
    if hybrid:
        comp_xfers[ComponentType.MAMBA] = [
            hs.PoolTransfer(
                name=hs.PoolName.MAMBA, keys=["__placeholder__"], hit_policy=hs.PoolHitPolicy.TRAILING_PAGES
            )
        ]
    op = PrefetchOperation(request, tokens, None, pool_transfers=[x for v in comp_xfers.values() for x in v] or None)
    op.hash_value, op.all_hash_values, op.storage_hit_count = list(hashes), list(hashes), len(tokens)
    op.stats_requested_tokens = len(tokens)
    cache.ongoing_prefetch[request] = cache.OngoingPrefetch(0, tokens, None, op, None, comp_xfers)
    ctrl.prefetch_tokens_occupied = len(tokens)
    ctrl.prefetch_hit_queue.put(op)
    cache._drain_storage_control_queues_impl(
        n_storage_hit=1, n_ack_prefetch=0, n_backup=0, n_release=None, extra_release_counts=None, log_metrics=False
    )
    return op


def run_scenario(name: str, *, hybrid: bool, others_evictable: bool) -> dict:
    # The runtime's own budget snapshot (64 MiB for two pools of a few hundred KiB): the machine's free-memory
    # check would otherwise fail the probe whenever other work on a shared runner holds the cgroup's memory.
    with host_memory_budget_scope(64 << 20):
        kv, mamba = kv_host(), mamba_host()
    group = HostPoolGroup([
        PoolEntry(name=hs.PoolName.KV, host_pool=kv, device_pool=None, layer_mapper=lambda i: i,
                  is_primary_index_anchor=True),
        PoolEntry(name=hs.PoolName.MAMBA, host_pool=mamba, device_pool=None, layer_mapper=lambda i: i),
    ])  # fmt: skip
    store = storage(WORK / name)
    store.register_mem_host_pool_v2(kv, hs.PoolName.KV)
    store.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
    ctrl = controller(group, store)

    # An earlier request's node (HIT_PAGES pages) backed up to storage by the controller's own _page_backup,
    # then evicted from host: KV pages under their page hashes, the Mamba state under the node's last one.
    tokens = list(range(1000, 1000 + HIT_PAGES * PAGE))
    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    node_kv, node_state = kv.alloc(HIT_PAGES * PAGE), mamba.alloc(1)
    for i in range(HIT_PAGES):
        page = kv.get_dummy_flat_data_page()
        page.copy_(torch.randint(0, 256, page.shape, generator=torch.Generator().manual_seed(i), dtype=torch.uint8))
        kv.set_from_flat_data_page(int(node_kv[i * PAGE]), page)
    backup = StorageOperation(node_kv, tokens, hash_value=list(hashes), pool_transfers=[
        hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=node_state, keys=[hashes[-1]],
                        hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)] if hybrid else None)  # fmt: skip
    ctrl._page_backup(backup)
    kv.free(node_kv)
    mamba.free(node_state)
    stored = {"kv_pages": sum(map(store.exists, hashes)), "backup_completed_tokens": backup.completed_tokens}

    # Other host nodes hold all but FREE_PAGES pages; evict_host frees them only if they are evictable (unlocked).
    held = kv.alloc(kv.available_size() - FREE_PAGES * PAGE)
    free_before = kv.available_size()
    evictions: list[int] = []

    def evict_host(num_tokens: int, *_component) -> int:
        evictions.append(num_tokens)
        if others_evictable and held.numel():
            kv.free(held)
            return int(held.numel())
        return 0

    cache = _cache_class()()
    retries = StoragePrefetchRetries()
    cache.__dict__.update(
        cache_controller=ctrl, host_memory_mode="cache", buffer_pipeline=None, page_size=PAGE,
        prefetch_threshold=PAGE, evict_host=evict_host, storage_prefetch_retries=retries,
        _prefetch_outcome_stats=defaultdict(int), enable_storage_metrics=False, storage_metrics_collector=None,
        _storage_prefetch_hit_remaining_by_reqid={}, storage_existence_cache=StorageExistenceCache(),
        prefetch_loaded_tokens_by_reqid={}, prefetch_loaded_storage_start_by_reqid={}, ongoing_prefetch={},
        dec_host_lock_ref=lambda *a: None,
        components={ComponentType.MAMBA: SimpleNamespace(
            alloc_prefetch_staging=lambda n: mamba.alloc(n), buffer_belief_policy=lambda pool: None)},
    )  # fmt: skip

    op = admit_prefetch(cache, ctrl, "r1", tokens, hashes, hybrid)
    request = op.handle
    queued = not ctrl.prefetch_buffer.empty()
    out = {
        "stored": stored,
        "hit_tokens_found": len(tokens),
        "free_host_tokens_before": free_before,
        "evict_host_calls": evictions,
        "queued_for_transfer": queued,
        "transfer_tokens": op.storage_hit_count if queued else 0,
        "transfer_pages": len(op.hash_value) if queued else 0,
    }
    if queued:
        # The prefetch IO thread's transfer, then the acks as _drain_ack_prefetch applies them.
        ctrl.prefetch_buffer.get()
        ctrl._page_transfer(op)
        while not ctrl.prefetch_sync_queue.empty():
            ack = ctrl.prefetch_sync_queue.get()
            if ack.completed_tokens is not None:
                op.completed_tokens = ack.completed_tokens
            if ack.pool_hits is not None:
                op.pool_storage_result.update_extra_pool_hit_pages(ack.pool_hits)
                op.pool_transfers_done = True
        info = cache.ongoing_prefetch[request]
        out["completed_tokens"] = op.completed_tokens
        out["mamba_key_read"] = [hashes.index(k) + 1 for k in op.pool_transfers[0].keys] if hybrid else None
        out["mamba_pages_read"] = dict(op.pool_storage_result.extra_pool_hit_pages).get(hs.PoolName.MAMBA, 0)
        usable = bool(cache._check_hybrid_prefetch_result(request, op, op.hash_value, info.host_indices))
        out["loaded_tokens"] = op.completed_tokens if usable else cache.prefetch_loaded_tokens_by_reqid[request]
    else:
        out["loaded_tokens"] = 0
    out["retry_armed"] = request.rid in retries._pending
    if out["loaded_tokens"] == 0:
        # Dropped or revoked: once the release queues drain, nothing it staged stays allocated.
        cache._drain_storage_control_queues_impl(
            n_storage_hit=0, n_ack_prefetch=0, n_backup=0, n_release=None,
            extra_release_counts={hs.PoolName.MAMBA: None}, log_metrics=False,
        )  # fmt: skip
        out["ongoing_after"] = request in cache.ongoing_prefetch
        out["leaked"] = {
            "host_tokens": free_before - kv.available_size(),
            "mamba_slots": mamba.size - mamba.available_size(),
        }
    return out


def run(fn) -> dict:
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc(limit=6)}


if __name__ == "__main__":
    report = {
        "hybrid_short_capacity": run(lambda: run_scenario("hybrid_short", hybrid=True, others_evictable=False)),
        "hybrid_evictable": run(lambda: run_scenario("hybrid_evictable", hybrid=True, others_evictable=True)),
        "kv_only_short_capacity": run(lambda: run_scenario("kv_short", hybrid=False, others_evictable=False)),
    }
    print(json.dumps(report))
