"""Run the upstream fixes #38851 and #36743 as they sit in one SGLang tree, on CPU; print JSON.

``python backport_probe.py TREE``. The QSA gather is a Triton kernel: it runs
in Triton's CPU interpreter (TRITON_INTERPRET=1), FP8 pool included. The Mamba
copy-on-write fence is plain Python: it is called with a recording transfer
counter and pool, so the order of the wait and the copy is observed, not grepped.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import cpu_stub

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402


def qsa_gather() -> dict:
    """Strided (page-aligned) gather from an FP8 pool into a NaN-poisoned BF16 scratch."""
    from sglang.srt.layers.attention.qsa import sparse_attn as sa

    heads, dim, page, topk, batch = 2, 16, 4, 6, 2
    stride = -(-topk // page) * page
    gen = torch.Generator().manual_seed(0)
    k = (torch.randn(32, heads, dim, generator=gen) * 4).to(torch.float8_e4m3fn)
    v = (torch.randn(32, heads, dim, generator=gen) * 4).to(torch.float8_e4m3fn)
    req_to_token = torch.randperm(64, generator=gen).to(torch.int32).reshape(2, 32) % 32
    req_indices = torch.tensor([1, 0], dtype=torch.int32)
    seq_lens = torch.tensor([20, 3], dtype=torch.int32)
    indices = torch.tensor([[0, 5, 7, 19, -1, -1], [0, 2, -1, -1, -1, -1]], dtype=torch.int32)
    cu = torch.arange(batch + 1, dtype=torch.int32) * stride
    out_k = torch.full((batch * stride, heads, dim), float("nan"), dtype=torch.bfloat16)
    out_v = out_k.clone()
    sa.qwen_sparse_kv_extraction_compact_triton(
        k, v, req_to_token, req_indices, indices, seq_lens, cu, out_k, out_v, batch, topk, zero_fill_cols=stride
    )
    rows_ok, pad_zero = True, True
    for b in range(batch):
        valid = [int(p) for p in indices[b] if 0 <= p < seq_lens[b]]
        slots = req_to_token[req_indices[b], valid].long()
        base = b * stride
        for out, pool in ((out_k, k), (out_v, v)):
            rows_ok &= torch.equal(out[base : base + len(valid)], pool[slots].to(torch.bfloat16))
            pad_zero &= bool((out[base + len(valid) : base + stride] == 0).all())
    return {"rows_match_fp8_to_bf16": rows_ok, "padding_zero": pad_zero, "nan_left": bool(out_k.isnan().any())}


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []


def mamba_cow_fence() -> dict:
    """HybridReqToTokenPool.copy_mamba_state with a HiCache load in flight (consumer set) and without."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    out = {}
    for case, consumer in (("load_in_flight", 0), ("no_load", -1)):
        rec = _Recorder()
        pool = object.__new__(HybridReqToTokenPool)
        pool.__dict__.update(
            start_layer=0,
            mamba_map={1: 0, 3: 1, 6: 2},  # model layer -> mamba pool layer; 6 is the last Mamba layer
            layer_transfer_counter=SimpleNamespace(
                consumer_index=consumer, wait_until=lambda i, r=rec: r.calls.append(("wait_until", i))
            ),
            mamba_pool=SimpleNamespace(copy_from=lambda s, d, r=rec: r.calls.append(("copy_from", s.tolist()))),
        )
        pool.copy_mamba_state(torch.tensor([4]), torch.tensor([5]))
        out[case] = rec.calls
    return out


def read_side_waits() -> dict:
    """HybridReqToTokenPool's read accessors during a HiCache load: each waits for its layer before reading.

    Per accessor, the recorded order of ``wait_until(layer)`` and the read itself. The n-gram context is read
    once before the layer loop and rides the first Mamba layer's transfer, so it waits for that layer.
    """
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    rec = _Recorder()
    pool = object.__new__(HybridReqToTokenPool)
    pool.__dict__.update(
        start_layer=0,
        mamba_map={1: 0, 3: 1, 6: 2},
        layer_transfer_counter=SimpleNamespace(
            consumer_index=0, wait_until=lambda i, r=rec: r.calls.append(("wait_until", i))
        ),
        mamba_pool=SimpleNamespace(mamba2_layer_cache=lambda i, r=rec: r.calls.append(("read_mamba", i))),
        short_conv_pool=SimpleNamespace(layer_cache=lambda i, r=rec: r.calls.append(("read_short_conv", i))),
        ngram_pool=SimpleNamespace(get_context=lambda idx, r=rec: r.calls.append(("read_ngram", idx.tolist()))),
    )
    out = {}
    for name, call in (
        ("mamba2_layer_cache", lambda: pool.mamba2_layer_cache(3)),
        ("short_conv_layer_cache", lambda: pool.short_conv_layer_cache(4)),
        ("get_ngram_context", lambda: pool.get_ngram_context(torch.tensor([2]))),
    ):
        rec.calls.clear()
        call()
        out[name] = list(rec.calls)
    return out


class _Rows(list):
    """A pool's per-layer buffer list that records which layer is read."""

    def __init__(self, name: str, rec: _Recorder) -> None:
        super().__init__()
        self.name, self.rec = name, rec

    def __getitem__(self, layer: int) -> torch.Tensor:
        self.rec.calls.append((self.name, layer))
        return torch.zeros(1, dtype=torch.bfloat16)


def kv_read_waits() -> dict:
    """The KV pools' read accessors during a HiCache load: each waits for its layer before reading.

    The model's pool is ``QSATokenToKVPool`` (a ``HybridLinearKVPool``) around a plain ``MHATokenToKVPool``; the
    counter is registered the runtime's way (``register_layer_transfer_counter``, which clears the inner pool's).
    Pipeline stage starting at layer 2 (waits are for ``layer - start_layer``), full-attention layers 3 and 7
    (inner pool rows 0 and 1), so the wait index, the model layer and the inner row all differ. The plain pool
    (a non-hybrid model's) is read at layer 3 with its own counter.
    """
    from sglang.srt.mem_cache import memory_pool as mp
    from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool

    rec = _Recorder()
    counter = SimpleNamespace(consumer_index=0, wait_until=lambda i: rec.calls.append(("wait_until", i)))

    def plain(start_layer: int) -> mp.MHATokenToKVPool:
        pool = object.__new__(mp.MHATokenToKVPool)
        pool.__dict__.update(
            start_layer=start_layer, layer_transfer_counter=None, quant_method=mp.UnquantizedKVCacheMethod(),
            dtype=torch.bfloat16, store_dtype=torch.bfloat16, k_buffer=_Rows("read_k", rec),
            v_buffer=_Rows("read_v", rec),
        )  # fmt: skip
        return pool

    mha = plain(2)
    mha.register_layer_transfer_counter(counter)
    qsa = object.__new__(QSATokenToKVPool)
    qsa.__dict__.update(
        start_layer=2, layer_transfer_counter=None, full_attention_layer_id_mapping={3: 0, 7: 1},
        full_kv_pool=plain(0), qsa_compressed_k_buffer_pool=_Rows("read_qsa_compressed_k", rec),
    )  # fmt: skip
    qsa.full_kv_pool.register_layer_transfer_counter(counter)  # whatever it had, the wrapper's registration decides
    qsa.register_layer_transfer_counter(counter)
    out = {}
    for name, call in (
        ("MHATokenToKVPool.get_key_buffer", lambda: mha.get_key_buffer(3)),
        ("MHATokenToKVPool.get_value_buffer", lambda: mha.get_value_buffer(3)),
        ("MHATokenToKVPool.get_kv_buffer", lambda: mha.get_kv_buffer(3)),
        ("QSATokenToKVPool.get_key_buffer", lambda: qsa.get_key_buffer(7)),
        ("QSATokenToKVPool.get_value_buffer", lambda: qsa.get_value_buffer(7)),
        ("QSATokenToKVPool.get_kv_buffer", lambda: qsa.get_kv_buffer(7)),
        ("QSATokenToKVPool.get_qsa_compressed_k_buffer", lambda: qsa.get_qsa_compressed_k_buffer(7)),
    ):
        rec.calls.clear()
        try:
            call()
            out[name] = list(rec.calls)
        except Exception as exc:  # one broken accessor must not hide the others
            out[name] = {"error": repr(exc)}
    return out


def draft_load_layers() -> dict:
    """HybridCacheController._l2_load_transfers: on which target layer's step each packed MTP draft is loaded.

    The draft pools get no layer counter (only page-interleaved pools register one), so their reads rely on
    the draft loads being issued within the target's layer loop, before the target's final layer event, which
    the target forward waits on (stream order) before the draft forward runs. A 4-layer target, two drafts
    packed behind it on the host (host layers 4 and 5): per draft, the transfer steps that load it and the
    host layer it reads.
    """
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    layers, drafts = 4, ("draft0", "draft1")
    entry = SimpleNamespace(
        host_pool="host", device_pool="target", packed_draft_device_pools=drafts,
        layer_mapper=lambda i: i if 0 <= i < layers + len(drafts) else None,
    )  # fmt: skip
    ctl = object.__new__(HybridCacheController)
    ctl.__dict__.update(
        transfer_layer_id_max=layers, mem_pool_host=SimpleNamespace(anchor_entry=entry, entry_map={"kv": entry})
    )
    idx = torch.arange(2)
    out = {}
    for t in ctl._l2_load_transfers(idx, idx):
        if t.is_draft:
            steps = [i for i in range(layers) if t.layer_mapper(i) is not None]
            out[t.device_pool] = {"steps": steps, "host_layers": [t.layer_mapper(i) for i in steps]}
    return out


def run(fn) -> object:
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc(limit=6)}


if __name__ == "__main__":
    probes = (qsa_gather, mamba_cow_fence, read_side_waits, kv_read_waits, draft_load_layers)
    print(json.dumps({fn.__name__: run(fn) for fn in probes}))
