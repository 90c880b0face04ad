"""Fingerprint goldens: a refactor must never change a fingerprint by accident (that would orphan caches)."""

from __future__ import annotations

import pytest
from qwen_hicache.fingerprint import FINGERPRINT_VERSION, fingerprint, fingerprint_inputs
from qwen_hicache.plan import parse_spec
from resources import example, variant

GOLDEN_EXAMPLE = "v1-f63bb5db60c6a3ef"


def _fp(**changes: object) -> str:
    return fingerprint(parse_spec(variant(**changes)["spec"]))


def test_golden_fingerprint_of_the_example() -> None:
    assert FINGERPRINT_VERSION == 1
    assert fingerprint(parse_spec(example()["spec"])) == GOLDEN_EXAMPLE


@pytest.mark.parametrize("changes", [
    {"spec.model.revision": "0000000deadbeef"},
    {"spec.model.servedName": "other"},
    {"spec.runtime.kvCacheDtype": "bf16"},
    {"spec.runtime.mambaSsmDtype": "float32"},
    {"spec.runtime.pageSize": 32},
    {"spec.runtime.tensorParallelSize": 4},
    {"spec.runtime.speculative": None},
    {"spec.runtime.dtype": "float16"},
    {"spec.runtime.quantization": "fp8"},
    {"spec.runtime.image": "registry.example.com/qwen-hicache/sglang@sha256:" + "1" * 64},
    {"spec.hicache.memLayout": "page_first_direct", "spec.hicache.ioBackend": "direct"},
    {"spec.model.geometry": {"numKeyValueHeads": 4}},
    {"spec.runtime.extraArgs": ["--json-model-override-args", '{"x": 1}']},
    {"spec.runtime.extraArgs": ["--enable-deterministic-inference"]},
], ids=lambda c: ",".join(c))
def test_every_byte_affecting_input_changes_the_fingerprint(changes: dict) -> None:
    assert _fp(**changes) != GOLDEN_EXAMPLE


@pytest.mark.parametrize("changes", [
    {"spec.replicas": 5},
    {"spec.restart": "2026-12-02"},
    {"spec.hicache.hostMemoryPerRankGB": 20},
    {"spec.hicache.writePolicy": "write_back"},
    {"spec.hicache.disk": {"enabled": True, "size": "2Ti"}},
    {"spec.runtime.maxRunningRequests": 8},
    {"spec.runtime.extraArgs": ["--log-level", "debug"]},
    {"spec.runtime.image": "other.example.com/mirror/sglang@sha256:0f4b9d1c2e3a4b5c6d7e8f90123456789abcdef"
                          "0123456789abcdef012345678"},
], ids=lambda c: ",".join(c))
def test_inputs_that_do_not_change_page_bytes_keep_the_cache(changes: dict) -> None:
    assert _fp(**changes) == GOLDEN_EXAMPLE


def test_inputs_are_documented_in_status_form() -> None:
    inputs = fingerprint_inputs(parse_spec(example()["spec"]))
    assert {"runtimeImage", "modelRevision", "kvCacheDtype", "pageSize", "memLayout", "speculativeAlgorithm",
            "tensorParallelSize", "mambaSsmDtype"} <= set(inputs)
    assert "gpuWeightBytes" not in inputs["geometry"]


def test_runtime_series_matches_the_patch_manifest() -> None:
    import json

    from qwen_hicache.fingerprint import RUNTIME_SERIES
    from resources import ROOT

    assert json.loads((ROOT / "runtime_patches" / "manifest.json").read_text())["series_version"] == RUNTIME_SERIES


@pytest.mark.parametrize(("written", "spelled_out"), [
    (["--json-model-override", '{"x": 1}'], ["--json-model-override-args", '{"x": 1}']),
    (["--json-model-override={\"x\": 1}"], ["--json-model-override-args={\"x\": 1}"]),
    (["--enable-deterministic"], ["--enable-deterministic-inference"]),
])
def test_an_abbreviation_the_runtime_accepts_is_the_flag(written: list[str], spelled_out: list[str]) -> None:
    """argparse reads an unambiguous prefix as the flag, so the cache must too (else a changed model override,
    abbreviated, would reuse pages of the old one)."""
    assert _fp(**{"spec.runtime.extraArgs": written}) == _fp(**{"spec.runtime.extraArgs": spelled_out})
    assert _fp(**{"spec.runtime.extraArgs": written}) != GOLDEN_EXAMPLE


def test_a_switch_takes_no_value() -> None:
    """The deterministic switch has no value: the flag after it is read as a flag, not swallowed as its value."""
    args = ["--enable-deterministic-inference", "--json-model-override-args", '{"x": 1}', "--log-level", "debug"]
    inputs = fingerprint_inputs(parse_spec(variant(**{"spec.runtime.extraArgs": args})["spec"]))
    assert inputs["modelOverrides"] == args[:3]
