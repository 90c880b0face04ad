"""Byte-exact restart round trip through the runtime's own pools and file tier, one component at a time.

    python roundtrip_probe.py TREE WORKDIR write   # device pools filled, device->host, pages written; exits
    python roundtrip_probe.py TREE WORKDIR read    # fresh pools, pages read, host->device, compared on the device

Write and read run in separate interpreters (a restart). Everything is 0.5.23's own code, built on CPU:

- Device side: ``HybridReqToTokenPool`` (as ``kv_cache_configurator`` builds it for a PLE model) builds the
  target ``MambaPool`` and the PLE side-state pools ``ShortConvPool`` (conv window, bf16) and ``NGramPool``
  (n-gram context, its real dtype int64), and registers both on the Mamba pool (``register_slot_state``);
  the MTP draft's Mamba pool is ``clone_with_new_mamba`` (one draft layer, no side state), as the draft
  worker's pool is. The write side stores known bytes through the model's own accessors
  (``mamba2_layer_cache``, ``short_conv_layer_cache``, ``set_ngram_context``); the read side compares through
  the read accessors (the same, and ``get_ngram_context``).
- Host side: ``MambaPoolHost`` built from the device pools' ``get_device_pool_infos()`` (target plus the
  draft's, as ``hybrid_pool_assembler.build_mamba_host_pool`` does), so the side states reach the host pool
  only through the device pool's registration and export; ``MHATokenToKVPoolHost``;
  ``QSAIndexerPoolHost`` packing target and draft compressed keys; the tree's ``HiCacheFile``.
- Mamba SSM and conv state (target and draft) and both side states move device->host with
  ``MambaPoolHost.backup_from_device_all_layer`` and host->device with ``load_to_device_per_layer`` (every
  host layer; side states ride on layer 0 through ``_transfer_slot_states``), with
  ``io_backend="kernel_ascend"``: off NPU ``transfer_mamba_state`` is None, so that backend is the pool's
  pure-torch "sync" fallback (``index_select`` / ``index_copy_`` over the page-first host layout, the draft
  layers packed behind the target's). On CUDA the ``kernel`` / ``direct`` backends move SSM/conv with CUDA
  kernels instead (JIT ``transfer_kv_mamba_lf_pf`` / ``_pf_lf``, sgl_kernel ``transfer_kv_*direct*``; not run
  here); the host layout, the draft-layer packing and the side-state copy are the same code.
- Filled directly on the host (their only device<->host copies are CUDA/NPU kernels: sgl_kernel
  ``transfer_kv_*`` / JIT ``transfer_hicache_*`` for KV, ``transfer_kv_*_mla`` / ``transfer_cache_dsv4_mla``
  for the QSA rows): KV (K and V) and QSA compressed keys (target and draft); compared on the host rows.

Each component is compared separately, so a page that silently loses one (it just gets smaller) fails by name.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import cpu_stub

TREE, WORK, PHASE = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)
os.environ["SGLANG_NPU_HICACHE_MAMBA_IO"] = "sync"  # the default, pinned: the pure-torch Mamba fallback

import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.qsa import QSAIndexerPoolHost  # noqa: E402

PAGE, LAYERS, SLOTS, RATIO = 64, 2, 8, 4
MAMBA_LAYERS, SHORT_CONV_LAYERS, DRAFT_LAYER = [0, 1], [0], 2  # model layer ids (the draft: its MTP layer)
SHORT_CONV_SHAPE, NGRAM_LEN, EOS = (3, 5), 7, 2
IO_BACKEND = "kernel_ascend"  # off NPU: MambaPoolHost's pure-torch sync fallback (see the docstring)
KEYS = [f"{i:064x}" for i in range(1, 3)]
HOST_PAGES = [1, 2]  # host pages (KV, QSA) and host Mamba slots the two keys live in
DEVICE_SLOTS = {"write": [3, 4], "read": [5, 6]}  # device Mamba slots holding the state before/after


def storage() -> hs.HiCacheFile:
    cfg = hs.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="Qwen/roundtrip",
    )  # fmt: skip
    return hs.HiCacheFile(cfg, file_path=str(WORK / "pages"))


def ptrs(layers: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)


def cache_params(layers: list[int]) -> Mamba2CacheParams:
    shape = Mamba2StateShape(
        conv=[(8, 3)], temporal=(2, 4, 4), intermediate_size=0, conv_dim=8, ssm_state_size=4, num_heads=2,
        head_dim=4, state_size=4, conv_kernel=4,
    )  # fmt: skip
    return Mamba2CacheParams(
        shape=shape, layers=layers, dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32)
    )


def device_pools() -> tuple[HybridReqToTokenPool, HybridReqToTokenPool]:
    """The target's request pool (Mamba pool + registered PLE side states) and the MTP draft's clone."""
    target = HybridReqToTokenPool(
        size=4, mamba_size=SLOTS, mamba_spec_state_size=4, max_context_len=PAGE * 4, device="cpu",
        enable_memory_saver=False, cache_params=cache_params(MAMBA_LAYERS), mamba_layer_ids=MAMBA_LAYERS,
        enable_mamba_extra_buffer=False, short_conv_layer_ids=SHORT_CONV_LAYERS,
        short_conv_state_shape=SHORT_CONV_SHAPE, ngram_context_len=NGRAM_LEN, ngram_eos_token_id=EOS,
    )  # fmt: skip
    draft = target.clone_with_new_mamba(
        mamba_size=SLOTS, mamba_spec_state_size=4, cache_params=cache_params([DRAFT_LAYER]), device="cpu",
        enable_mamba_extra_buffer=False, draft_model_idx=DRAFT_LAYER,
    )  # fmt: skip
    return target, draft


def pools() -> dict:
    # The host pools book a fixed 1 GiB snapshot (the runtime's own scope) instead of sampling the runner's free
    # RAM less the 10 GiB reserve, which on a busy runner is negative and fails even these KiB-sized pools.
    with host_memory_budget_scope(1 << 30):
        return build_pools()


def build_pools() -> dict:
    heads, dim = 2, 16
    k = tuple(torch.zeros(PAGE * 4, heads, dim, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(PAGE * 4, heads, dim, dtype=torch.bfloat16) for _ in range(LAYERS))
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )  # fmt: skip
    kv = MHATokenToKVPoolHost(
        info, 2.0, 0, PAGE, "page_first", pin_memory=False, device_capacity_tokens=PAGE * 4,
        start_layer=0, end_layer=LAYERS,
    )  # fmt: skip
    target, draft = device_pools()
    (mamba_info,) = target.mamba_pool.get_device_pool_infos()
    mamba_info.buffer_info.validate(layer_ids=mamba_info.layer_ids)
    (draft_info,) = draft.mamba_pool.get_device_pool_infos()
    draft_info.buffer_info.validate(layer_ids=draft_info.layer_ids)
    mamba = MambaPoolHost(
        mamba_info.buffer_info, 2.0, 0, device_capacity=target.mamba_pool.size, pin_memory=False,
        layout="page_first", mtp_draft_buffer_infos=(draft_info.buffer_info,),
    )  # fmt: skip
    qsa_device = [
        SimpleNamespace(qsa_compress_ratio=RATIO,
                        qsa_compressed_k_buffer_pool=[torch.zeros(PAGE * 4 // RATIO, 32, dtype=torch.uint8)])
        for _ in range(2)
    ]  # fmt: skip
    qsa = QSAIndexerPoolHost(qsa_device[0], kv, mtp_draft_device_pools=(qsa_device[1],))
    return {"kv": kv, "mamba": mamba, "qsa": qsa, "target": target, "draft": draft}


def host_components(p: dict) -> dict[str, torch.Tensor | None]:
    """Views of the written pages' rows in the KV and QSA host buffers (None: the pool lacks the component)."""
    kv, qsa = p["kv"], p["qsa"]
    tokens = slice(HOST_PAGES[0] * PAGE, (HOST_PAGES[-1] + 1) * PAGE)
    rows = slice(HOST_PAGES[0], HOST_PAGES[-1] + 1)
    views = {
        "kv.k": lambda: kv.kv_buffer[0, tokens],
        "kv.v": lambda: kv.kv_buffer[1, tokens],
        "qsa.keys.target": lambda: qsa.kv_buffer[rows, 0],
        "qsa.keys.draft": lambda: qsa.kv_buffer[rows, 1],
    }
    out = {}
    for name, view in views.items():
        try:
            out[name] = view()
        except IndexError:
            out[name] = None
        if out[name] is not None and out[name].numel() == 0:
            out[name] = None
    return out


def device_components(p: dict, slots: list[int]) -> dict[str, torch.Tensor]:
    """Each device-side component at these Mamba slots, read through the model's own accessors (a copy)."""
    target, draft = p["target"], p["draft"]
    idx = torch.tensor(slots, dtype=torch.int64)
    states = [target.mamba2_layer_cache(layer) for layer in MAMBA_LAYERS]
    draft_state = draft.mamba2_layer_cache(DRAFT_LAYER)
    return {
        "mamba.ssm.target": torch.stack([s.temporal[idx] for s in states]),
        "mamba.ssm.draft": draft_state.temporal[idx].unsqueeze(0),
        "mamba.conv.target": torch.stack([s.conv[0][idx] for s in states]),
        "mamba.conv.draft": draft_state.conv[0][idx].unsqueeze(0),
        "ple.conv_window": torch.stack([target.short_conv_layer_cache(layer)[idx] for layer in SHORT_CONV_LAYERS]),
        "ngram.context": target.get_ngram_context(idx),
    }


def write_device(p: dict, slots: list[int]) -> None:
    """Store each component's known bytes at these slots through the accessors the model writes with."""
    target, draft = p["target"], p["draft"]
    idx = torch.tensor(slots, dtype=torch.int64)
    want = {name: expected(name, like) for name, like in device_components(p, slots).items()}
    for i, layer in enumerate(MAMBA_LAYERS):
        state = target.mamba2_layer_cache(layer)
        state.temporal[idx] = want["mamba.ssm.target"][i]
        state.conv[0][idx] = want["mamba.conv.target"][i]
    draft_state = draft.mamba2_layer_cache(DRAFT_LAYER)
    draft_state.temporal[idx] = want["mamba.ssm.draft"][0]
    draft_state.conv[0][idx] = want["mamba.conv.draft"][0]
    for i, layer in enumerate(SHORT_CONV_LAYERS):
        target.short_conv_layer_cache(layer)[idx] = want["ple.conv_window"][i]
    target.set_ngram_context(idx, want["ngram.context"])


def expected(name: str, like: torch.Tensor) -> torch.Tensor:
    """Deterministic per-component content: random bytes, or random token ids for the integer n-gram context."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)) * 7919)
    if not like.dtype.is_floating_point and like.dtype != torch.uint8:
        return torch.randint(0, 151_000, like.shape, generator=gen, dtype=like.dtype)
    raw = torch.randint(0, 256, (*like.shape[:-1], like.shape[-1] * like.element_size()), generator=gen)
    return raw.to(torch.uint8).view(like.dtype)


def transfers(p: dict) -> list[hs.PoolTransfer]:
    tokens = torch.arange(HOST_PAGES[0] * PAGE, (HOST_PAGES[-1] + 1) * PAGE, dtype=torch.int64)
    return [
        hs.PoolTransfer(name=hs.PoolName.KV, host_indices=tokens, keys=KEYS),
        hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=torch.tensor(HOST_PAGES), keys=KEYS),
        hs.PoolTransfer(name=hs.PoolName.INDEXER, host_indices=tokens, keys=KEYS),
    ]


def setup() -> tuple[hs.HiCacheFile, dict]:
    store, p = storage(), pools()
    store.register_mem_host_pool_v2(p["kv"], hs.PoolName.KV)
    store.register_mem_host_pool_v2(p["mamba"], hs.PoolName.MAMBA)
    store.register_mem_host_pool_v2(p["qsa"], hs.PoolName.INDEXER)
    return store, p


def write() -> dict:
    store, p = setup()
    for name, view in host_components(p).items():
        if view is not None:
            view.copy_(expected(name, view))
    write_device(p, DEVICE_SLOTS["write"])
    host, device = torch.tensor(HOST_PAGES), torch.tensor(DEVICE_SLOTS["write"])
    p["mamba"].backup_from_device_all_layer(p["target"].mamba_pool, host, device, io_backend=IO_BACKEND)
    results = store.batch_set_v2(transfers(p))
    return {"results": {str(k): v for k, v in results.items()}, "page_bytes": {
        "kv": int(p["kv"].get_dummy_flat_data_page().nbytes),
        "mamba": int(p["mamba"].get_dummy_flat_data_page().nbytes),
        "indexer": int(p["qsa"].get_dummy_flat_data_page().nbytes),
    }}  # fmt: skip


def read() -> dict:
    store, p = setup()
    ts = transfers(p)
    hit = store.batch_exists_v2(KEYS, [t for t in ts if t.name != hs.PoolName.KV])
    results = store.batch_get_v2(ts)
    host, device = torch.tensor(HOST_PAGES), torch.tensor(DEVICE_SLOTS["read"])
    for layer_id in range(p["mamba"].num_mamba_layers):  # every layer the host slot holds, drafts last
        p["mamba"].load_to_device_per_layer(p["target"].mamba_pool, host, device, layer_id, io_backend=IO_BACKEND)
    same, dtypes = {}, {}
    for name, view in {**host_components(p), **device_components(p, DEVICE_SLOTS["read"])}.items():
        if view is None:
            same[name] = False  # the pool has no room for this component at all
            continue
        want = expected(name, view)
        dtypes[name] = str(view.dtype)
        same[name] = bool(torch.equal(view.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)))
        if not view.dtype.is_floating_point:  # integer components (n-gram token ids) compared as values too
            same[name] = same[name] and view.dtype == want.dtype and bool(torch.equal(view, want))
    return {
        "same": same,
        "dtypes": dtypes,
        "results": {str(k): v for k, v in results.items()},
        "hit_pages": hit.hit_pages if hasattr(hit, "hit_pages") else None,
        "kv_hit_pages": hit.kv_hit_pages,
    }


if __name__ == "__main__":
    print(json.dumps(write() if PHASE == "write" else read()))
