"""Byte-exact restart round trip through the runtime's own host pools and file tier, one component at a time.

    python roundtrip_probe.py TREE WORKDIR write   # fill, device->host side states, write pages; exits
    python roundtrip_probe.py TREE WORKDIR read    # fresh pools, read pages, host->device side states, compare

Write and read run in separate interpreters (a restart). The pools are 0.5.23's own: ``MHATokenToKVPoolHost``,
``MambaPoolHost`` with an MTP draft layer and two registered PLE side states (conv window, bf16; n-gram
context, int32), ``QSAIndexerPoolHost`` packing target and draft compressed keys, and the tree's
``HiCacheFile``. The side states move device<->host through the pool's own pure-torch ``_transfer_slot_states``;
KV, SSM and conv state move device<->host through sgl_kernel's CUDA transfer kernels, which cannot run here,
so their host rows are filled directly. Each component is compared separately, so a page that silently loses
one (it just gets smaller) fails by name.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import cpu_stub

TREE, WORK, PHASE = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.qsa import QSAIndexerPoolHost  # noqa: E402

PAGE, LAYERS, DRAFT_LAYERS, SLOTS, RATIO = 64, 2, 1, 8, 4
KEYS = [f"{i:064x}" for i in range(1, 3)]
HOST_PAGES = [1, 2]  # host pages (KV, QSA) and host Mamba slots the two keys live in
DEVICE_SLOTS = {"write": [3, 4], "read": [5, 6]}  # device Mamba slots holding the side states before/after


def storage() -> hs.HiCacheFile:
    cfg = hs.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="Qwen/roundtrip",
    )  # fmt: skip
    return hs.HiCacheFile(cfg, file_path=str(WORK / "pages"))


def ptrs(layers: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)


def pools() -> dict:
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
    target = MambaStateBufferInfo(
        temporal=torch.zeros(LAYERS, SLOTS, 2, 4, 4, dtype=torch.float32),
        conv=(torch.zeros(LAYERS, SLOTS, 8, 3, dtype=torch.bfloat16),),
        extra_checkpoint_buffers=(
            torch.zeros(SLOTS, 3, 5, dtype=torch.bfloat16),  # PLE conv window
            torch.zeros(SLOTS, 7, dtype=torch.int32),  # n-gram context (token ids)
        ),
    )
    draft = MambaStateBufferInfo(
        temporal=torch.zeros(DRAFT_LAYERS, SLOTS, 2, 4, 4, dtype=torch.float32),
        conv=(torch.zeros(DRAFT_LAYERS, SLOTS, 8, 3, dtype=torch.bfloat16),),
    )
    mamba = MambaPoolHost(
        target, 2.0, 0, device_capacity=SLOTS, pin_memory=False, layout="page_first", mtp_draft_buffer_infos=(draft,)
    )
    qsa_device = [
        SimpleNamespace(qsa_compress_ratio=RATIO,
                        qsa_compressed_k_buffer_pool=[torch.zeros(PAGE * 4 // RATIO, 32, dtype=torch.uint8)])
        for _ in range(2)
    ]  # fmt: skip
    qsa = QSAIndexerPoolHost(qsa_device[0], kv, mtp_draft_device_pools=(qsa_device[1],))
    return {"kv": kv, "mamba": mamba, "qsa": qsa, "side_states": target.extra_checkpoint_buffers}


def host_components(p: dict) -> dict[str, torch.Tensor | None]:
    """Views of the written pages' rows in each host buffer, one per component (None: the pool lacks it)."""
    kv, mamba, qsa = p["kv"], p["mamba"], p["qsa"]
    tokens = slice(HOST_PAGES[0] * PAGE, (HOST_PAGES[-1] + 1) * PAGE)
    rows = slice(HOST_PAGES[0], HOST_PAGES[-1] + 1)
    views = {
        "kv.k": lambda: kv.kv_buffer[0, tokens],
        "kv.v": lambda: kv.kv_buffer[1, tokens],
        "qsa.keys.target": lambda: qsa.kv_buffer[rows, 0],
        "qsa.keys.draft": lambda: qsa.kv_buffer[rows, 1],
        "mamba.ssm.target": lambda: mamba.temporal_buffer[rows, :LAYERS],
        "mamba.ssm.draft": lambda: mamba.temporal_buffer[rows, LAYERS:],
        "mamba.conv.target": lambda: mamba.conv_buffer[0][rows, :LAYERS],
        "mamba.conv.draft": lambda: mamba.conv_buffer[0][rows, LAYERS:],
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


def device_side_states(p: dict, phase: str) -> dict[str, torch.Tensor]:
    conv_window, ngram = p["side_states"]
    slots = DEVICE_SLOTS[phase]
    return {"ple.conv_window": conv_window[slots], "ngram.context": ngram[slots]}


def expected(name: str, like: torch.Tensor) -> torch.Tensor:
    """Deterministic per-component content: random bytes, or random token ids for the int32 n-gram context."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)) * 7919)
    if like.dtype == torch.int32:
        return torch.randint(0, 151_000, like.shape, generator=gen, dtype=torch.int32)
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


def slot_transfer(p: dict, phase: str, to_device: bool) -> None:
    host = torch.tensor(HOST_PAGES, dtype=torch.int64)
    p["mamba"]._transfer_slot_states(host, torch.tensor(DEVICE_SLOTS[phase]), to_device=to_device)


def write() -> dict:
    store, p = setup()
    for name, view in host_components(p).items():
        if view is not None:
            view.copy_(expected(name, view))
    conv_window, ngram = p["side_states"]
    for name, state in (("ple.conv_window", conv_window), ("ngram.context", ngram)):
        state[DEVICE_SLOTS["write"]] = expected(name, state[DEVICE_SLOTS["write"]])
    slot_transfer(p, "write", to_device=False)  # device -> host, the runtime's own copy
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
    slot_transfer(p, "read", to_device=True)  # host -> device, the runtime's own copy
    same = {}
    for name, view in {**host_components(p), **device_side_states(p, "read")}.items():
        if view is None:
            same[name] = False  # the pool has no room for this component at all
            continue
        want = expected(name, view)
        same[name] = bool(torch.equal(view.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)))
        if view.dtype == torch.int32:  # the n-gram context compared in its real dtype too
            same[name] = same[name] and view.dtype == want.dtype and bool(torch.equal(view, want))
    return {
        "same": same,
        "results": {str(k): v for k, v in results.items()},
        "hit_pages": hit.hit_pages if hasattr(hit, "hit_pages") else None,
        "kv_hit_pages": hit.kv_hit_pages,
    }


if __name__ == "__main__":
    print(json.dumps(write() if PHASE == "write" else read()))
