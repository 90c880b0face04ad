"""Run QSA's MTP shared-index lookup and the packed gather it feeds, as they sit in one SGLang tree, on CPU; print
JSON.

``python mtp_index_share_probe.py TREE``. The draft's decode step asks
``QSAMTPSharedSparseIndices.lookup`` for its row (the draft-extend selection, frozen, plus the positions drafted
since) and the packed path of ``QwenSparseAttnBackend._forward_paged_attention`` (Hopper's) counts the row's valid
entries (``qwen_sparse_fa2_cu_seqlens_triton``) and gathers that many leading columns into the scratch
(``qwen_sparse_kv_extraction_compact_triton``), both Triton kernels run here in Triton's CPU interpreter. The
scratch is NaN-poisoned first (rows nothing writes this step hold what an earlier request left), so what the
draft's attention would read is observed, not inferred.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import cpu_stub

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402


def draft_step(selected: int, width: int, drafted: int) -> dict:
    """One request whose frozen selection holds `selected` positions (0..selected-1, the expansion's valid-first
    row, -1 after) in a row `width` wide, captured at `selected`, the draft `drafted` positions past it."""
    from sglang.srt.layers.attention.qsa import sparse_attn as sa
    from sglang.srt.layers.attention.qwen_sparse_attn_backend import QSAMTPSharedSparseIndices

    tail_width, heads, dim, pool_tokens = 4, 2, 16, 64
    state = QSAMTPSharedSparseIndices(layer_ids=[3], num_requests=2, token_topk=width, tail_width=tail_width,
                                      device="cpu")  # fmt: skip
    frozen = torch.full((1, width), -1, dtype=torch.int32)
    frozen[0, :selected] = torch.arange(selected, dtype=torch.int32)
    req = torch.tensor([1], dtype=torch.int32)
    state.capture(frozen, req, torch.tensor([selected], dtype=torch.int32), layer_id=3)
    row = state.lookup(req, torch.tensor([selected + drafted - 1]), layer_id=3).to(torch.int32).contiguous()
    length = selected + drafted  # the draft step's sequence length
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(pool_tokens, heads, dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(pool_tokens, heads, dim, generator=gen).to(torch.bfloat16)
    req_to_token = torch.zeros(2, pool_tokens, dtype=torch.int32)
    req_to_token[1] = torch.randperm(pool_tokens, generator=gen).to(torch.int32)
    seq_lens = torch.tensor([length], dtype=torch.int32)
    topk = row.shape[1]
    counts, cu = torch.empty(1, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    sa.qwen_sparse_fa2_cu_seqlens_triton(seq_lens, row, counts, cu, 1, topk)
    out_k = torch.full((topk, heads, dim), float("nan"), dtype=torch.bfloat16)
    out_v = out_k.clone()
    sa.qwen_sparse_kv_extraction_compact_triton(k, v, req_to_token, req, row, seq_lens, cu, out_k, out_v, 1, topk)
    n = int(counts[0])
    want = req_to_token[1, :length].long()  # every visible position: the selection and the drafted tail
    packed = out_k[:n]
    return {
        "row": [int(x) for x in row[0]],
        "valid_count": n,
        "visible": length,
        "stale_rows": int(packed.isnan().any(dim=(1, 2)).sum()),
        "rows_are_the_visible_positions": n == length and torch.equal(packed, k[want]) and torch.equal(
            out_v[:n], v[want]),
        "drafted_positions_packed": sum(any(torch.equal(out_k[i], k[req_to_token[1, p]]) for i in range(n))
                                        for p in range(selected, length)),
    }  # fmt: skip


def main() -> None:
    cases = {"short_selection": (10, 16, 2), "full_selection": (16, 16, 2), "no_draft_yet": (10, 16, 1)}
    out = {}
    for name, args in cases.items():
        try:
            out[name] = draft_step(*args)
        except Exception as e:  # noqa: BLE001 - reported, the test names it
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
