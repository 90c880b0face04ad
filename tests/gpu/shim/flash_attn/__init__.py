"""STAND-IN for the `flash_attn` package (FA2), used only by the engine run (tests/gpu/run_engine.py).

On an SM90 GPU, QSA's paged sparse attention (decode and MTP target-verify rows,
`QwenSparseAttnBackend._forward_paged_attention`) ends in `from flash_attn import flash_attn_varlen_func` (FA2) or
flash-attn-4 (FA4 cute). The runtime image installs FA4 from the lock; neither FA2 nor FA4 (its CUTLASS DSL is
97 MB of wheels and JIT-compiles on first use) is carried to the GPU machine. This module is only a name: it
answers that one call with a real flash-attention kernel when one is there, sglang-kernel's own FA3 build for
Hopper (`sgl_kernel.flash_attn.flash_attn_varlen_func`, `flash_ops.abi3.so`, same arguments), and otherwise with
the runtime's own Triton kernel for the same rows (`sparse_gqa_packed_decode_triton`, the backend's ROCm path,
fed as the backend feeds it there; `QHC_FLASH_ATTN=triton` in the server's environment picks it even where FA3
is, a diagnostic of which kernel the decode's repeatability depends on). Stricter than FA2: anything but one
query per row raises. The first call prints which kernel answered (the run's report quotes that line from the
server log).
"""

from __future__ import annotations

import contextlib
import os
import sys

__version__ = "0.0.0+qwen-hicache-engine-run-stand-in"
_USED: list[str] = []


def _say(kernel: str) -> None:
    if not _USED:
        _USED.append(kernel)
        print(f"qwen-hicache flash_attn stand-in: QSA paged attention through {kernel}", file=sys.stderr, flush=True)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, **kwargs):  # fmt: skip
    if max_seqlen_q != 1 or kwargs:
        raise NotImplementedError(f"stand-in flash_attn: max_seqlen_q={max_seqlen_q}, extra {sorted(kwargs)}")
    fa3 = None
    if os.environ.get("QHC_FLASH_ATTN") != "triton":  # triton: a diagnostic, the runtime's own kernel even with FA3
        with contextlib.suppress(ImportError):
            from sgl_kernel.flash_attn import flash_attn_varlen_func as fa3
    if fa3 is not None:
        _say("sgl_kernel FA3 (flash_ops.abi3.so)")
        out = fa3(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                  softmax_scale=softmax_scale, causal=causal)  # fmt: skip
        return out[0] if isinstance(out, tuple) else out
    import torch
    from sglang.srt.layers.attention.qsa.sparse_attn import sparse_gqa_packed_decode_triton

    _say("the runtime's Triton sparse_gqa_packed_decode_triton (FA3 not present)")
    batch = cu_seqlens_q.numel() - 1
    valid = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    rel = torch.arange(max_seqlen_k, dtype=torch.int32, device=q.device).expand(batch, -1)
    rel = rel.masked_fill(rel >= valid[:, None], -1).contiguous()
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return sparse_gqa_packed_decode_triton(q.contiguous(), k, v, rel, cu_seqlens_q, cu_seqlens_k, valid, scale)
