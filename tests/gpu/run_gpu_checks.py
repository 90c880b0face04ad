#!/usr/bin/env python3
"""Focused GPU checks of the pinned runtime (sglang 0.5.23 + runtime_patches/) on one CUDA GPU.

    python3 tests/gpu/run_gpu_checks.py [--sglang-site DIR | --sglang-wheel WHL] [--out DIR]

Without --sglang-site the pinned wheel (``.whl/runtime/``, then ``~/.cache/qwen-hicache/wheels/``)
is unpacked into --work and patched with ``runtime_patches/verify.py --tree --apply``.
The runtime's Python dependencies must be importable (see tests/gpu/README.md); ``sgl_kernel``
(sglang-kernel, which links torch 2.14.1) is replaced by a stub whose every function raises,
so no check can pass through it silently. Each check runs in its own interpreter and reports
PASS, FAIL or CANNOT-RUN (with the reason); CONTROL rows show that a check can fail (the
runtime's fix removed, the test must see the fault); MEASURED rows are benchmark numbers.

Checks:
  1  QSA paged sparse-decode gather (qwen_sparse_kv_extraction_compact_triton, strided/zero-fill
     layout): poisoned scratch past valid rows comes back zero, element offsets past 2^31 are right,
     FP8 pool values come back as the exact BF16 values; float64 torch reference.
  2  QSA compressed-key gather for short cached extensions (QSAIndexer.update_key_state_and_compress,
     extend plan from QwenSparseAttnBackend._qsa_write_plan): 1-3 rows read nothing out of range
     (torch's bounds-checked gather, plus compute-sanitizer memcheck when present); 4, 5, 8 rows
     match the reference; CONTROL: the clamp removed, the 1-row case must fault.
  3  Router with bias (moe_fused_gate, Triton router with PDL): bias written by the kernel launched
     just before (which releases its dependents early) gives the torch reference's ids and weights;
     CONTROL: the router's gdc_wait removed, the stale bias must show.
  4  Restore ordering (HiCacheController.start_loading + L2TransferEngine, real streams/events): an
     H2D page load issued while a forward on the forward stream still writes the same pages ends
     with the restored data with load_fence_stream set, and is detected as corrupted without it.
  5  Restore ceiling: pinned host->device copies of 64-token page-first pages (Qwen3.8-Flash-Next
     per rank at TP2: KV + QSA index pages + one Mamba slot) against one large contiguous pinned copy.
  6  GDN interior-boundary state snapshot (patch 0005): a varlen prefill of k*grid tokens through the
     runtime's chunk_gated_delta_rule, the tracked h row chosen and copied by the backend's own
     _init_track_ssm_indices / _track_mamba_state_extend at the replay boundary (k-1)*grid, equals the
     final state of a separate prefill of exactly that prefix (and a float64 recurrence); the conv
     window from _init_track_conv_indices equals causal_conv1d_fn's state after the prefix.
     CONTROL: h one chunk off and the whole prompt's final state must not match.

Exit status: 0 all PASS, 1 any FAIL, 2 no FAIL but something CANNOT-RUN.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
import types
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "runtime_patches"
WHEEL_NAME = "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
CHECKS = ("1", "2", "3", "4", "5", "6")
TITLES = {
    "1": "QSA paged sparse-decode gather",
    "2": "QSA compressed-key gather, short extensions",
    "3": "Router with kernel-produced bias (PDL)",
    "4": "Restore ordering (load_fence_stream)",
    "5": "Restore ceiling H2D (Flash-Next pages)",
    "6": "GDN interior-boundary state snapshot (patch 0005)",
}


# ----------------------------------------------------------------------------------------------
# import guards (worker side)
# ----------------------------------------------------------------------------------------------


class SglKernelUnavailable(RuntimeError):
    pass


SGL_KERNEL_BOUND: list[str] = []


# sgl_kernel is absent on a machine without torch 2.14.1. The runtime guards most of its uses
# (ImportError -> fallback), but some modules import names from it unconditionally on CUDA. Only those
# submodules/names are served, and every function served raises when called; anything else stays
# an ImportError, exactly as if the package were absent.
STUB_SUBMODULES = {"sgl_kernel.kvcacheio", "sgl_kernel.quantization"}
STUB_TOP_NAMES: set[str] = {
    "top_k_renorm_prob",  # srt/layers/sampler.py (check 6's import chain: backend -> model_runner)
    "top_p_renorm_prob",
    "int8_scaled_mm",
    "moe_sum_reduce",
    "moe_sum",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "silu_and_mul",
}


class _RaisingModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__") or (self.__name__ == "sgl_kernel" and name not in STUB_TOP_NAMES):
            raise AttributeError(name)
        qual = f"{self.__name__}.{name}"
        SGL_KERNEL_BOUND.append(qual)

        def _unavailable(*args, **kwargs):
            raise SglKernelUnavailable(f"{qual} called, but sgl_kernel is not installed (stub)")

        _unavailable.__name__ = name
        _unavailable.__qualname__ = qual
        return _unavailable


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.roots or fullname in STUB_SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in self.roots)
        return None

    def create_module(self, spec):
        return _RaisingModule(spec.name)

    def exec_module(self, module):
        pass


def setup_imports(site: Path) -> dict:
    info = {}
    stubs = set()
    for name in ("sgl_kernel",):
        if importlib.util.find_spec(name) is None:
            stubs.add(name)
    if stubs:
        sys.meta_path.insert(0, _StubFinder(stubs))
    info["stubbed"] = sorted(stubs)
    sys.path.insert(0, str(site))
    import logging

    logging.disable(logging.WARNING)
    return info


def import_or_cannot(modname: str):
    try:
        return importlib.import_module(modname)
    except Exception as exc:  # an environment that cannot load the module: the check did not run
        traceback.print_exc()
        raise CannotRun(f"import {modname}: {type(exc).__name__}: {str(exc)[:300]}") from exc


class CannotRun(Exception):
    pass


def row(rid: str, name: str, status: str, detail: str) -> dict:
    return {"id": rid, "name": name, "status": status, "detail": detail}


# ----------------------------------------------------------------------------------------------
# check 1: QSA paged sparse-decode gather
# ----------------------------------------------------------------------------------------------


def _fill_random(t, seed: int, chunk: int = 1 << 20):
    import torch

    g = torch.Generator(device=t.device).manual_seed(seed)
    flat = t.view(t.shape[0], -1)
    for s in range(0, flat.shape[0], chunk):
        part = flat[s : s + chunk]
        part.copy_((torch.randn(part.shape, generator=g, device=t.device) * 3).to(t.dtype))


def _gather_case(gather, *, name, pool_tokens, heads, dim, pool_dtype, batch, topk, page, high, seed):
    import torch

    dev = "cuda"
    torch.manual_seed(seed)
    k = torch.empty(pool_tokens, heads, dim, dtype=pool_dtype, device=dev)
    v = torch.empty_like(k)
    _fill_random(k, seed)
    _fill_random(v, seed + 1)
    width = 8192
    seq_lens = torch.randint(topk // 2, width, (batch,), dtype=torch.int32)
    seq_lens[0] = width  # one full-length row
    # Slots: unique per (request, position); high=True puts most of them past 2^31 elements.
    need = batch * width
    threshold = (1 << 31) // (heads * dim) + 1
    if high:
        lo = max(threshold, pool_tokens - 4 * need)
        assert pool_tokens - lo >= need, "pool too small for the high-slot case"
        high_part = torch.randperm(pool_tokens - lo)[: need - 64] + lo
        low_part = torch.randperm(min(threshold, 1 << 20))[:64]  # a few low slots mixed in
        slots = torch.cat([high_part, low_part])[torch.randperm(need)]
    else:
        slots = torch.randperm(pool_tokens)[:need]
    req_pool_rows = batch + 3
    req_to_token = torch.zeros(req_pool_rows, width, dtype=torch.int32)
    req_indices = torch.randperm(req_pool_rows)[:batch].to(torch.int32)
    req_to_token[req_indices.long()] = slots.view(batch, width).to(torch.int32)
    # Each row: valid positions first (the layout expand_qsa_block_indices produces), then -1,
    # with a few positions >= the row's length that the kernel must treat as invalid.
    indices = torch.full((batch, topk), -1, dtype=torch.int32)
    valid_counts = []
    for b in range(batch):
        length = int(seq_lens[b])
        count = int(torch.randint(1, min(topk, length) + 1, ()).item()) if b else min(topk, length)
        pos = torch.randperm(length)[:count].sort().values
        indices[b, :count] = pos.to(torch.int32)
        if count + 2 < topk and b % 2:
            indices[b, count : count + 2] = torch.tensor([length, length + 5], dtype=torch.int32)
        valid_counts.append(count)
    pages_per_row = (topk + page - 1) // page
    stride = pages_per_row * page
    cu = (torch.arange(batch + 1, dtype=torch.int32) * stride).to(dev)
    extra_rows = 2 * page
    out_k = torch.full((batch * stride + extra_rows, heads, dim), float("nan"), dtype=torch.bfloat16, device=dev)
    out_v = torch.full_like(out_k, float("nan"))
    args = [t.to(dev) for t in (req_to_token, req_indices, indices, seq_lens)]
    torch.cuda.synchronize()
    gather(k, v, args[0], args[1], args[2], args[3], cu, out_k, out_v, batch, topk, zero_fill_cols=stride)
    torch.cuda.synchronize()
    # float64 reference
    idx = indices.long().to(dev)
    lens = seq_lens.long().to(dev)[:, None]
    valid = (idx >= 0) & (idx < lens)
    rt = req_to_token.to(dev).long()
    slot = rt[req_indices.long().to(dev)[:, None], idx.clamp(0, width - 1)]
    ref_k = torch.zeros(batch, stride, heads, dim, dtype=torch.float64, device=dev)
    ref_v = torch.zeros_like(ref_k)
    ref_k[:, :topk][valid] = k[slot[valid]].double()
    ref_v[:, :topk][valid] = v[slot[valid]].double()
    got_k = out_k[: batch * stride].view(batch, stride, heads, dim).double()
    got_v = out_v[: batch * stride].view(batch, stride, heads, dim).double()
    mism_k = int((got_k != ref_k).flatten(2).any(-1).sum())
    mism_v = int((got_v != ref_v).flatten(2).any(-1).sum())
    nan_inside = int(torch.isnan(got_k).any(-1).any(-1).sum() + torch.isnan(got_v).any(-1).any(-1).sum())
    zero_rows = int((~valid).sum()) + batch * (stride - topk)
    tail_untouched = bool(
        torch.isnan(out_k[batch * stride :].float()).all() and torch.isnan(out_v[batch * stride :].float()).all()
    )
    max_slot = int(slot[valid].max())
    max_elem_offset = max_slot * heads * dim
    ok = mism_k == 0 and mism_v == 0 and nan_inside == 0 and tail_untouched
    detail = (
        f"pool {pool_tokens}x{heads}x{dim} {str(pool_dtype).replace('torch.', '')}->bf16, B={batch} topk={topk} "
        f"stride={stride}; rows valid={sum(valid_counts)} zero-filled={zero_rows}; "
        f"mismatched rows K/V={mism_k}/{mism_v}, "
        f"NaN rows={nan_inside}, scratch past B*stride untouched={tail_untouched}; max element offset "
        f"{max_elem_offset:,} ({'>' if max_elem_offset >= 1 << 31 else '<'} 2^31)"
    )
    del k, v, out_k, out_v
    torch.cuda.empty_cache()
    return ok, detail, max_elem_offset


def check1(ctx) -> list[dict]:
    import torch

    mod = import_or_cannot("sglang.srt.layers.attention.qsa.sparse_attn")
    gather = mod.qwen_sparse_kv_extraction_compact_triton
    rows = []
    page, topk = 64, 2051  # block top-k 512 x ratio 4 + 3 tail tokens, the QSA decode width
    cases = [
        (
            "1a",
            "bf16 pool, poisoned scratch zero-filled",
            dict(pool_tokens=1 << 16, heads=1, dim=256, pool_dtype=torch.bfloat16, batch=6, high=False),
        ),
        (
            "1b",
            "FP8 pool -> BF16 values, zero-fill",
            dict(pool_tokens=1 << 16, heads=1, dim=256, pool_dtype=torch.float8_e4m3fn, batch=6, high=False),
        ),
        (
            "1c",
            "FP8 pool 1x256, offsets past 2^31",
            dict(
                pool_tokens=(1 << 31) // 256 + (1 << 20),
                heads=1,
                dim=256,
                pool_dtype=torch.float8_e4m3fn,
                batch=4,
                high=True,
            ),
        ),
        (
            "1d",
            "bf16 pool 2x256, offsets past 2^31",
            dict(
                pool_tokens=(1 << 31) // 512 + (1 << 20),
                heads=2,
                dim=256,
                pool_dtype=torch.bfloat16,
                batch=4,
                high=True,
            ),
        ),
    ]
    for i, (rid, name, kw) in enumerate(cases):
        try:
            ok, detail, offset = _gather_case(gather, name=name, topk=topk, page=page, seed=100 + i, **kw)
            if kw["high"] and offset < (1 << 31):
                ok, detail = False, detail + " (case did not reach 2^31)"
            rows.append(row(rid, name, "PASS" if ok else "FAIL", detail))
        except Exception as exc:
            rows.append(row(rid, name, "FAIL", f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()
    return rows


# ----------------------------------------------------------------------------------------------
# check 2: compressed-key gather for short cached extensions
# ----------------------------------------------------------------------------------------------


def _indexer_without_clamp(qi_mod):
    """update_key_state_and_compress with the #39446 clamp line removed (CONTROL only)."""
    import inspect
    import textwrap

    src = textwrap.dedent(inspect.getsource(qi_mod.QSAIndexer.update_key_state_and_compress))
    needle = "group_locs = group_locs.clamp_max(source_keys.shape[0] - 1)"
    if needle not in src:
        raise RuntimeError("clamp line not found; control cannot be built")
    src = src.replace(needle, "pass  # clamp removed for the control")
    ns: dict = {}
    exec(compile(src, "<control:update_key_state_and_compress>", "exec"), qi_mod.__dict__, ns)
    return ns["update_key_state_and_compress"]


def _compress_case(qi_mod, backend_cls, pool_cls, n_rows: int, seed: int, no_clamp: bool = False):
    import torch

    dev = os.environ.get("QHC_CHECK2_DEVICE", "cuda")  # "cpu" only for a dry run of the logic
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    ratio, page, heads, dim, prefix = 4, 64, 1, 128, 64
    total = prefix + n_rows
    pages = [5, 2]  # page-aligned allocation, page 0 (the reserved padding slot) unused
    slots = torch.cat([torch.arange(p * page, (p + 1) * page) for p in pages])[:total]
    table = torch.zeros(1, 2 * page, dtype=torch.int32, device=dev)
    table[0, :total] = slots.to(torch.int32).to(dev)
    lengths = torch.tensor([total], device=dev)
    ext = torch.tensor([n_rows], device=dev)
    prefix_lens = (lengths - ext).clamp_min(0)
    capacity = n_rows // ratio + 1  # _qsa_build_write_plan: tokens // ratio + rows
    write_locs, group_end, _rows, member_rows = backend_cls._qsa_write_plan(
        token_slot_table=table,
        start_blocks=prefix_lens // ratio,
        end_blocks=lengths // ratio,
        capacity=capacity,
        compress_ratio=ratio,
        row_token_starts=torch.cumsum(ext, 0) - ext,
        prefix_lens=prefix_lens,
    )
    g = torch.Generator(device=dev).manual_seed(seed)
    token_k = torch.randn(n_rows, heads, dim, generator=g, device=dev).to(torch.bfloat16)
    positions = torch.arange(prefix, total, device=dev)
    sentinel = 77.0
    comp = torch.full((8 * page // ratio, heads, dim), sentinel, dtype=torch.bfloat16, device=dev)

    class _Pool:
        def get_qsa_compressed_k_buffer(self, layer_id):
            return comp

    pool = _Pool()
    pool.set_qsa_compressed_k_buffer = types.MethodType(pool_cls.set_qsa_compressed_k_buffer, pool)
    import torch.nn as nn

    indexer = qi_mod.QSAIndexer.__new__(qi_mod.QSAIndexer)
    nn.Module.__init__(indexer)
    indexer.layer_id = 0
    indexer.compress_ratio = ratio
    indexer.index_head_dim = dim
    indexer.rotary_emb = types.SimpleNamespace(mrope_section=None)
    # Norm + RoPE are not under test here: identity, so the stored value is the group mean.
    indexer.normalize_compressed_keys = lambda keys, pos: keys
    meta = types.SimpleNamespace(
        token_to_kv_pool=pool,
        compress_member_rows=member_rows,
        is_cuda_graph=False,
        write_locs=write_locs,
        compress_group_positions=group_end,
        extend_rope_matrix=None,
    )
    fn = indexer.update_key_state_and_compress
    if no_clamp:
        fn = types.MethodType(_indexer_without_clamp(qi_mod), indexer)
    sync()
    fn(token_k, positions, positions, meta, state_stored=True)
    sync()
    # reference: every complete group of this extension, float64 mean -> bf16
    groups = n_rows // ratio
    expect = {}
    for gi in range(groups):
        block = prefix // ratio + gi
        loc = int(slots[block * ratio]) // ratio
        expect[loc] = token_k[gi * ratio : (gi + 1) * ratio].double().mean(0)
    bad = []
    for loc, ref in expect.items():
        got = comp[loc].double()
        if not torch.allclose(got, ref.to(torch.bfloat16).double(), rtol=2**-7, atol=0):
            bad.append(loc)
    changed = set(torch.nonzero((comp.float() != sentinel).flatten(1).any(1)).flatten().tolist())
    stray = sorted(changed - set(expect) - {0})
    return groups, capacity, bad, stray


def check2(ctx) -> list[dict]:
    qi = import_or_cannot("sglang.srt.layers.attention.qsa.qsa_indexer")
    be = import_or_cannot("sglang.srt.layers.attention.qwen_sparse_attn_backend")
    kvp = import_or_cannot("sglang.srt.mem_cache.qsa_kv_pool")
    rows = []
    mode = ctx.get("mode", "main")
    if mode == "control":
        try:
            _compress_case(qi, be.QwenSparseAttnBackend, kvp.QSATokenToKVPool, 1, 7, no_clamp=True)
            import torch

            torch.cuda.synchronize()
            return [
                row(
                    "2ctl",
                    "CONTROL clamp removed, 1 row",
                    "NOT-DETECTED",
                    "ran without a fault: the check could not show it can fail",
                )
            ]
        except Exception as exc:
            msg = str(exc).splitlines()[0][:160]
            return [row("2ctl", "CONTROL clamp removed, 1 row", "DETECTED", f"{type(exc).__name__}: {msg}")]
    sizes = [int(x) for x in (ctx.get("rows") or "1,2,3,4,5,8").split(",")]
    for n in sizes:
        rid = f"2.{n}"
        try:
            groups, capacity, bad, stray = _compress_case(qi, be.QwenSparseAttnBackend, kvp.QSATokenToKVPool, n, 11 + n)
            ok = not bad and not stray
            what = "in range" if n < 4 else "matches reference"
            rows.append(
                row(
                    rid,
                    f"{n} cached-extension row(s): {what}",
                    "PASS" if ok else "FAIL",
                    f"plan capacity {capacity} (padding {capacity - groups}), complete groups {groups}, "
                    f"mismatched {bad}, stray writes {stray}",
                )
            )
        except Exception as exc:
            rows.append(row(rid, f"{n} cached-extension row(s)", "FAIL", f"{type(exc).__name__}: {str(exc)[:200]}"))
            traceback.print_exc()
            break  # a device fault poisons the context
    return rows


# ----------------------------------------------------------------------------------------------
# check 3: router with bias produced by the kernel launched just before
# ----------------------------------------------------------------------------------------------


def _producer_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _write_bias_late(out_ptr, src_ptr, spin, N: tl.constexpr, EARLY: tl.constexpr):
        # Release dependents at once (as a PDL-aware producer may), then write the bias late.
        if EARLY:
            tl.extra.cuda.gdc_launch_dependents()
        offs = tl.arange(0, N)
        x = tl.load(src_ptr + offs)
        acc = x * 0.0 + 1.0
        for _ in range(spin):
            acc = acc * 0.9999999 + 1e-7
        tl.store(out_ptr + offs, tl.where(acc > 1e30, acc, x))

    return _write_bias_late


def _router_reference(scores, bias, topk, groups, topk_group, renorm, scale, apply_scale):
    import torch

    act = torch.sigmoid(scores.double())
    biased = act + bias.double()[None, :]
    if groups > 1:
        m, n = biased.shape
        per = biased.view(m, groups, n // groups)
        gscore = per.topk(2, dim=-1).values.sum(-1)
        keep = gscore.topk(topk_group, dim=-1).indices
        mask = torch.zeros(m, groups, dtype=torch.bool, device=scores.device)
        mask.scatter_(1, keep, True)
        biased = biased.masked_fill(~mask.repeat_interleave(n // groups, 1), float("-inf"))
    ids = biased.topk(topk, dim=-1).indices
    w = act.gather(1, ids)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    if apply_scale:
        w = w * scale
    return w, ids


def _router_trials(gate, producer, shape, trials, spin, seed):
    import torch

    m, n, k, groups, topk_group = shape
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    mism = 0
    for _ in range(trials):
        scores = (torch.randn(m, n, generator=g, device=dev) * 0.5).float()
        stale = torch.zeros(n, device=dev)
        stale[:k] = 5.0  # a stale read would pick experts 0..k-1
        fresh = torch.rand(n, generator=g, device=dev) * 0.01
        pick = torch.randperm(n, generator=g, device=dev)[:k]
        pick = pick[pick >= k][: k // 2]
        fresh[pick] += 5.0
        bias = stale.clone()
        torch.cuda.synchronize()
        producer[(1,)](bias, fresh, spin, N=n, EARLY=True)
        w, ids = gate(
            scores,
            bias,
            k,
            scoring_func="sigmoid",
            renormalize=True,
            routed_scaling_factor=2.5,
            apply_routed_scaling_factor_on_output=False,
            num_expert_group=groups,
            topk_group=topk_group,
        )
        torch.cuda.synchronize()
        rw, rids = _router_reference(scores, fresh, k, groups, topk_group, True, 2.5, False)
        same_ids = torch.equal(ids.long().sort(-1).values, rids.sort(-1).values)
        order = ids.long().argsort(-1)
        rorder = rids.argsort(-1)
        same_w = torch.allclose(w.double().gather(1, order), rw.gather(1, rorder), rtol=1e-5, atol=1e-7)
        if not (same_ids and same_w):
            mism += 1
    return mism


def check3(ctx) -> list[dict]:
    import torch

    mfg = import_or_cannot("sglang.kernels.ops.moe.moe_fused_gate")
    jit_utils = import_or_cannot("sglang.kernels.jit.utils")
    pdl = bool(jit_utils.is_arch_support_pdl())
    producer = _producer_kernel()
    shapes = [(4, 512, 22, 1, 1), (64, 512, 22, 1, 1), (16, 256, 8, 8, 4)]
    trials, spin = 20, 200000
    rows = []
    if ctx.get("mode") == "control":
        src = Path(mfg.__file__).read_text()
        needle = "tl.extra.cuda.gdc_wait()"
        count = src.count(needle)
        path = Path(ctx["work"]) / "qhc_moe_fused_gate_nowait.py"
        path.write_text(src.replace(needle, "pass  # gdc_wait removed for the control"))
        spec = importlib.util.spec_from_file_location("qhc_moe_fused_gate_nowait", path)
        nowait = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nowait)
        total = 0
        for i, shape in enumerate(shapes):
            total += _router_trials(nowait.moe_fused_gate, producer, shape, trials, spin, 300 + i)
        status = "DETECTED" if total else "NOT-DETECTED"
        return [
            row(
                "3ctl",
                "CONTROL router gdc_wait removed",
                status,
                f"{total}/{trials * len(shapes)} trials read a stale bias "
                f"({count} gdc_wait removed; PDL {'on' if pdl else 'off'})",
            )
        ]
    for i, shape in enumerate(shapes):
        m, n, k, groups, tg = shape
        name = f"M={m} E={n} top{k}" + (f" groups {groups}/{tg}" if groups > 1 else "")
        try:
            mism = _router_trials(mfg.moe_fused_gate, producer, shape, trials, spin, 200 + i)
            rows.append(
                row(
                    f"3{'abc'[i]}",
                    name,
                    "PASS" if mism == 0 else "FAIL",
                    f"{trials - mism}/{trials} trials equal the float64 reference (ids, weights rtol 1e-5); "
                    "bias written by the preceding Triton kernel after gdc_launch_dependents; "
                    f"PDL {'on' if pdl else 'off'}",
                )
            )
        except Exception as exc:
            rows.append(row(f"3{'abc'[i]}", name, "FAIL", f"{type(exc).__name__}: {str(exc)[:200]}"))
            traceback.print_exc()
    # a bias produced by a plain torch cast (bf16 -> fp32), the common case in the model
    try:
        dev = "cuda"
        scores = torch.randn(32, 512, device=dev)
        bias16 = (torch.rand(512, device=dev) * 0.2).to(torch.bfloat16)
        bias = bias16.float()
        w, ids = mfg.moe_fused_gate(scores, bias, 22, scoring_func="sigmoid", renormalize=True)
        torch.cuda.synchronize()
        rw, rids = _router_reference(scores, bias, 22, 1, 1, True, 1.0, False)
        ok = torch.equal(ids.long().sort(-1).values, rids.sort(-1).values)
        rows.append(row("3d", "bias from torch cast kernel", "PASS" if ok else "FAIL", f"ids equal reference: {ok}"))
    except Exception as exc:
        rows.append(row("3d", "bias from torch cast kernel", "FAIL", f"{type(exc).__name__}: {exc}"))
    return rows


# ----------------------------------------------------------------------------------------------
# check 4: restore ordering behind the forward stream
# ----------------------------------------------------------------------------------------------


def check4(ctx) -> list[dict]:
    import torch

    cc = import_or_cannot("sglang.srt.managers.cache_controller")
    l2 = import_or_cannot("sglang.srt.mem_cache.l2_transfer")
    try:
        hcc = importlib.import_module("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller")
        inherits = hcc.HybridCacheController.start_loading is cc.HiCacheController.start_loading
    except Exception as exc:  # informational only
        inherits = f"unknown ({type(exc).__name__})"
    dev = torch.device("cuda")
    layers, page, width = 13, 64, 512  # Flash-Next KV: 12 QSA + 1 MTP layer, 512 B/token/layer

    class HostPool:
        layout = "page_first_direct"
        page_size = page

        def __init__(self, tokens):
            self.layer_num = layers
            self.size_per_token = layers * width
            self.buf = torch.empty(layers, tokens, width, dtype=torch.uint8, pin_memory=True)

        def prepare_transfer_indices(self, host_indices, device_indices, io_backend):
            return host_indices, device_indices

        def load_to_device_per_layer_physical(
            self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=False
        ):
            # torch stand-in for sgl_kernel's per-layer transfer: async pinned H2D on the current stream
            h0, d0, n = int(host_indices[0]), int(device_indices[0]), host_indices.numel()
            device_pool.buf[layer_id, d0 : d0 + n].copy_(self.buf[layer_id, h0 : h0 + n], non_blocking=True)

    class DevicePool:
        def __init__(self, tokens):
            self.device = dev
            self.buf = torch.zeros(layers, tokens, width, dtype=torch.uint8, device=dev)

    class Allocator:
        def __init__(self, start):
            self.next = start
            self.events = {}

        def alloc(self, n):
            out = torch.arange(self.next, self.next + n, device=dev)
            self.next += n
            return out

        def set_hicache_transfer_done_event(self, key, event):
            self.events[key] = event

    def trial(fenced: bool, seed: int):
        pages = 32
        n = pages * page
        host, devpool = HostPool(2 * n), DevicePool(2 * n)
        g = torch.Generator().manual_seed(seed)
        host.buf[:, n : 2 * n].copy_(torch.randint(0, 250, (layers, n, width), generator=g, dtype=torch.uint8))
        ctrl = cc.HiCacheController.__new__(cc.HiCacheController)
        ctrl.mem_pool_host, ctrl.mem_pool_device = host, devpool
        ctrl.mem_pool_device_allocator = Allocator(n // 2)
        ctrl.io_backend, ctrl.device = "direct", dev
        ctrl.load_queue, ctrl.ack_load_queue = [], []
        ctrl.layer_done_counter = cc.LayerDoneCounter(layers)
        ctrl.transfer_layer_id_max = layers
        ctrl.l2_transfer_engine = l2.L2TransferEngine("direct")
        forward = torch.cuda.Stream()
        ctrl.load_fence_stream = forward if fenced else None
        torch.cuda.synchronize()
        # A forward still in flight on the forward stream writes the pages the load is about to reuse.
        with torch.cuda.stream(forward):
            torch.cuda._sleep(40_000_000)  # ~20 ms
            devpool.buf[:, n // 2 : n // 2 + n].fill_(255)
        dev_idx = ctrl.load(torch.arange(n, 2 * n))
        ctrl.start_loading()
        torch.cuda.synchronize()
        d0 = int(dev_idx[0])
        got = devpool.buf[:, d0 : d0 + n].cpu()
        return torch.equal(got, host.buf[:, n : 2 * n]), int((got == 255).all(-1).sum())

    rows = []
    fenced = [trial(True, s) for s in range(3)]
    unfenced = [trial(False, s) for s in range(3)]
    ok_f = all(r[0] for r in fenced)
    det = sum(1 for r in unfenced if not r[0])
    rows.append(
        row(
            "4a",
            "fence set: load ends with restored data",
            "PASS" if ok_f else "FAIL",
            f"{sum(r[0] for r in fenced)}/3 trials restored exactly (13 layers x 32 pages, pinned H2D on the "
            f"L2TransferEngine stream); HybridCacheController inherits start_loading: {inherits}",
        )
    )
    rows.append(
        row(
            "4b",
            "fence removed: race detected",
            "PASS" if det else "FAIL",
            f"{det}/3 trials corrupted (rows overwritten by the forward: {[r[1] for r in unfenced]})",
        )
    )
    return rows


# ----------------------------------------------------------------------------------------------
# check 5: restore ceiling benchmark
# ----------------------------------------------------------------------------------------------

PAGE_TOKENS = 64
KV_BYTES_PER_TOKEN = 13 * 1 * 256 * 2 * 1  # (12 QSA + 1 MTP layers) x 1 KV head x 256 x (K+V) x FP8
INDEX_BYTES_PER_TOKEN = 13 * 128 * 2 // 4  # bf16 128-dim key per 4 tokens x 13 layers
MAMBA_LAYER_BYTES = 24 * 128 * 128 * 2 + 30_720  # SSM (bf16) + conv per GDN layer, per rank at TP2
PLE_SIDE_BYTES = 10_240 * 3 * 3 * 2 + 2 * 8  # PLE conv window rows (bf16) + n-gram context (int64)
MAMBA_SLOT_BYTES = 36 * MAMBA_LAYER_BYTES + PLE_SIDE_BYTES


def _time_stream(fn, stream, reps=5):
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            start.record()
            fn()
            end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def check5(ctx) -> list[dict]:
    import torch

    rows = []
    runtime_path = "sgl_kernel.kvcacheio (the runtime's kernel/direct transfer path)"
    if "sgl_kernel" in ctx.get("stubbed", ()):
        path_note = (
            f"{runtime_path} not importable (sglang-kernel 0.4.10 needs torch 2.14.1, 373 MB wheel): "
            "torch copy engine path"
        )
    else:
        path_note = "sgl_kernel present but not used by this benchmark: torch copy engine path"
    dev = torch.device("cuda")
    stream = torch.cuda.Stream()
    kv_page = KV_BYTES_PER_TOKEN * PAGE_TOKENS
    ix_page = INDEX_BYTES_PER_TOKEN * PAGE_TOKENS
    host_pages, restore_pages = 2048, 512  # a 32k-token prefix restored from a 128k-token host pool
    h_kv = torch.empty(host_pages, kv_page, dtype=torch.uint8, pin_memory=True)
    h_ix = torch.empty(host_pages, ix_page, dtype=torch.uint8, pin_memory=True)
    h_mb = torch.empty(2, MAMBA_SLOT_BYTES, dtype=torch.uint8, pin_memory=True)
    d_kv = torch.empty(host_pages, kv_page, dtype=torch.uint8, device=dev)
    d_ix = torch.empty(host_pages, ix_page, dtype=torch.uint8, device=dev)
    d_mb = torch.empty(2, MAMBA_SLOT_BYTES, dtype=torch.uint8, device=dev)
    for t in (h_kv, h_ix, h_mb):
        t.view(-1)[::4096] = 1  # touch every page of the pinned buffers
    g = torch.Generator().manual_seed(5)
    src = torch.randperm(host_pages, generator=g)[:restore_pages].tolist()
    dst = torch.randperm(host_pages, generator=g)[:restore_pages].tolist()
    total = restore_pages * (kv_page + ix_page) + MAMBA_SLOT_BYTES

    def page_copies():
        for s, d in zip(src, dst, strict=True):
            d_kv[d].copy_(h_kv[s], non_blocking=True)
            d_ix[d].copy_(h_ix[s], non_blocking=True)
        d_mb[1].copy_(h_mb[1], non_blocking=True)

    eager = _time_stream(page_copies, stream)
    graph_s = None
    try:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            page_copies()
        graph_s = _time_stream(graph.replay, stream)
    except Exception as exc:
        print(f"graph capture of the page copies failed: {type(exc).__name__}: {exc}")
    kv_only = _time_stream(
        lambda: [d_kv[d].copy_(h_kv[s], non_blocking=True) for s, d in zip(src, dst, strict=True)], stream
    )
    big = 1 << 30
    h_big = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    h_big.view(-1)[::4096] = 1
    d_big = torch.empty(big, dtype=torch.uint8, device=dev)
    limit_s = _time_stream(lambda: d_big.copy_(h_big, non_blocking=True), stream)
    gbps = lambda b, s: b / s / 1e9  # noqa: E731
    limit = gbps(big, limit_s)
    res = {
        "limit_GBps": limit,
        "pages_eager_GBps": gbps(total, eager),
        "pages_graph_GBps": gbps(total, graph_s) if graph_s else None,
        "kv_pages_only_eager_GBps": gbps(restore_pages * kv_page, kv_only),
        "restore_bytes": total,
        "kv_page_bytes": kv_page,
        "index_page_bytes": ix_page,
        "mamba_slot_bytes": MAMBA_SLOT_BYTES,
        "path": path_note,
    }
    Path(ctx["result"]).with_suffix(".bench.json").write_text(json.dumps(res))
    rows.append(row("5a", "limit: 1 GiB contiguous pinned H2D", "MEASURED", f"{limit:.1f} GB/s"))
    rows.append(
        row(
            "5b",
            "pages, one copy per page (eager)",
            "MEASURED",
            f"{res['pages_eager_GBps']:.1f} GB/s = {res['pages_eager_GBps'] / limit:.2f} x limit; "
            f"{restore_pages} pages x ({kv_page:,} KV + {ix_page:,} index) B + 1 Mamba slot "
            f"{MAMBA_SLOT_BYTES:,} B = {total / 1e6:.1f} MB",
        )
    )
    if graph_s:
        rows.append(
            row(
                "5c",
                "pages, one copy per page (CUDA graph)",
                "MEASURED",
                f"{res['pages_graph_GBps']:.1f} GB/s = {res['pages_graph_GBps'] / limit:.2f} x limit "
                "(launch cost removed)",
            )
        )
    else:
        rows.append(
            row(
                "5c",
                "pages, one copy per page (CUDA graph)",
                "CANNOT-RUN",
                "graph capture of pinned copies failed (see log)",
            )
        )
    rows.append(
        row("5d", "KV pages alone (eager)", "MEASURED", f"{res['kv_pages_only_eager_GBps']:.1f} GB/s; {path_note}")
    )
    return rows


# ----------------------------------------------------------------------------------------------
# check 6: GDN interior-boundary state snapshot (patch 0005)
# ----------------------------------------------------------------------------------------------

# Qwen3.8-Flash-Next per rank at TP2 (profiles/qwen3.8-flash-next.json: 16 key heads, 48 value heads,
# 128 x 128, conv kernel 4).
GDN_K_HEADS, GDN_V_HEADS, GDN_K_DIM, GDN_V_DIM, GDN_CONV = 8, 24, 128, 128, 4
GDN_STATE_TOL = 1.0 / 128  # |snapshot - ref| <= tol * max|ref|: h is stored in bf16 (2^-8 relative rounding)
GDN_F64_TOL = 2e-2  # bf16 kernel (fp32 accumulation, bf16 w/u/v_new) against a float64 recurrence


def _gdn_reference_f64(q, k, v, g, beta, eps=1e-6):
    """Gated delta rule, one sequence, float64: S <- S*exp(g_t); S += beta_t (v_t - S k_t) k_t^T,
    with q/k l2-normalised as use_qk_l2norm_in_kernel does. S is [H, V, K] (the pool layout)."""
    import torch

    k = k.double()
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps)
    rep = v.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v, g, beta = v.double(), g.double(), beta.double()
    S = torch.zeros(v.shape[1], v.shape[2], k.shape[2], dtype=torch.float64, device=v.device)
    for t in range(v.shape[0]):
        S = S * torch.exp(g[t])[:, None, None]
        kt = k[t]
        pred = torch.einsum("hvk,hk->hv", S, kt)
        S = S + beta[t][:, None, None] * torch.einsum("hv,hk->hvk", v[t] - pred, kt)
    return S


def _rel_err(a, ref) -> float:
    return float((a.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def check6(ctx) -> list[dict]:
    import torch
    import torch.nn.functional as F

    chunk_mod = import_or_cannot("sglang.kernels.ops.attention.fla.chunk")
    hyb = import_or_cannot("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    fbi = import_or_cannot("sglang.srt.model_executor.forward_batch_info")
    conv_mod = import_or_cannot("sglang.kernels.ops.mamba.causal_conv1d_triton")
    base = hyb.MambaAttnBackendBase
    fla_chunk = chunk_mod.CHUNK_SIZE
    state_chunk = 64  # the backend's mamba_chunk_size (hf config default; Qwen GDN configs set none)
    dev = torch.device("cuda")
    rows = []
    HK, HV, DK, DV, W = GDN_K_HEADS, GDN_V_HEADS, GDN_K_DIM, GDN_V_DIM, GDN_CONV
    conv_dim = 2 * HK * DK + HV * DV
    worst = {"snap_vs_prefix": 0.0, "snap_vs_f64": 0.0, "prefix_vs_f64": 0.0, "bf16_exact": 1.0}
    ctl = {"off_by_one_chunk": float("inf"), "full_prompt_final": float("inf")}
    conv_ok, conv_ctl_hit, cases = True, True, []
    for grid in (64, 256):
        ks = [2, 4, 3]  # a batch of three final extends of k*grid tokens, prefix 0
        lens = [k * grid for k in ks]
        # scheduler after 0005 (ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend): replay boundary
        # (L - 1) // grid * grid, then _force_track_h adds 1 so the backend takes the interior-h branch
        replay = [(n - 1) // grid * grid for n in lens]
        track_seqlens = [r + 1 for r in replay]
        B, T = len(lens), sum(lens)
        gen = torch.Generator(device=dev).manual_seed(600 + grid)
        rnd = lambda *s, _g=gen: torch.randn(*s, generator=_g, device=dev)  # noqa: E731
        q = rnd(1, T, HK, DK).to(torch.bfloat16)
        k = rnd(1, T, HK, DK).to(torch.bfloat16)
        v = rnd(1, T, HV, DV).to(torch.bfloat16)
        g = F.logsigmoid(rnd(1, T, HV) + 3.0).float()  # decay close to 1, so early tokens still count
        beta = torch.sigmoid(rnd(1, T, HV)).float()
        cu = torch.tensor(list(itertools.accumulate(lens, initial=0)), dtype=torch.int32, device=dev)
        h_off = list(itertools.accumulate(((n + state_chunk - 1) // state_chunk for n in lens), initial=0))
        n_slots = 2 * B + 2
        pool = torch.zeros(n_slots, HV, DV, DK, dtype=torch.float32, device=dev)
        cache_idx = torch.arange(B, dtype=torch.int32, device=dev)
        track_dst = torch.arange(B, 2 * B, dtype=torch.int64, device=dev)
        _o, _none, h = chunk_mod.chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, initial_state_indices=cache_idx,
            cu_seqlens=cu, head_first=False, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.cuda.synchronize()
        fb = types.SimpleNamespace(
            mamba_track_mask=torch.ones(B, dtype=torch.bool, device=dev),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int64, device=dev),
            mamba_track_indices=track_dst,
            mamba_track_seqlens=torch.tensor(track_seqlens, dtype=torch.int64, device=dev),
            extend_prefix_lens=torch.zeros(B, dtype=torch.int64, device=dev),
        )
        fake = types.SimpleNamespace(
            mamba_chunk_size=state_chunk,
            device=dev,
            conv_states_shape=(n_slots, conv_dim, W - 1),
            _has_cpu_prefill_track_metadata=lambda _fb: False,
        )
        (chunk_idx, h_src, h_dst, _seqs, fin_src, fin_dst, _a, _b, rec_dst) = base._init_track_ssm_indices(
            fake, cache_idx.to(torch.int64), fb
        )
        md = types.SimpleNamespace(
            has_mamba_track_mask=True, track_ssm_h_src=h_src, track_ssm_h_dst=h_dst,
            track_ssm_recompute_dst=rec_dst, track_ssm_final_src=fin_src, track_ssm_final_dst=fin_dst,
        )  # fmt: skip
        if fin_src.numel() != 0 or h_src.numel() != B:
            raise AssertionError(f"grid {grid}: backend chose final-state rows {fin_src.tolist()}, h rows {h_src}")
        # the host-side plan (_init_track_ssm_indices_from_cpu, taken when the CPU track metadata is set)
        fb_cpu = types.SimpleNamespace(
            mamba_prefill_track_mask_cpu=[True] * B, mamba_track_seqlens_cpu=track_seqlens,
            extend_seq_lens_cpu=lens, extend_prefix_lens_cpu=[0] * B, mamba_track_indices=track_dst,
        )  # fmt: skip
        fake._track_indices_to_device = types.MethodType(base._track_indices_to_device, fake)
        cpu_plan = base._init_track_ssm_indices_from_cpu(fake, cache_idx.to(torch.int64), fb_cpu)
        for name, a_, b_ in (
            ("h_src", h_src, cpu_plan[1]),
            ("h_dst", h_dst, cpu_plan[2]),
            ("chunk", chunk_idx, cpu_plan[0]),
        ):
            if a_.tolist() != b_.tolist():
                raise AssertionError(f"grid {grid}: {name} GPU path {a_.tolist()} != CPU plan {b_.tolist()}")
        if cpu_plan[4].numel() != 0:
            raise AssertionError(f"grid {grid}: CPU plan chose final-state rows {cpu_plan[4].tolist()}")
        base._track_mamba_state_extend(fake, fb, h, pool, md)
        torch.cuda.synchronize()
        snap = pool[track_dst]
        full_final = pool[cache_idx.long()].clone()
        # reference: a separate prefill of exactly the first replay[i] tokens of each prompt
        sel = torch.cat([torch.arange(int(cu[i]), int(cu[i]) + replay[i], device=dev) for i in range(B)])
        cu_p = torch.tensor(list(itertools.accumulate(replay, initial=0)), dtype=torch.int32, device=dev)
        pool_p = torch.zeros_like(pool)
        chunk_mod.chunk_gated_delta_rule(
            q=q[:, sel], k=k[:, sel], v=v[:, sel], g=g[:, sel], beta=beta[:, sel], initial_state=pool_p,
            initial_state_indices=cache_idx, cu_seqlens=cu_p, head_first=False, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.cuda.synchronize()
        ref = pool_p[cache_idx.long()]
        h2 = h.squeeze(0)
        for i in range(B):
            r = ref[i]
            e_pref = _rel_err(snap[i], r)
            exact = float((snap[i] == r.to(torch.bfloat16).float()).float().mean())
            s0, s1 = int(cu[i]), int(cu[i]) + replay[i]
            r64 = _gdn_reference_f64(q[0, s0:s1], k[0, s0:s1], v[0, s0:s1], g[0, s0:s1], beta[0, s0:s1])
            e64 = _rel_err(snap[i], r64)
            e_p64 = _rel_err(r, r64)
            src = int(h_src[i])
            # the neighbouring chunk boundaries of the same prompt (src + 1 only where the prompt has one)
            near = [c for c in (src - 1, src + 1) if h_off[i] <= c < h_off[i + 1]]
            off = min(_rel_err(h2[c], r) for c in near)
            fullf = _rel_err(full_final[i], r)
            worst["snap_vs_prefix"] = max(worst["snap_vs_prefix"], e_pref)
            worst["snap_vs_f64"] = max(worst["snap_vs_f64"], e64)
            worst["prefix_vs_f64"] = max(worst["prefix_vs_f64"], e_p64)
            worst["bf16_exact"] = min(worst["bf16_exact"], exact)
            ctl["off_by_one_chunk"] = min(ctl["off_by_one_chunk"], off)
            ctl["full_prompt_final"] = min(ctl["full_prompt_final"], fullf)
            cases.append(
                f"grid {grid} L={lens[i]} track {replay[i]} h[{src}] (chunk {int(chunk_idx[i])}): "
                f"vs prefix {e_pref:.2e}, bf16-exact {exact:.4f}, vs f64 {e64:.2e}; prefix vs f64 {e_p64:.2e}; "
                f"ctl h[src+-1] {off:.2e}, full-prompt final {fullf:.2e}"
            )
            print(cases[-1])
        # conv window: the backend's track indices (from mamba_track_aligned_lens) against the conv state
        # the runtime's Triton causal_conv1d_fn leaves after a prefill of exactly the tracked prefix
        fbi.mamba_cache_chunk_size = lambda _g=grid: _g  # the scheduler's caching grid (max(64, page))
        fb.mamba_track_aligned_lens = types.MethodType(fbi.ForwardBatch.mamba_track_aligned_lens, fb)
        x = rnd(T, conv_dim).to(torch.bfloat16)
        idx = base._init_track_conv_indices(fake, cu.to(torch.int64), fb)
        window = x[idx].transpose(1, 2)  # what forward_extend writes into conv_states[mask indices]
        wgt = rnd(conv_dim, W).to(torch.bfloat16)
        conv_states = torch.zeros(n_slots, conv_dim, W - 1, dtype=torch.bfloat16, device=dev)
        xp = x[sel]
        conv_mod.causal_conv1d_fn(
            xp.transpose(0, 1), wgt, None, conv_states=conv_states, query_start_loc=cu_p, seq_lens_cpu=replay,
            cache_indices=cache_idx, has_initial_state=torch.zeros(B, dtype=torch.bool, device=dev),
            activation="silu",
        )  # fmt: skip
        torch.cuda.synchronize()
        conv_ref = conv_states[cache_idx.long()]
        conv_ok &= bool(torch.equal(window, conv_ref))
        end_idx = (cu[:-1].long() + torch.tensor(lens, device=dev))[:, None] - (W - 1) + torch.arange(W - 1, device=dev)
        conv_ctl_hit &= not bool(torch.equal(x[end_idx].transpose(1, 2), conv_ref))
        print(f"grid {grid}: conv window == causal_conv1d_fn state after the prefix: {torch.equal(window, conv_ref)}")
    ok = (
        worst["snap_vs_prefix"] <= GDN_STATE_TOL
        and worst["snap_vs_f64"] <= GDN_F64_TOL
        and worst["prefix_vs_f64"] <= GDN_F64_TOL
    )
    geo = f"{HK}k/{HV}v heads x {DK}x{DV}, FLA chunk {fla_chunk}, grids 64/256, k=2,3,4"
    rows.append(
        row(
            "6a",
            "tracked h snapshot = prefix prefill final state",
            "PASS" if ok else "FAIL",
            f"max rel (to max|ref|) vs prefix prefill {worst['snap_vs_prefix']:.2e} (tol {GDN_STATE_TOL:.2e}), "
            f"bf16-rounded ref exact on >= {worst['bf16_exact']:.4f} of elements; vs float64 recurrence "
            f"{worst['snap_vs_f64']:.2e} (prefix prefill itself {worst['prefix_vs_f64']:.2e}, "
            f"tol {GDN_F64_TOL}); {geo}",
        )
    )
    c_ok = min(ctl.values()) > 10 * GDN_STATE_TOL
    rows.append(
        row(
            "6ctl",
            "CONTROL: h one chunk off / full-prompt final state",
            "DETECTED" if c_ok else "FAIL",
            f"min rel err h[src-1|src+1] {ctl['off_by_one_chunk']:.2e}, final state of the whole prompt "
            f"{ctl['full_prompt_final']:.2e} (must exceed {10 * GDN_STATE_TOL:.2e})",
        )
    )
    rows.append(
        row(
            "6b",
            "conv window at tracked length (mamba_track_aligned_lens)",
            "PASS" if conv_ok and conv_ctl_hit else "FAIL",
            f"window == conv state of causal_conv1d_fn (Triton) after the prefix: {conv_ok} (bit-exact); "
            f"control (window at the prompt end) differs: {conv_ctl_hit}",
        )
    )
    Path(ctx["result"]).with_suffix(".cases.txt").write_text("\n".join(cases) + "\n")
    return rows


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------

WORKERS = {"1": check1, "2": check2, "3": check3, "4": check4, "5": check5, "6": check6}


def worker_main(args) -> int:
    ctx = {"work": args.work, "result": args.result, "mode": args.mode, "rows": args.rows}
    out: dict = {"rows": []}
    try:
        out["imports"] = setup_imports(Path(args.site))
        ctx["stubbed"] = out["imports"]["stubbed"]
        import torch

        if not torch.cuda.is_available():
            raise CannotRun("no CUDA device")
        out["rows"] = WORKERS[args.worker](ctx)
    except CannotRun as exc:
        out["rows"] = [row(args.worker, TITLES[args.worker], "CANNOT-RUN", str(exc))]
    except Exception as exc:
        traceback.print_exc()
        out["rows"] = [row(args.worker, TITLES[args.worker], "FAIL", f"{type(exc).__name__}: {str(exc)[:300]}")]
    out["sgl_kernel_bound"] = sorted(set(SGL_KERNEL_BOUND))
    Path(args.result).write_text(json.dumps(out))
    return 0


def find_wheel(explicit: str | None) -> Path | None:
    cands = [Path(explicit)] if explicit else []
    cands += [REPO / ".whl" / "runtime" / WHEEL_NAME, Path.home() / ".cache/qwen-hicache/wheels" / WHEEL_NAME]
    env = os.environ.get("QWEN_HICACHE_WHEEL_CACHE")
    if env:
        cands.append(Path(env) / WHEEL_NAME)
    return next((c for c in cands if c.is_file()), None)


def prepare_site(args, log) -> tuple[Path | None, str]:
    if args.sglang_site:
        site = Path(args.sglang_site)
        p = subprocess.run(
            [sys.executable, str(PATCHES / "verify.py"), "--tree", str(site)], capture_output=True, text=True
        )
        return site, f"given site {site}; verify.py: rc={p.returncode} {(p.stdout + p.stderr).strip()[-300:]}"
    wheel = find_wheel(args.sglang_wheel)
    if wheel is None:
        return None, f"no sglang wheel ({WHEEL_NAME}) found; pass --sglang-wheel or --sglang-site"
    site = Path(args.work) / "site"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site, [n for n in zf.namelist() if n.startswith("sglang/")])
    p = subprocess.run(
        [sys.executable, str(PATCHES / "verify.py"), "--tree", str(site), "--apply"], capture_output=True, text=True
    )
    log.write(f"$ verify.py --tree {site} --apply\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        return None, f"verify.py --apply failed (rc={p.returncode}): {(p.stdout + p.stderr).strip()[-300:]}"
    return (
        site,
        f"{wheel.name} unpacked and patched (verify.py --apply: {(p.stdout.strip().splitlines() or ['ok'])[-1][:200]})",
    )


def run_worker(args, site, check, log, mode="main", rows=None, wrap=None, env_extra=None, timeout=480):
    result = Path(args.work) / f"check{check}-{mode}.json"
    result.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        check,
        "--site",
        str(site),
        "--work",
        args.work,
        "--result",
        str(result),
        "--mode",
        mode,
    ]
    if rows:
        cmd += ["--rows", rows]
    if wrap:
        cmd = wrap + cmd
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **(env_extra or {})}
    t0 = time.time()
    log.write(f"\n===== check {check} ({mode}) $ {' '.join(cmd)}\n")
    log.flush()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout)
        output, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    log.write(output)
    log.write(f"\n----- rc={rc} in {time.time() - t0:.1f}s\n")
    log.flush()
    data = json.loads(result.read_text()) if result.exists() else None
    return data, output, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang-site", help="a directory holding the sglang/ package (used as is)")
    ap.add_argument("--sglang-wheel", help="the pinned sglang wheel to unpack and patch")
    ap.add_argument("--out", default="gpu-checks-out", help="logs and summary (few files)")
    ap.add_argument("--work", default=None, help="scratch (site, worker results); default /tmp/qhc-gpu-checks")
    ap.add_argument("--only", default=",".join(CHECKS), help="comma list of checks, e.g. 1,3")
    ap.add_argument("--no-sanitizer", action="store_true", help="skip the compute-sanitizer pass of check 2")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--site", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work = args.work or "/tmp/qhc-gpu-checks"
    if args.worker:
        return worker_main(args)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    log = open(out / "checks.log", "w")  # noqa: SIM115 (written by every step, closed at the end)
    env_info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
    }
    try:
        import torch

        env_info["torch"] = torch.__version__
        env_info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env_info["gpu"] = torch.cuda.get_device_name(0)
            env_info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        import triton

        env_info["triton"] = triton.__version__
    except Exception as exc:
        env_info["torch"] = f"unavailable: {exc}"
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        env_info["nvidia_smi"] = smi.stdout.strip()
    except Exception:
        pass
    results: list[dict] = []
    only = [c for c in args.only.split(",") if c]
    if "gpu" not in env_info:
        results = [row(c, TITLES[c], "CANNOT-RUN", "no CUDA device") for c in only]
        site_note = "not prepared"
    else:
        site, site_note = prepare_site(args, log)
        if site is None:
            results = [row(c, TITLES[c], "CANNOT-RUN", site_note) for c in only]
        # check 2 last: its compute-sanitizer pass is the slowest step
        for c in sorted(only, key=lambda c: c == "2") if site is not None else []:
            data, output, rc = run_worker(args, site, c, log)
            if data is None:
                results.append(row(c, TITLES[c], "FAIL", f"worker died (rc={rc}): {output.strip()[-300:]}"))
                continue
            results += data["rows"]
            if data.get("sgl_kernel_bound"):
                log.write(f"sgl_kernel names bound at import (stub, never callable): {len(data['sgl_kernel_bound'])}\n")
            if c in ("2", "3") and all(r["status"] != "CANNOT-RUN" for r in data["rows"]):
                cdata, coutput, crc = run_worker(args, site, c, log, mode="control")
                if cdata is None:
                    status = (
                        "DETECTED"
                        if c == "2" and ("device-side assert" in coutput or "out of bounds" in coutput)
                        else "FAIL"
                    )
                    results.append(
                        row(f"{c}ctl", "CONTROL", status, f"control worker died (rc={crc}): {coutput.strip()[-200:]}")
                    )
                else:
                    results += cdata["rows"]
            if c == "2" and not args.no_sanitizer and all(r["status"] == "PASS" for r in data["rows"]):
                san = shutil.which("compute-sanitizer") or next(
                    (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None
                )
                if san is None:
                    results.append(
                        row("2s", "compute-sanitizer memcheck, 1-3 rows", "CANNOT-RUN", "compute-sanitizer not found")
                    )
                else:
                    sdata, soutput, src_ = run_worker(
                        args,
                        site,
                        c,
                        log,
                        mode="sanitize",
                        rows="1,2,3",
                        wrap=[san, "--tool", "memcheck", "--error-exitcode", "99", "--target-processes", "all"],
                        env_extra={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                        timeout=240,
                    )
                    summary = next((ln.strip() for ln in soutput.splitlines() if "ERROR SUMMARY" in ln), "")
                    if src_ == "timeout":
                        results.append(
                            row("2s", "compute-sanitizer memcheck, 1-3 rows", "CANNOT-RUN", "timed out after 240 s")
                        )
                    elif (
                        sdata
                        and all(r["status"] == "PASS" for r in sdata["rows"])
                        and src_ == 0
                        and "0 errors" in summary
                    ):
                        results.append(
                            row(
                                "2s",
                                "compute-sanitizer memcheck, 1-3 rows",
                                "PASS",
                                summary.replace("=========", "").strip(),
                            )
                        )
                    else:
                        results.append(
                            row("2s", "compute-sanitizer memcheck, 1-3 rows", "FAIL", f"rc={src_} {summary}")
                        )
    bench = Path(args.work) / "check5-main.bench.json"
    bench_data = json.loads(bench.read_text()) if bench.exists() and "5" in only else None
    results.sort(key=lambda r: (r["id"][0], r["id"]))
    # table
    lines = [
        f"qwen-hicache GPU checks  {env_info.get('date')}  {env_info.get('gpu', 'no GPU')}  "
        f"torch {env_info.get('torch')}  triton {env_info.get('triton', '-')}  python {env_info['python']}",
        f"runtime: {site_note}",
        "",
    ]
    w = max(len(r["name"]) for r in results) if results else 10
    lines.append(f"{'id':<5} {'check':<{w}}  {'result':<12} detail")
    lines.append(f"{'-' * 5} {'-' * w}  {'-' * 12} {'-' * 6}")
    for r in results:
        lines.append(f"{r['id']:<5} {r['name']:<{w}}  {r['status']:<12} {r['detail']}")
    if bench_data:
        g = bench_data.get("pages_graph_GBps") or bench_data["pages_eager_GBps"]
        lines.append("")
        lines.append(
            "bandwidth ratio (restore pages / contiguous pinned limit): "
            f"{g:.1f} / {bench_data['limit_GBps']:.1f} GB/s = "
            f"{g / bench_data['limit_GBps']:.2f} (graph-issued); "
            f"eager {bench_data['pages_eager_GBps'] / bench_data['limit_GBps']:.2f}"
        )
    counts = {s: sum(r["status"] == s for r in results) for s in ("PASS", "FAIL", "CANNOT-RUN")}
    lines.append("")
    lines.append(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['CANNOT-RUN']} cannot-run")
    text = "\n".join(lines)
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(
        json.dumps({"env": env_info, "runtime": site_note, "rows": results, "bench": bench_data}, indent=1)
    )
    log.close()
    if counts["FAIL"]:
        return 1
    return 2 if counts["CANNOT-RUN"] else 0


if __name__ == "__main__":
    sys.exit(main())
