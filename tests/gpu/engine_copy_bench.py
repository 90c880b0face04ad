"""Host->GPU copy through the io backend the operator renders (`--hicache-io-backend kernel`, `page_first`),
against the pinned-copy limit, in the same process (run by tests/gpu/run_engine.py; prints one JSON line).

The copy is the call the runtime's host pool makes for that backend and layout
(`MHATokenToKVPoolHost.load_to_device_per_layer`, pool_host/mha.py: `sgl_kernel.kvcacheio.transfer_kv_per_layer_pf_lf`
with `item_size = token_stride_size`, `src_layout_dim = token_stride_size * layer_num`), one call per layer, on
Flash-Next's per-rank KV shape at TP 2 (13 layers x 1 KV head x 256, FP8: 256 B per token and layer, K and V),
512 random 64-token pages. The limit is one 1 GiB contiguous pinned host->device copy. CUDA events, median of 5.

Where the runtime's JIT kernels build (a CUDA toolchain: the image's nvcc wheels, CUDA_HOME set by run_engine.py), the
pool does not call sgl_kernel at all: `MHATokenToKVPoolHost` sets `can_use_jit` from
`can_use_hicache_jit_kernel(page_size, element_size)` and then calls `transfer_hicache_one_layer` on its page_first
per-layer views (`k_buffer.transpose(0, 1)[layer]`), through the TMA kernel where `use_hicache_tma_kernel` allows it
(rows per TMA chunk must divide the page). That path is measured too, at the rendered page size (64) and at 128, each
with the kernel the runtime's own predicates choose.
"""

from __future__ import annotations

import json
import statistics

import torch


def _time(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> None:
    layers, item, page, pages = 13, 256, 64, 512
    host_tokens, dev_tokens = 1 << 17, 1 << 17
    g = torch.Generator().manual_seed(0)
    src_k = torch.randint(0, 255, (host_tokens, layers, item), dtype=torch.uint8, generator=g).pin_memory()
    src_v = torch.randint(0, 255, (host_tokens, layers, item), dtype=torch.uint8, generator=g).pin_memory()
    dst_k = [torch.zeros(dev_tokens, item, dtype=torch.uint8, device="cuda") for _ in range(layers)]
    dst_v = [torch.zeros(dev_tokens, item, dtype=torch.uint8, device="cuda") for _ in range(layers)]
    hp = torch.randperm(host_tokens // page, generator=g)[:pages]
    dp = torch.randperm(dev_tokens // page, generator=g)[:pages]
    ar = torch.arange(page)
    src_idx = (hp[:, None] * page + ar).reshape(-1).cuda()
    dst_idx = (dp[:, None] * page + ar).reshape(-1).cuda()
    moved = 2 * layers * item * page * pages
    big = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    limit_gbps = (1 << 30) / _time(lambda: dev.copy_(big, non_blocking=True)) / 1e9
    out = {"ran": True, "bytes": moved, "limit_gbps": round(limit_gbps, 2), **_sgl_kernel(
        src_k, src_v, dst_k, dst_v, src_idx, dst_idx, moved, limit_gbps)}  # fmt: skip
    out["jit"] = {str(n): _jit(src_k, src_v, dst_k, dst_v, src_idx, dst_idx, n, moved, limit_gbps) for n in (64, 128)}
    print(json.dumps(out))


def _sgl_kernel(src_k, src_v, dst_k, dst_v, src_idx, dst_idx, moved: int, limit_gbps: float) -> dict:
    """sgl_kernel's transfer (the host pool's fallback where the JIT kernels do not build), where it is installed."""
    try:
        from sgl_kernel.kvcacheio import transfer_kv_per_layer_pf_lf
    except Exception as err:  # noqa: BLE001 - a run with the machine's own torch carries no sgl_kernel
        return {"kernel_gbps": None, "why": f"sgl_kernel: {err!r}"[:200]}
    layers, item = src_k.shape[1], src_k.shape[-1]

    def kernel():
        for layer in range(layers):
            transfer_kv_per_layer_pf_lf(src_k=src_k, dst_k=dst_k[layer], src_v=src_v, dst_v=dst_v[layer],
                                        src_indices=src_idx, dst_indices=dst_idx, layer_id=layer, item_size=item,
                                        src_layout_dim=item * layers)  # fmt: skip

    kernel()
    torch.cuda.synchronize()
    t0 = src_idx[:5].cpu()
    ok = all(torch.equal(dst_k[3][dst_idx[i]].cpu(), src_k[t0[i], 3]) for i in range(5))
    gbps = moved / _time(kernel) / 1e9
    return {"correct": ok, "kernel_gbps": round(gbps, 2), "ratio": round(gbps / limit_gbps, 3),
            "what": "sgl_kernel.kvcacheio.transfer_kv_per_layer_pf_lf, 13 layers x 512 pages x 64 tokens x 256 B, "
                    "K and V, vs one 1 GiB pinned copy"}  # fmt: skip


def _jit(src_k, src_v, dst_k, dst_v, src_idx, dst_idx, page: int, moved: int, limit_gbps: float) -> dict:
    """The runtime's JIT path as the host pool calls it for page_first at this page size (the same tokens, regrouped
    into pages of `page`): which kernel its predicates pick, whether the bytes arrive, and the throughput."""
    try:
        from sglang.kernels.ops.kvcache import hicache
    except Exception as err:  # noqa: BLE001 - reported, not fatal: the sgl_kernel figure stands on its own
        return {"ran": False, "why": f"import: {err!r}"[:300]}
    item, layers = src_k.shape[-1], src_k.shape[1]
    try:
        usable = hicache.can_use_hicache_jit_kernel(page_size=page, element_size=item)
        tma = usable and hicache.use_hicache_tma_kernel(element_size=item, block_quota=hicache.TMA_BLOCK_QUOTA,
                                                        page_size=page)  # fmt: skip
    except Exception as err:  # noqa: BLE001
        return {"ran": False, "why": f"can_use_hicache_jit_kernel: {err!r}"[:300]}
    if not usable:
        return {"ran": False, "why": "can_use_hicache_jit_kernel is False (the runtime logs why)"}
    g = torch.Generator().manual_seed(1)
    n = src_idx.numel() // page
    hp = torch.randperm(src_k.shape[0] // page, generator=g)[:n]
    dp = torch.randperm(dst_k[0].shape[0] // page, generator=g)[:n]
    ar = torch.arange(page)
    s_idx = (hp[:, None] * page + ar).reshape(-1).cuda()
    d_idx = (dp[:, None] * page + ar).reshape(-1).cuda()
    k_refs, v_refs = src_k.transpose(0, 1), src_v.transpose(0, 1)  # the pool's page_first per-layer views

    def kernel():
        for layer in range(layers):
            hicache.transfer_hicache_one_layer(page_size=page, k_cache_dst=dst_k[layer], v_cache_dst=dst_v[layer],
                                               k_cache_src=k_refs[layer], v_cache_src=v_refs[layer],
                                               indices_dst=d_idx, indices_src=s_idx, element_dim=item)  # fmt: skip

    kernel()
    torch.cuda.synchronize()
    rows = s_idx[: 3 * page : page // 2].cpu(), d_idx[: 3 * page : page // 2].cpu()
    ok = all(torch.equal(dst_v[5][d].cpu(), src_v[s, 5]) for s, d in zip(*rows, strict=True))
    gbps = moved / _time(kernel) / 1e9
    return {"ran": True, "correct": ok, "tma": bool(tma), "gbps": round(gbps, 2), "ratio": round(gbps / limit_gbps, 3),
            "what": f"sglang.kernels.ops.kvcache.hicache.transfer_hicache_one_layer, page {page}"}


if __name__ == "__main__":
    main()
