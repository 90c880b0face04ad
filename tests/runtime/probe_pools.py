"""CPU host pools and a HiCacheFile of one sglang tree, for the probes (import after the tree is on sys.path).

The tree's own classes: ``MHATokenToKVPoolHost`` (page_first unless asked), ``MambaPoolHost`` (two layers plus the PLE
side state), ``QSAIndexerPoolHost`` and ``HiCacheFile``; pinned memory off (CPU).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.device_pool_info import (
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.qsa import QSAIndexerPoolHost

PAGE = 64
def storage(path: Path) -> hs.HiCacheFile:
    cfg = hs.HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="Qwen/probe",
    )
    return hs.HiCacheFile(cfg, file_path=str(path))


def ptrs(layers: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)


def kv_host(pages: int = 4, layout: str = "page_first") -> MHATokenToKVPoolHost:
    layers, heads, dim = 2, 2, 16
    k = tuple(torch.zeros(PAGE * pages, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    v = tuple(torch.zeros(PAGE * pages, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=PAGE,
        head_num=heads,
        head_dim=dim,
        v_head_dim=dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device_capacity_tokens=PAGE * pages,
        start_layer=0,
        end_layer=layers,
    )


def mamba_host(host_slots: int | None = None, layout: str = "page_first") -> MambaPoolHost:
    """Two Mamba layers plus PLE side state (conv window, n-gram context) in each slot."""
    layers, slots = 2, 8
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 2, 4, 4, dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 8, 3, dtype=torch.bfloat16),),
        extra_checkpoint_buffers=(
            torch.zeros(slots, 3, 5, dtype=torch.bfloat16),
            torch.zeros(slots, 7, dtype=torch.int32),
        ),
    )
    kwargs = {} if host_slots is None else {"host_slots": host_slots}
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, layout=layout, **kwargs)


def qsa_host(anchor: MHATokenToKVPoolHost) -> QSAIndexerPoolHost:
    ratio = 4
    device = SimpleNamespace(
        qsa_compress_ratio=ratio,
        qsa_compressed_k_buffer_pool=[torch.zeros(PAGE * 4 // ratio, 32, dtype=torch.uint8)],
    )
    return QSAIndexerPoolHost(device, anchor)


def fill_random(pool, index: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    page = pool.get_dummy_flat_data_page()
    page.copy_(torch.randint(0, 256, page.shape, generator=gen, dtype=torch.uint8))
    pool.set_from_flat_data_page(index, page)
    return pool.get_data_page(index, flat=True).clone()


def transfer(name, pool, keys: list[str], first_index: int) -> hs.PoolTransfer:
    step = getattr(pool, "page_size", 1) or 1
    indices = torch.arange(first_index * step, (first_index + len(keys)) * step, dtype=torch.int64)
    return hs.PoolTransfer(name=name, host_indices=indices, keys=keys)


def kv_file(store: hs.HiCacheFile, key: str) -> Path:
    return Path(store.file_path) / f"{store._get_component_key(key)}.bin"


