"""The host pools of the real-GPU engine run (bench/gpu_engine.md, 2026-12-04), reproduced on CPU with the runtime.

The H200 run of tests/gpu/data/tiny-qhc.yaml logged, per rank, host pools far from what `qwen-hicache size` said
(KV 1,185,728 tokens and 13 Mamba slots at TP 1, where the operator said 495,296 and 1,878). The cause is not in
the operator's rules but in one input: `hicache.deviceKVTokens: 32768` was never given to the runtime (the operator
rendered no `--max-total-tokens`; it does now), so the runtime profiles its device pool from free GPU memory x
`--mem-fraction-static` (`mem_cache/kv_cache_configurator.py:2990-3060`, logged as `#tokens`), and
`--hicache-size` is split in proportion to that pool's bytes against the device Mamba state
(`mem_cache/hybrid_cache/hybrid_pool_assembler.py:239-263,1328-1340`). A device pool 347 times larger gives the
Mamba host pool a 0.4 % share: 13 slots, fewer than the 40 on the GPU.

This test executes that code path (pool_probe.py: the runtime's argument resolution, device pool constructors and
`_MambaStrategy.build`) on the tiny checkpoint's own config.json (tests/gpu/tiny_model.py) with the device pools
each server logged, and requires the runtime to give the logged host figures and the operator to agree exactly.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml
from conformance.pool_runner import run_pool_probe
from qwen_hicache.derive import launch_sizing
from qwen_hicache.launch import launch_args
from qwen_hicache.sizing import compute_sizing
from qwen_hicache.spec import QwenHiCacheServerSpec

from harness.sim.sglang_tree import patched_sglang_tree, tree_info

TESTS = Path(__file__).resolve().parents[1]
SPEC = TESTS / "gpu" / "data" / "tiny-qhc.yaml"

LOGGED = [
    # (TP, device '#tokens' the server logged, host KV tokens, host Mamba slots, QSA index pages): server-cold.log
    # of /work/.device/22/tp1 (call 22) and of /work/.device/20/tp2 (call 20: its two cold starts, the first
    # beside the failed TP 1 attempt on GPU 1, hence the smaller pool).
    (1, 11_376_128, 1_185_728, 13, 18_527),
    (2, 21_002_880, 2_188_224, 14, 34_191),
    (2, 15_768_064, 2_186_624, 19, 34_166),
    # the first run with --max-total-tokens rendered from deviceKVTokens: 65,536 '#tokens' logged, as stated
    # (server-cold.log of /work/.device/36/tp1, 2026-12-04 15:31 UTC; `qwen-hicache size` gave the same figures)
    (1, 65_536, 699_264, 1_327, 10_926),
    # what `qwen-hicache size` assumed, for the record: the runtime agrees once its device pool is 32,768 tokens
    (1, 32_768, 495_296, 1_878, 7_739),
]


UNALIGNED = 65_536 + 100
"""A deviceKVTokens that is not a multiple of the page (64)."""


def _tiny_model():
    spec = importlib.util.spec_from_file_location("tiny_model", TESTS / "gpu" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spec(tp: int, device_tokens: int) -> QwenHiCacheServerSpec:
    raw = copy.deepcopy(yaml.safe_load(SPEC.read_text())["spec"])
    raw["runtime"]["tensorParallelSize"] = tp
    raw["hicache"]["deviceKVTokens"] = device_tokens
    return QwenHiCacheServerSpec.model_validate(raw)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tree = patched_sglang_tree()
    assert tree_info(tree)["patched"], tree_info(tree)
    work = tmp_path_factory.mktemp("gpu-run-sizing")
    model = work / "tiny-qwen4-exp"
    model.mkdir()
    _tiny_model().write_config(model)
    payload = []
    for tp, device, *_ in LOGGED:
        spec = _spec(tp, device)
        args = launch_args(spec, launch_sizing(compute_sizing(spec)))
        args[args.index("--model-path") + 1] = str(model)
        payload.append({"name": f"tp{tp}-{device}", "device_kv_tokens": device,
                        "args": [a for a in args if not a.startswith("--admin-api-key=")]})
    # A stated pool that is not whole pages, under a GPU budget far larger: the runtime's own cap and alignment.
    spec = _spec(1, UNALIGNED)
    args = launch_args(spec, launch_sizing(compute_sizing(spec)))
    args[args.index("--model-path") + 1] = str(model)
    payload.append({"name": "unaligned", "device_kv_tokens": 65_536, "budget_bytes": 64 << 30,
                    "args": [a for a in args if not a.startswith("--admin-api-key=")]})
    return run_pool_probe(tree, work, payload, timeout=600)


@pytest.mark.parametrize(("tp", "device", "kv", "slots", "pages"), LOGGED, ids=[f"tp{c[0]}-{c[1]}" for c in LOGGED])
def test_runtime_and_operator_give_the_logged_host_pools(
    runtime: dict[str, dict], tp: int, device: int, kv: int, slots: int, pages: int
) -> None:
    got = runtime[f"tp{tp}-{device}"]
    assert "error" not in got, got.get("trace")
    host = got["host"]
    assert (got["device"]["kv_tokens"], host["kv_tokens"], host["mamba_slots"], host["index_pages"]) == (
        device, kv, slots, pages,
    )
    s = compute_sizing(_spec(tp, device))
    assert (s.host.kv_tokens, s.host.mamba_slots, s.host.total_bytes) == (
        host["kv_tokens"], host["mamba_slots"], host["allocated_bytes"],
    )
    assert (s.shapes.kv_bytes_per_token, s.shapes.mamba_bytes_per_slot) == (
        host["kv_bytes_per_token"], host["mamba_bytes_per_slot"],
    )
    # the split's weights: the device target KV bytes against the device Mamba state
    assert host["split_weights"] == [[s.device.kv_bytes, s.device.mamba_bytes]]


def test_the_split_follows_the_device_pool_the_runtime_profiles(runtime: dict[str, dict]) -> None:
    """The same spec and --hicache-size: the Mamba host slots fall as the profiled device KV pool grows, so the
    host sizes are only known when the device pool is (deviceKVTokens must be what the runtime logs)."""
    slots = {device: runtime[f"tp1-{device}"]["host"]["mamba_slots"] for tp, device, *_ in LOGGED if tp == 1}
    assert slots[11_376_128] < 40 < slots[32_768]


def test_the_rendered_pool_cap_is_the_pool_the_runtime_builds(runtime: dict[str, dict]) -> None:
    """`--max-total-tokens` as rendered from an unaligned deviceKVTokens, through the runtime's own
    `config_from_budget` (its user cap, then page alignment) with room for far more: the operator sized that pool."""
    got = runtime["unaligned"]
    assert "error" not in got, got.get("trace")
    assert got["budget_tokens"] == compute_sizing(_spec(1, UNALIGNED)).device.kv_tokens == 65_600
