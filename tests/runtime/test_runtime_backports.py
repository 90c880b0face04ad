"""Upstream fixes the original change backported must stay in the pinned parent.

sglang 0.5.23 already carries all five (runtime_patches/README.md says where);
these tests fail if a future parent loses one. #38851 (gather) and #36743 (Mamba
COW fence) are run on CPU by backport_probe.py. #38290 lives in two GPU-only
Triton kernels (the generic router and the SM 12.0 top-22 router; the wait is a
PTX griddepcontrol op) and a CUDA source file, so it is checked structurally:
the wait must precede the bias/score loads inside each kernel's own body. Every
guard is shown to fail on a doctored copy.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from probe_run import run_json

ROUTER_TRITON = "sglang/kernels/ops/moe/moe_fused_gate.py"
ROUTER_RADIX = "sglang/kernels/jit/csrc/moe/route_radix.cuh"
SPARSE_ATTN = "sglang/srt/layers/attention/qsa/sparse_attn.py"
QSA_BACKEND = "sglang/srt/layers/attention/qwen_sparse_attn_backend.py"
MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"
QSA_KV_POOL = "sglang/srt/mem_cache/qsa_kv_pool.py"
HYBRID_CONTROLLER = "sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py"
MODEL_RUNNER = "sglang/srt/model_executor/model_runner.py"

MARKERS = {
    "#38851 64-bit QSA gather offsets": (
        "sglang/srt/layers/attention/qsa/kernel.py",
        ["def _gather_qsa_compressed_keys_kernel(", "rows = (start + blocks).to(tl.int64)"],
    ),
    "#38851 64-bit sparse K/V compact offsets": (SPARSE_ATTN, ["src = slots.to(tl.int64)[:, None] * heads * dim"]),
    "#36738 load-back fenced behind the forward stream": (
        "sglang/srt/managers/cache_controller.py",
        ["host_to_device_stream.wait_stream(\n                self.load_fence_stream"],
    ),
    "#39446 compressed-key gather rows clamped": (
        "sglang/srt/layers/attention/qsa/mqa.py",
        ["k_cache[page_table.long().clamp_min(0).reshape(-1), :, 0]"],
    ),
    "#39446 compressed page table clamped": (
        "sglang/srt/layers/attention/qsa/metadata.py",
        ["(token_slot_table[:, ::full_page].long() // full_page)\n        .clamp_min(0)"],
    ),
}


@pytest.mark.parametrize("item", sorted(MARKERS))
def test_backport_present_in_parent(parent_tree: Path, item: str):
    path, needles = MARKERS[item]
    text = (parent_tree / path).read_text()
    missing = [n for n in needles if n not in text]
    assert not missing, f"{item}: {path} no longer contains {missing}"


# --- behavioural: #38851 zero-fill + FP8->BF16, #36743 wait before whole-slot copy ---------------------------


def run_probe(tree: Path) -> dict:
    return run_json("backport_probe.py", tree)


@pytest.fixture(scope="session")
def parent_probe(parent_tree: Path) -> dict:
    return run_probe(parent_tree)


def assert_gather_fixed(out: dict) -> None:
    assert out == {"rows_match_fp8_to_bf16": True, "padding_zero": True, "nan_left": False}, out


def assert_cow_fenced(out: dict) -> None:
    assert out["load_in_flight"] == [["wait_until", 6], ["copy_from", [4]]], out  # last Mamba layer, then copy
    assert out["no_load"] == [["copy_from", [4]]], out


def test_38851_strided_gather_zero_fills_and_converts_fp8(parent_probe: dict):
    """Run in Triton's CPU interpreter: every pad row of the page-strided scratch is 0, FP8 rows equal .to(bf16)."""
    assert_gather_fixed(parent_probe["qsa_gather"])


def test_36743_whole_slot_mamba_copy_waits_for_the_final_restored_layer(parent_probe: dict):
    assert_cow_fenced(parent_probe["mamba_cow_fence"])


READ_WAITS = {  # accessor: the calls it must make, in order (layer ids are model layers; start_layer 0)
    "mamba2_layer_cache": [["wait_until", 3], ["read_mamba", 1]],
    "short_conv_layer_cache": [["wait_until", 4], ["read_short_conv", 4]],
    "get_ngram_context": [["wait_until", 1], ["read_ngram", [2]]],  # the first Mamba layer carries the PLE state
}
READ_WAIT_ANCHORS = {  # accessor: (old, new) in memory_pool.py that drops just its wait
    "mamba2_layer_cache": (
        "        if self.layer_transfer_counter is not None:\n"
        "            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)\n"
        "        return self.mamba_map[layer_id]\n",
        "        return self.mamba_map[layer_id]\n",
    ),
    "short_conv_layer_cache": (
        "        if self.layer_transfer_counter is not None:\n"
        "            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)\n"
        "        return self.short_conv_pool.layer_cache(layer_id)\n",
        "        return self.short_conv_pool.layer_cache(layer_id)\n",
    ),
    "get_ngram_context": (
        "            self.layer_transfer_counter.wait_until(first_mamba_layer - self.start_layer)\n",
        "            pass\n",
    ),
}


@pytest.mark.parametrize("accessor", sorted(READ_WAITS))
def test_read_side_accessors_wait_for_their_layer(parent_probe: dict, accessor: str):
    assert parent_probe["read_side_waits"][accessor] == READ_WAITS[accessor]


def test_read_side_wait_guards_fail_on_a_doctored_parent(tree_copy: Path):
    """Drop each accessor's wait (memory_pool.py:1675, :1683, :1702): every one of those guards must then fail."""
    for old, new in READ_WAIT_ANCHORS.values():
        doctor(tree_copy / MEMORY_POOL, old, new)
    out = run_probe(tree_copy)["read_side_waits"]
    assert all(out[a] != READ_WAITS[a] for a in READ_WAITS), out


# The KV reads of an attention layer: the model's pool is QSATokenToKVPool (a HybridLinearKVPool: the waits sit in the
# wrapper, the inner MHATokenToKVPool's counter is cleared by the wrapper's registration); the plain pool is a
# non-hybrid model's. Probe: stage start_layer 2, full-attention layers 3 and 7 (inner rows 0, 1); plain pool layer 3.
KV_READ_WAITS = {
    "MHATokenToKVPool.get_key_buffer": [["wait_until", 1], ["read_k", 1]],
    "MHATokenToKVPool.get_value_buffer": [["wait_until", 1], ["read_v", 1]],
    "MHATokenToKVPool.get_kv_buffer": [["wait_until", 1], ["read_k", 1], ["wait_until", 1], ["read_v", 1]],
    "QSATokenToKVPool.get_key_buffer": [["wait_until", 5], ["read_k", 1]],  # wait: model layer 7 - start 2
    "QSATokenToKVPool.get_value_buffer": [["wait_until", 5], ["read_v", 1]],
    "QSATokenToKVPool.get_kv_buffer": [["wait_until", 5], ["read_k", 1], ["read_v", 1]],  # once, in the wrapper
    "QSATokenToKVPool.get_qsa_compressed_k_buffer": [["wait_until", 5], ["read_qsa_compressed_k", 1]],
}
_MHA_WAIT = (
    "        if self.layer_transfer_counter is not None:\n"
    "            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)\n"
)
_HYBRID_WAIT = "        self._wait_for_layer(layer_id)\n"


def _drop_wait_after(path: str, head: str, wait: str = _HYBRID_WAIT) -> tuple[str, str, str]:
    return path, head + wait, head


def _drop_wait_before(path: str, tail: str, wait: str = _MHA_WAIT) -> tuple[str, str, str]:
    return path, wait + tail, tail


KV_READ_WAIT_ANCHORS = {  # accessor: (file, old, new) that drops just its wait
    "MHATokenToKVPool.get_key_buffer": (  # the comment makes it this class's (MHATokenToKOnlyPool has the same)
        MEMORY_POOL,
        "        # same applies to get_value_buffer and get_kv_buffer\n"
        + _MHA_WAIT
        + "        return self._get_key_buffer(layer_id)\n",
        "        # same applies to get_value_buffer and get_kv_buffer\n        return self._get_key_buffer(layer_id)\n",
    ),
    "MHATokenToKVPool.get_value_buffer": _drop_wait_before(
        MEMORY_POOL, "        return self._get_value_buffer(layer_id)\n"
    ),
    "MHATokenToKVPool.get_kv_buffer": (  # no wait of its own: it reads through the two waiting accessors
        MEMORY_POOL,
        "        return self.v_head_dim\n\n    def get_kv_buffer(self, layer_id: int):\n"
        "        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)\n",
        "        return self.v_head_dim\n\n    def get_kv_buffer(self, layer_id: int):\n"
        "        return self._get_key_buffer(layer_id), self._get_value_buffer(layer_id)\n",
    ),
    "QSATokenToKVPool.get_key_buffer": _drop_wait_after(  # HybridLinearKVPool's, as are the next two
        MEMORY_POOL, "    def get_key_buffer(self, layer_id: int, scale: Optional[float] = None):\n"
    ),
    "QSATokenToKVPool.get_value_buffer": _drop_wait_after(
        MEMORY_POOL, "    def get_value_buffer(self, layer_id: int, scale: Optional[float] = None):\n"
    ),
    "QSATokenToKVPool.get_kv_buffer": _drop_wait_after(MEMORY_POOL, "    def get_kv_buffer(self, layer_id: int):\n"),
    "QSATokenToKVPool.get_qsa_compressed_k_buffer": _drop_wait_after(
        QSA_KV_POOL, "        # The indexer reads compressed keys before attention reads the full KV.\n"
    ),
}


@pytest.mark.parametrize("accessor", sorted(KV_READ_WAITS))
def test_kv_read_accessors_wait_for_their_layer(parent_probe: dict, accessor: str):
    """Recorded on CPU: the layer's wait_until, then its read (KV, and the QSA indexer's compressed keys)."""
    assert parent_probe["kv_read_waits"][accessor] == KV_READ_WAITS[accessor]


def test_kv_read_wait_guards_fail_on_a_doctored_parent(tree_copy: Path):
    """Drop each KV accessor's wait (memory_pool.py:2856-2857, :2877-2878, :2889, :4478, :4485, :4492;
    qsa_kv_pool.py:256): each guard fails by name, the accessor still reading the same rows, just unwaited."""
    for path, old, new in KV_READ_WAIT_ANCHORS.values():
        doctor(tree_copy / path, old, new)
    out = run_probe(tree_copy)["kv_read_waits"]
    unwaited = {a: [c for c in calls if c[0] != "wait_until"] for a, calls in KV_READ_WAITS.items()}
    assert out == unwaited, out
    assert all(out[a] != KV_READ_WAITS[a] for a in KV_READ_WAITS), out



# The MTP draft's KV/QSA pools get no layer counter (hybrid_pool_assembler.py:2506-2512 registers one on drafts only
# for page-interleaved pools): their reads rely on each draft being loaded inside the target's layer loop, before the
# target's final layer event, which the target forward waits on before the draft forward runs on the same stream.
DRAFT_LOAD_LAYERS = {"draft0": {"steps": [0], "host_layers": [4]}, "draft1": {"steps": [1], "host_layers": [5]}}


def test_mtp_drafts_load_before_the_final_target_layer_event(parent_probe: dict):
    assert parent_probe["draft_load_layers"] == DRAFT_LOAD_LAYERS


def test_mtp_draft_load_guard_fails_on_a_doctored_parent(tree_copy: Path):
    """Issue the drafts after the target's layer loop (hybrid_cache_controller.py:934): the guard fails."""
    doctor(
        tree_copy / HYBRID_CONTROLLER,
        "expected_layer_id: int = min(depth, self.transfer_layer_id_max - 1),",
        "expected_layer_id: int = self.transfer_layer_id_max + depth,",
    )
    out = run_probe(tree_copy)["draft_load_layers"]
    assert out != DRAFT_LOAD_LAYERS, out


def test_behavioural_guards_fail_on_a_doctored_parent(tree_copy: Path):
    """Drop the zero-fill store mask and the COW wait: both guards must then fail."""
    doctor(
        tree_copy / SPARSE_ATTN,
        "store_mask = (cols < pad_cols)[:, None] & (dims[None, :] < dim)",
        "store_mask = load_mask",
    )
    doctor(
        tree_copy / MEMORY_POOL,
        "self.layer_transfer_counter.wait_until(last_mamba_layer - self.start_layer)\n",
        "pass\n",
    )
    out = run_probe(tree_copy)
    with pytest.raises(AssertionError):
        assert_gather_fixed(out["qsa_gather"])
    with pytest.raises(AssertionError):
        assert_cow_fenced(out["mamba_cow_fence"])


def doctor(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: doctoring anchor not unique"
    path.write_text(text.replace(old, new))


# --- structural (AST / kernel body): call sites and the GPU-only #38290 waits ---------------------------------


def function(source: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)


def router_triton_problems(source: str, kernel: str = "_router_triton_kernel") -> list[str]:
    """_router_triton_kernel: gdc_wait() must come before every tl.load (bias, token bias, scores, ...)."""
    fn = function(source, kernel)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    waits = [c.lineno for c in calls if ast.unparse(c.func) == "tl.extra.cuda.gdc_wait"]
    loads = [(c.lineno, ast.unparse(c.args[0])) for c in calls if ast.unparse(c.func) == "tl.load" and c.args]
    if not waits:
        return ["no gdc_wait"]
    if not any("bias_ptr" in arg for _, arg in loads):
        return ["bias load not found"]
    return [f"tl.load({arg}) at line {line} before the wait" for line, arg in loads if line < min(waits)]


def router_sm120_problems(source: str) -> list[str]:
    """_sm120_router_top22_kernel (the SM 12.0 small-batch top-22 router, same file): the same wait-first order."""
    return router_triton_problems(source, "_sm120_router_top22_kernel")


def cuda_body(source: str, signature: str) -> str:
    """The brace-matched body of the first function whose header matches ``signature``."""
    start = source.index("{", re.search(signature, source).end())
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start : i + 1]
    raise AssertionError(f"unbalanced braces after {signature}")


def router_radix_problems(source: str) -> list[str]:
    """route_radix_block and fused_front_epilogue_kernel: PDLWaitPrimary before the bias/score reads."""
    problems = []
    block = cuda_body(source, r"SGL_DEVICE void route_radix_block\(")
    wait = block.find("PDLWaitPrimary<kUsePDL>();")
    for read in ("bias_vec.load(params.bias", "scores_vec.load(scores"):
        if wait < 0 or not wait < block.find(read):
            problems.append(f"route_radix_block: {read} not after PDLWaitPrimary")
    front = cuda_body(source, r"void fused_front_epilogue_kernel\(")
    wait = front.find("PDLWaitPrimary<kUsePDL>();")
    if wait < 0 or not wait < front.find("fgt_select_topk<"):
        problems.append("fused_front_epilogue_kernel: fgt_select_topk (loads bias) not after PDLWaitPrimary")
    return problems


def strided_gather_problems(source: str) -> list[str]:
    """_forward_trtllm_sparse must gather with zero_fill_cols (the page-strided layout the paged kernel reads)."""
    fn = function(source, "_forward_trtllm_sparse")
    calls = [
        c
        for c in ast.walk(fn)
        if isinstance(c, ast.Call) and ast.unparse(c.func) == "qwen_sparse_kv_extraction_compact_triton"
    ]
    if not any(k.arg == "zero_fill_cols" for c in calls for k in c.keywords):
        return ["_forward_trtllm_sparse gathers without zero_fill_cols"]
    return []


def deferred_cow_problems(source: str) -> list[str]:
    """The deferred COW must go through copy_mamba_state (which fences), never mamba_pool.copy_from directly."""
    fn = function(source, "_maybe_execute_deferred_mamba_cow_and_clear")
    names = [ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)]
    problems = [] if "pool.copy_mamba_state" in names else ["COW does not call pool.copy_mamba_state"]
    return problems + [f"unfenced {n}" for n in names if n.endswith("mamba_pool.copy_from")]


def load_fence_wiring_problems(source: str) -> list[str]:
    """The scheduler must hand the forward stream to the cache controller as its H2D load fence (#36738's wiring):
    without it ``HiCacheController.load`` has nothing to wait on and a load-back can overtake the forward."""
    assigns = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign)]
    wired = [
        a for a in assigns
        if any(ast.unparse(t) == "cache_controller.load_fence_stream" for t in a.targets)
        and ast.unparse(a.value).endswith("model_runner.forward_stream")
    ]  # fmt: skip
    return [] if wired else ["cache_controller.load_fence_stream is not set to the forward stream"]


def qsa_group_clamp_problems(source: str) -> list[str]:
    """QSA indexer extend path: compressed-key group rows clamped to the chunk (clamp_max) before the gather."""
    assigns = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign)]
    clamped = [
        a for a in assigns
        if ast.unparse(a.targets[0]) == "group_locs" and ast.unparse(a.value).startswith("group_locs.clamp_max(")
    ]  # fmt: skip
    return [] if clamped else ["group_locs are not clamped to the source keys"]


STRUCTURAL = {
    "#36738 H2D load fence wired in the scheduler": ("sglang/srt/managers/scheduler.py", load_fence_wiring_problems),
    "QSA indexer clamps compressed-key group rows": (
        "sglang/srt/layers/attention/qsa/qsa_indexer.py", qsa_group_clamp_problems
    ),
    "#38290 Triton router waits before bias load": (ROUTER_TRITON, router_triton_problems),
    "#38290 radix router waits before bias load": (ROUTER_RADIX, router_radix_problems),
    "#38290 sm120 top-22 router waits before bias load": (ROUTER_TRITON, router_sm120_problems),
    "#38851 strided decode gather zero-fills": (QSA_BACKEND, strided_gather_problems),
    "#36743 deferred COW uses the fenced copy": (MODEL_RUNNER, deferred_cow_problems),
}

WAIT = "    if USE_PDL:\n        tl.extra.cuda.gdc_wait()\n"
DOCTORED = {  # [(old, new), ...]: the parent with the fix undone (the pre-fix order where there was one)
    "#36738 H2D load fence wired in the scheduler": [
        ("cache_controller.load_fence_stream = (\n                    self.tp_worker.model_runner.forward_stream",
         "cache_controller.load_fence_stream = (\n                    None")
    ],
    "QSA indexer clamps compressed-key group rows": [
        ("            group_locs = group_locs.clamp_max(source_keys.shape[0] - 1)\n", "")
    ],
    "#38290 Triton router waits before bias load": [
        (WAIT + "\n", ""),
        ("    live_m = mask_m\n", WAIT + "    live_m = mask_m\n"),
    ],
    "#38290 sm120 top-22 router waits before bias load": [
        (
            WAIT + "    scores = tl.load(scores_ptr + row * stride_sm + n * stride_sn).to(tl.float32)\n"
            "    bias = tl.load(bias_ptr + n).to(tl.float32)\n",
            "    scores = tl.load(scores_ptr + row * stride_sm + n * stride_sn).to(tl.float32)\n"
            "    bias = tl.load(bias_ptr + n).to(tl.float32)\n" + WAIT,
        )
    ],
    "#38290 radix router waits before bias load": [
        (
            "    PDLWaitPrimary<kUsePDL>();\n    bias_vec.load(params.bias, tx);\n",
            "    bias_vec.load(params.bias, tx);\n    PDLWaitPrimary<kUsePDL>();\n",
        )
    ],
    "#38851 strided decode gather zero-fills": [("                zero_fill_cols=stride,\n", "")],
    "#36743 deferred COW uses the fenced copy": [("pool.copy_mamba_state(\n", "pool.mamba_pool.copy_from(\n")],
}


@pytest.mark.parametrize("item", sorted(STRUCTURAL))
def test_structural_guard_holds_on_parent(parent_tree: Path, item: str):
    path, check = STRUCTURAL[item]
    assert check((parent_tree / path).read_text()) == []


@pytest.mark.parametrize("item", sorted(STRUCTURAL))
def test_structural_guard_fails_on_doctored_source(parent_tree: Path, item: str):
    path, check = STRUCTURAL[item]
    source = (parent_tree / path).read_text()
    for old, new in DOCTORED[item]:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    assert check(source) != []
