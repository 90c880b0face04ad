"""The operator's sizing against sglang 0.5.23's own pool constructors, case by case.

One subprocess runs the whole matrix (`pool_probe.py`): the patched 0.5.23 tree resolves the arguments the
operator renders, builds the device pools (meta tensors) and the hybrid HiCache host pools
(`build_hybrid_mamba_stack` through `_MambaStrategy`), and reports what they allocate per rank. The operator
must agree exactly: host KV tokens, host Mamba slots, host bytes, device pool bytes and the request cap.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance.matrix import cases, runtime_args
from conformance.pool_runner import run_pool_probe
from qwen_hicache.sizing import compute_sizing
from qwen_hicache.spec import QwenHiCacheServerSpec

from harness.sim.sglang_tree import patched_sglang_tree, tree_info

CASES = cases()


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    if not _torch_available():
        pytest.fail("torch is missing: run `python -m harness.runtime_env` (make test does)")
    tree = patched_sglang_tree()
    assert tree_info(tree)["patched"], tree_info(tree)
    work = tmp_path_factory.mktemp("conformance")
    payload = []
    for case in CASES:
        spec = QwenHiCacheServerSpec.model_validate(case["spec"])
        payload.append({"name": case["name"], "args": runtime_args(spec, case["arch"]),
                        "device_kv_tokens": spec.hicache.device_kv_tokens})
    return run_pool_probe(tree, work, payload, timeout=900)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_operator_sizes_what_the_runtime_allocates(case: dict, runtime: dict[str, dict]) -> None:
    got = runtime[case["name"]]
    assert "error" not in got, got.get("trace")
    s = compute_sizing(QwenHiCacheServerSpec.model_validate(case["spec"]))
    dev, host = got["device"], got["host"]
    assert got["page_size"] == s.page_size
    assert (host["kv_tokens"], host["mamba_slots"], host["allocated_bytes"]) == (
        s.host.kv_tokens, s.host.mamba_slots, s.host.total_bytes,
    )
    assert (host["kv_bytes_per_token"], host["mamba_bytes_per_slot"]) == (
        s.shapes.kv_bytes_per_token, s.shapes.mamba_bytes_per_slot,
    )
    assert host.get("index_bytes_per_token", 0) * s.page_size == s.shapes.index_bytes_per_page
    assert (dev["kv_tokens"], dev["mamba_slots"], dev["max_running_requests"]) == (
        s.device.kv_tokens, s.device.mamba_slots, s.device.running_requests,
    )
    assert (sum(dev["target_kv"]), dev["index_bytes"], dev["mamba_bytes"]) == (
        s.device.kv_bytes, s.device.index_bytes, s.device.mamba_bytes,
    )
    assert dev["mamba_spec_states"] == (s.device.spec_states if case["spec"]["runtime"].get("speculative") else None)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_runtime_keeps_the_radix_cache_and_hicache_on(case: dict, runtime: dict[str, dict]) -> None:
    """What the runtime's resolution makes of the rendered arguments: HiCache on, and the radix cache under it never
    turned off (deterministic mode turns it off for attention backends it cannot replay; not for the ones here)."""
    got = runtime[case["name"]]
    assert "error" not in got, got.get("trace")
    resolved = got["resolved"]
    assert resolved["enable_hierarchical_cache"] is True and resolved["disable_radix_cache"] is False, resolved
    switched = "--enable-deterministic-inference" in case["spec"]["runtime"].get("extraArgs", [])
    assert resolved["enable_deterministic_inference"] is switched
    if switched:
        assert (resolved["attention_backend"], resolved["sampling_backend"]) == ("fa3", "pytorch"), resolved


def test_the_example_gets_the_runtime_figures(runtime: dict[str, dict]) -> None:
    """The issue's reference point: TP2, FP8, NEXTN, 30 GB -> 2,143,040 tokens and 467 slots per rank."""
    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/qwenhicache.yaml").read_text())["spec"]
    s = compute_sizing(QwenHiCacheServerSpec.model_validate(raw))
    assert (s.host.kv_tokens, s.host.mamba_slots, s.host.total_bytes) == (2_143_040, 467, 29_871_127_856)


def test_matrix_covers_what_the_issue_asks() -> None:
    names = [c["name"] for c in CASES]
    for word in ("flash-next", "qwen3-next", "qwen3.5", "tp1", "tp2", "tp4", "tp8", "16GB", "30GB", "45GB",
                 "ratio", "fp8_e4m3", "bf16", "auto", "-mtp", "nomtp", "slots", "split", "capped", "default",
                 "deterministic"):
        assert any(word in n for n in names), word
