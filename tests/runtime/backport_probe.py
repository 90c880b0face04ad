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


def run(fn) -> object:
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc(limit=6)}


if __name__ == "__main__":
    print(json.dumps({fn.__name__: run(fn) for fn in (qsa_gather, mamba_cow_fence, read_side_waits)}))
