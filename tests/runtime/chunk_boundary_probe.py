"""Where an extend tracks its Mamba checkpoint, and what an identical prompt then matches, through one tree's own code.

    python chunk_boundary_probe.py TREE

Hybrid backup gap (b), upstream sglang #30882 / PR #21350: with the extra buffer, the final extend of a prompt of
exactly ``k * grid`` tokens tracks its Mamba state at the prompt's end, while a later identical prompt is looked up
to ``input_len - 1`` at most, so that state is never matched. Per scenario this runs, from TREE:

- ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (compiled out of TREE's ``schedule_batch.py`` with
  ``_MambaRadixCacheV2TrackEntry``; the scheduling context it reads is stubbed: no DCP, eager extra buffer, grid =
  cache chunk = page = 64, the model's state chunk 64) for each extend: the track mask, the seqlen handed to the
  backend and the depth recorded as ``mamba_last_track_seqlen``;
- ``build_prefill_track_plan`` (TREE's ``layers/attention/mamba/prefill_track_metadata.py``, the CPU plan
  ``_init_track_ssm_indices`` uses) on that seqlen: whether the backend copies the final recurrent state or the
  intermediate ``h`` chunk state, and which chunk (the depth the snapshot is of);
- the insert ``checkpoint_into_tree`` makes after each extend (the key cut to ``min(len, mamba_last_track_seqlen)``,
  page aligned, with the Mamba value on its last node) into TREE's ``UnifiedTreeCore`` with the FULL and MAMBA
  components;
- an identical prompt's lookup: ``Req._compute_max_prefix_len`` (compiled from TREE) bounds the key, and
  ``UnifiedTreeCore.match_prefix`` returns the matched length (a node counts only with a Mamba state).
"""

from __future__ import annotations

import ast
import json
import logging
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

import cpu_stub

TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from sglang.srt.layers.attention.mamba.prefill_track_metadata import build_prefill_track_plan  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402

GRID = PAGE = STATE_CHUNK = 64
SB = "sglang/srt/managers/schedule_batch.py"


def compiled() -> dict:
    """The two methods and the track entry, compiled out of TREE's schedule_batch.py."""
    module = ast.parse((TREE / SB).read_text())
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}

    def method(cls: str, name: str) -> ast.FunctionDef:
        return next(n for n in classes[cls].body if isinstance(n, ast.FunctionDef) and n.name == name)

    prepare = method("ScheduleBatch", "_mamba_radix_cache_v2_req_prepare_for_extend")
    max_prefix = method("Req", "_compute_max_prefix_len")
    from typing import NamedTuple, Optional

    namespace = {
        "NamedTuple": NamedTuple, "Optional": Optional, "Req": object,
        "mamba_cache_chunk_size": lambda: GRID,
        "mamba_checkpoint_grid": lambda page: GRID,
        "get_parallel": lambda: SimpleNamespace(dcp_enabled=False),
        "get_exec": lambda: SimpleNamespace(mamba=SimpleNamespace(enable_mamba_extra_buffer_lazy=False)),
    }  # fmt: skip
    import __future__

    flags = __future__.annotations.compiler_flag
    body = [classes["_MambaRadixCacheV2TrackEntry"], prepare, max_prefix]
    exec(compile(ast.Module(body, []), str(TREE / SB), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace


NS = compiled()
BATCH = SimpleNamespace(
    model_config=SimpleNamespace(hf_text_config=SimpleNamespace(mamba_chunk_size=STATE_CHUNK)),
    tree_cache=SimpleNamespace(page_size=PAGE),
    req_to_token_pool=SimpleNamespace(get_mamba_ping_pong_other_idx=lambda i: 1 - i),
)


class Req(SimpleNamespace):
    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len


def new_core() -> UnifiedTreeCore:
    params = SimpleNamespace(
        page_size=PAGE, is_eagle=False, enable_session_radix_cache=False, eviction_policy="lru",
        eviction_policy_config=None, token_to_kv_pool_allocator=None, enable_kv_cache_events=False,
        dynamo_kv_event_format=False, kv_event_lora_names=None,
    )  # fmt: skip
    mamba = MambaComponent.__new__(MambaComponent)  # its __init__ asserts a HybridReqToTokenPool; the tree needs none
    TreeComponent.__init__(mamba, None, params)
    mamba.mamba_cache_chunk_size, mamba.mamba_checkpoint_grid = GRID, GRID
    mamba.mamba_max_states_per_path, mamba._mamba_pool_host = -1, None  # -1: no per-path cap (the default)
    full = FullComponent(SimpleNamespace(enable_session_radix_cache=False), params)
    return UnifiedTreeCore(params, {ComponentType.FULL: full, ComponentType.MAMBA: mamba})


def insert(core: UnifiedTreeCore, params: InsertParams) -> None:
    step = core.begin_insert(params)
    while step.result is None:
        step = core.resume_insert()
    core.end_insert()


def extend(req: Req, end: int) -> dict:
    """One extend [req.prefix_len, end): the tree's track decision and the backend plan for it."""
    req.extend_end = end
    entry = NS["_mamba_radix_cache_v2_req_prepare_for_extend"](BATCH, req)
    out = {"extend": [req.prefix_len, end], "track_mask": bool(entry.track_mask),
           "track_seqlen": entry.track_seqlen, "tracked_depth": req.kv.mamba_last_track_seqlen}  # fmt: skip
    if entry.track_mask:
        plan = build_prefill_track_plan(
            [True], [entry.track_seqlen], [req.extend_len], [req.prefix_len], STATE_CHUNK, mamba2=False
        )
        if plan.final_rows:
            out["snapshot"], out["snapshot_depth"] = "final_state", end
        else:
            out["snapshot"] = "h"
            out["snapshot_depth"] = req.prefix_len + plan.chunk_indices[0] * STATE_CHUNK
            out["h_src"] = plan.h_src[0]
    return out


def scenario(prompt_len: int, chunk: int | None) -> dict:
    tokens = list(range(1000, 1000 + prompt_len))
    core = new_core()
    kv = SimpleNamespace(mamba_next_track_idx=0, mamba_last_track_idx=None, mamba_last_track_seqlen=None)
    fill = array("q", tokens)
    req = Req(prefix_len=0, extend_end=0, full_untruncated_fill_ids=fill, mamba_branching_seqlen=None, kv=kv)
    steps, inserted, slot = [], 0, 0
    ends = list(range(chunk, prompt_len, chunk)) + [prompt_len] if chunk else [prompt_len]
    for end in ends:
        step = extend(req, end)
        # checkpoint_into_tree after the extend: key cut to the tracked depth, page aligned, Mamba value on its end.
        cache_len = min(end, req.kv.mamba_last_track_seqlen or 0) // PAGE * PAGE
        if cache_len > 0:
            slot += 1
            insert(core, InsertParams(
                key=RadixKey(array("q", tokens[:cache_len]), None), value=torch.arange(cache_len, dtype=torch.int64),
                mamba_value=torch.tensor([slot]), prev_prefix_len=inserted, inserted_len=inserted,
            ))  # fmt: skip
            inserted = max(inserted, cache_len)
        step["inserted_len"] = cache_len
        steps.append(step)
        req.kv.mamba_last_track_seqlen = None  # cleanup_after_caching_req (unfinished)
        req.prefix_len = end
    lookup = Req(dllm_config=None, return_logprob=False, logprob_start_len=-1, is_dllm=lambda: False)
    max_prefix = NS["_compute_max_prefix_len"](lookup, prompt_len)
    result = core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens[:max_prefix]), None)))
    return {"prompt": prompt_len, "chunk": chunk, "extends": steps, "max_prefix_len": max_prefix,
            "matched": result.device_prefix_len, "mamba_branching_seqlen": result.mamba_branching_seqlen}  # fmt: skip


if __name__ == "__main__":
    cases = {
        "exact_2grid_single": (2 * GRID, None),
        "exact_4grid_single": (4 * GRID, None),
        "exact_1grid_single": (GRID, None),
        "control_2grid_plus_2": (2 * GRID + 2, None),
        "exact_4grid_chunked_2grid": (4 * GRID, 2 * GRID),
        "control_4grid_plus_2_chunked": (4 * GRID + 2, 2 * GRID),
        # chunks of one grid (the engine run's token call): the last chunk starts where an identical prompt's hit ends
        "grid_chunked_5grid_plus_10": (5 * GRID + 10, GRID),
        "grid_chunked_5grid_plus_1": (5 * GRID + 1, GRID),
        "grid_chunked_exact_5grid": (5 * GRID, GRID),
    }
    print(json.dumps({name: scenario(*args) for name, args in cases.items()}))
