"""STAND-IN for the `flash_attn` package (FA2), used only by the engine run (tests/gpu/run_engine.py).

On an SM90 GPU, QSA's paged sparse attention (decode and MTP target-verify rows,
`QwenSparseAttnBackend._forward_paged_attention`) ends in `flash_attn_varlen_func` over the gathered keys, from
FA2 or flash-attn-4 (FA4 cute). Neither is carried to the GPU machine (FA2 is not in the runtime lock; FA4 needs
the CUTLASS DSL, 97 MB of wheels, and JIT-compiles on first use). This module answers that one call with the
runtime's own Triton kernel for the same rows, `sparse_gqa_packed_decode_triton` (the path the backend takes on
ROCm), fed exactly as the backend feeds it there. It is stricter than FA2: anything but one query per row
(`max_seqlen_q == 1`, the only shape the backend sends) raises.
"""

from __future__ import annotations

__version__ = "0.0.0+qwen-hicache-engine-run-stand-in"


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, **kwargs):  # fmt: skip
    import torch
    from sglang.srt.layers.attention.qsa.sparse_attn import sparse_gqa_packed_decode_triton

    if max_seqlen_q != 1 or kwargs:
        raise NotImplementedError(f"stand-in flash_attn: max_seqlen_q={max_seqlen_q}, extra {sorted(kwargs)}")
    batch = cu_seqlens_q.numel() - 1
    valid = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    rel = torch.arange(max_seqlen_k, dtype=torch.int32, device=q.device).expand(batch, -1)
    rel = rel.masked_fill(rel >= valid[:, None], -1).contiguous()
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return sparse_gqa_packed_decode_triton(q.contiguous(), k, v, rel, cu_seqlens_q, cu_seqlens_k, valid, scale)
