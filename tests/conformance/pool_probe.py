"""Run sglang 0.5.23's own server-args resolution, device pool constructors and HiCache host-pool builders
on CPU, and print what they allocate per rank as JSON.

Usage: ``python pool_probe.py TREE CASES.json OUT.json``. Each case gives the runtime arguments the operator
renders, a model directory (a real ``config.json``) and the device KV tokens. Nothing is simulated but the
machine: the platform is declared an SM90 CUDA GPU through the runtime's own ``override_platform`` for
resolution only; pools are built on the ``meta`` device, and the host allocator hands out ``meta`` tensors
and records their shapes instead of pinning RAM. The HiCache controller (threads, streams) is a stub:
the sizes are fixed before it starts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
import cpu_stub  # noqa: E402

TREE, CASES, OUT = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.WARNING)

import torch  # noqa: E402
from sglang.srt import runtime_context as rc  # noqa: E402
from sglang.srt.arg_groups.model_override_base import resolved_view  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.mem_cache import kv_cache_configurator as kvc  # noqa: E402
from sglang.srt.mem_cache import memory_pool  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa  # noqa: E402
from sglang.srt.mem_cache.pool_host import base as host_base  # noqa: E402
from sglang.srt.mem_cache.pool_host import common as host_common  # noqa: E402
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo  # noqa: E402
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # noqa: E402
    SpecAuxHiddenStateConfig,
)
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

H200 = dict(
    is_cuda=True, is_sm90=True, is_hopper_with_cuda_12_3=True, is_sm100=False, is_sm100_or_sm110=False,
    is_sm110=False, is_sm120=False, is_blackwell=False, has_flashinfer=True, device_sm=90,
    device_capability=(9, 0),
)
ALLOCATIONS: list[dict] = []


def _meta_allocate(self, dims, dtype, device="cpu"):
    """The host allocator's last step: record what would be pinned, hand back a meta tensor."""
    t = torch.empty(dims, dtype=dtype, device="meta")
    ALLOCATIONS.append({"shape": list(dims), "dtype": str(dtype), "bytes": t.numel() * t.element_size()})
    return t


_device_module = torch.get_device_module
torch.get_device_module = lambda device=None: torch.cpu if str(device) == "meta" else _device_module(device)
host_common.HostTensorAllocator.allocate = _meta_allocate
host_common._cuda_host_register = lambda *a, **k: None


class _Controller:
    """Stands in for HybridCacheController: threads and CUDA streams, no sizing."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


hpa.HybridCacheController = _Controller
SPLITS: list[list[int]] = []
_split = hpa._split_hicache_size


def _recording_split(hicache_size, kv_pools):
    """The runtime's own split, with the device byte weights it used recorded."""
    sizes = []
    for pool in kv_pools:
        size = getattr(pool, "host_capacity_bytes", None) or pool.get_kv_size_bytes()
        sizes.append(int(sum(size) if isinstance(size, tuple) else size))
    SPLITS.append(sizes)
    return _split(hicache_size, kv_pools)


hpa._split_hicache_size = _recording_split
# A Triton copy-kernel warm-up (reads a stride with .item()); it sizes nothing.
memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup = lambda self: None


def _publish(args: list[str]):
    server_args = prepare_server_args([*args, "--device", "cuda", "--skip-tokenizer-init"])
    with rc.override_platform(**H200):
        rc.publish(server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    return server_args


def _configurator(server_args, model_config, *, draft: bool, req_pool=None, allocator=None, mem_config=None):
    from sglang.srt.mem_cache import kv_cache_dtype

    resolved, dtype = kv_cache_dtype.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
        model=None,
        model_dtype=model_config.dtype,
        is_draft_worker=draft,
        is_dflash=False,
        speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=rc.get_spec().speculative_draft_kv_cache_dtype,
    )
    layers = 1 if draft else model_config.num_hidden_layers
    return kvc.KVCacheConfigurator(
        device="meta",
        gpu_id=0,
        attn_dp_size=1,
        pp_size=1,
        pp_group=None,
        model=None,
        model_config=model_config,
        server_args=server_args,
        kv_cache_dtype=dtype,
        kv_cache_dtype_str=resolved or rc.get_model().kv_cache_dtype,
        model_dtype=model_config.dtype,
        page_size=rc.get_schedule().page_size,
        sliding_window_size=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(rc.get_spec().speculative_algorithm),
        is_draft_worker=draft,
        post_capture_kv_active=False,
        spec_aux_config=SpecAuxHiddenStateConfig(),
        is_hybrid_swa=False,
        is_hybrid_swa_compress=False,
        use_mla_backend=False,
        layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers),
        forward_stream=None,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        memory_pool_config=mem_config,
    )


def run_case(case: dict) -> dict:
    ALLOCATIONS.clear()
    server_args = _publish(case["args"])
    model_config = ModelConfig.from_server_args(server_args)
    target = _configurator(server_args, model_config, draft=False)
    device_tokens = case["device_kv_tokens"]
    requests = target.resolve_max_num_reqs(device_tokens)
    mem_config = MemoryPoolConfig(max_total_num_tokens=device_tokens, max_running_requests=requests)
    sizes = target._derive_pool_sizes(config=mem_config)
    pools = target._init_pools(sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)
    drafts = ()
    if rc.get_spec().speculative_algorithm is not None:
        draft_config = ModelConfig.from_server_args(
            server_args, model_path=server_args.speculative_draft_model_path or server_args.model_path,
            is_draft_model=True,
        )
        draft = _configurator(
            server_args, draft_config, draft=True, req_pool=pools.req_to_token_pool,
            allocator=pools.token_to_kv_pool_allocator, mem_config=mem_config,
        )
        draft_pools = draft._init_pools(
            sizes=draft._derive_pool_sizes(config=mem_config), req_to_token_pool=pools.req_to_token_pool,
            token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
        )
        drafts = (draft_pools.token_to_kv_pool,)
    device = _device_report(pools, drafts, requests)
    host = _build_host(server_args, pools, drafts)
    out = {"device": device, "host": host, "page_size": rc.get_schedule().page_size,
           "kv_cache_dtype": str(target.kv_cache_dtype), "resolved": _resolved(server_args)}
    if case.get("budget_bytes"):  # the runtime's own cap and page alignment of a profiled budget (--max-total-tokens)
        out["budget_tokens"] = target.config_from_budget(case["budget_bytes"]).max_total_num_tokens
    return out


def _resolved(server_args) -> dict:
    """The settings the runtime's resolution ends with that the operator's product rests on (HiCache needs the
    radix cache), and what deterministic mode turns on."""
    view = resolved_view(server_args)
    return {k: getattr(view, k) for k in ("disable_radix_cache", "enable_hierarchical_cache",
                                          "enable_deterministic_inference", "attention_backend", "sampling_backend")}


def _device_report(pools, drafts, requests: int) -> dict:
    kv = pools.token_to_kv_pool
    mamba = pools.req_to_token_pool.mamba_pool
    return {
        "max_running_requests": requests,
        "kv_tokens": kv.size,
        "kv_bytes": sum(kv.get_kv_size_bytes()),
        "index_bytes": sum(b.nbytes for p in (kv, *drafts) for b in getattr(p, "qsa_compressed_k_buffer_pool", ())),
        "mamba_slots": mamba.size,
        "mamba_bytes": mamba.mamba_cache.mem_usage_bytes(),
        "mamba_spec_states": _spec_states(mamba),
        "mamba_parts": _parts(mamba.mamba_cache),
        "target_kv": [int(x) for x in kv.host_pool_decls()[0].device_pool.get_kv_size_bytes()],
        "req_slots": int(pools.req_to_token_pool.req_to_token.shape[0]),
        "draft_kv_bytes": [sum(d.get_kv_size_bytes()) for d in drafts],
    }


def _parts(state) -> dict:
    import dataclasses

    out = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if value is not None:
            out[f.name] = memory_pool.get_tensor_size_bytes(value)
    return out


def _spec_states(mamba) -> int | None:
    ssm = getattr(mamba.mamba_cache, "intermediate_ssm", None)
    conv = getattr(mamba.mamba_cache, "intermediate_conv_window", None)
    if ssm is not None:
        return int(ssm.shape[1]) - 1
    if conv:
        return int(conv[0].shape[1]) - 1
    return None


def _build_host(server_args, pools, drafts) -> dict:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.hicache_storage import PoolName

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
        page_size=rc.get_schedule().page_size,
        enable_mamba_extra_buffer=rc.get_exec().mamba.enable_mamba_extra_buffer,
        mtp_draft_device_pools=drafts,
    )
    ALLOCATIONS.clear()
    SPLITS.clear()
    with host_base.host_memory_budget_scope(1 << 62):
        result = hpa._MambaStrategy().build(
            cache=SimpleNamespace(), kvcache=pools.token_to_kv_pool, params=params, server_args=server_args,
            load_cache_event=None,
        )
    group = result.host_pool_group
    kv, mamba = group.get_pool(PoolName.KV), group.get_pool(PoolName.MAMBA)
    out = {
        "kv_tokens": kv.size,
        "kv_bytes_per_token": kv.size_per_token,
        "kv_layers": kv.layer_num,
        "mamba_slots": mamba.size,
        "mamba_bytes_per_slot": mamba.size_per_token,
        "allocated_bytes": sum(a["bytes"] for a in ALLOCATIONS),
        "split_weights": list(SPLITS),
        "allocations": list(ALLOCATIONS),
    }
    try:
        index = group.get_pool(PoolName.INDEXER)
    except Exception:
        index = None
    if index is not None:
        out["index_bytes_per_token"] = index.size_per_token
        out["index_pages"] = index.num_host_pages if hasattr(index, "num_host_pages") else None
    return out


def main() -> None:
    import os

    results = []
    pristine = dict(os.environ)
    for case in json.loads(CASES.read_text()):
        os.environ.clear()  # resolution exports flags as env vars (e.g. SGLANG_MAMBA_SSM_DTYPE): one runtime
        os.environ.update(pristine)  # process serves one configuration, so no case may see another's
        start = time.perf_counter()
        try:
            out = run_case(case)
        except Exception as exc:  # one broken case must not hide the others
            out = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        out["name"] = case["name"]
        out["seconds"] = round(time.perf_counter() - start, 3)
        results.append(out)
    OUT.write_text(json.dumps(results, indent=1, default=int))


if __name__ == "__main__":
    main()
