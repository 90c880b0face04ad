"""Geometry: config.json readers, the built-in profile, overrides and the errors for unreadable input."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from qwen_hicache.geometry import (
    PROFILES,
    Geometry,
    GeometryError,
    from_hf_config,
    profile_fields_merged,
    resolve_geometry,
)

HF = Path(__file__).parent / "data" / "hf"


def hf(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def test_flash_next_profile_matches_a_qwen4_exp_config():
    """The shipped profile is what the config reader derives from a Flash-Next-shaped config.json."""
    derived = from_hf_config(hf("qwen4_exp")).model_dump(exclude_none=True)
    profile = PROFILES["qwen3.8-flash-next"].model_dump(exclude_none=True)
    calibration_only = {"gpu_weight_bytes", "v_head_dim"}
    assert {k: v for k, v in profile.items() if k not in calibration_only} == derived


def test_qwen4_exp_ple_and_qsa_follow_the_runtime_config_class():
    """Qwen4ExpTextConfig: PLE window (hidden x hc_count, (kernel-1) x ngram); table heads x base rows."""
    g = from_hf_config(hf("qwen4_exp"))
    assert (g.full_attention_layers, g.linear_attention_layers) == (12, 36)
    assert (g.ple_channels, g.ple_conv_kernel_size, g.ngram_size) == (2560 * 4, 4, 3)
    assert g.ple_table_rows == 2 * 8 * 20_000_000 and g.ple_table_row_dim == 2560 // 16
    assert g.ple_table_dtype == "float8_e4m3fn" and g.ple_table_pinned  # declared ple_embedding_dtype
    assert (g.qsa_index_kv_heads, g.qsa_index_head_dim, g.qsa_compress_ratio) == (1, 128, 4)


def test_qwen3_next_counts_layers_from_the_interval():
    g = from_hf_config(hf("qwen3_next"))
    assert (g.full_attention_layers, g.linear_attention_layers) == (12, 36)
    assert (g.num_key_value_heads, g.head_dim) == (2, 256)
    assert g.mtp_layers == 0  # the real config declares no MTP field; NEXTN still loads one draft layer
    assert (g.linear_num_key_heads, g.linear_num_value_heads) == (16, 32)
    assert not g.qsa_compress_ratio and not g.ple_short_conv_layers


def test_qwen3_5_reads_the_nested_text_config_and_layer_types():
    cfg = hf("qwen3_5")
    cfg["text_config"]["layer_types"][0] = "full_attention"  # layer_types wins over the interval
    g = from_hf_config(cfg)
    assert (g.full_attention_layers, g.linear_attention_layers) == (17, 47)
    assert (g.num_key_value_heads, g.linear_num_value_heads, g.mtp_layers) == (4, 48, 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "llama"}, "unsupported model_type 'llama'"),
        ([1, 2], "must be a JSON object"),
        ({"model_type": "qwen3_next", "num_hidden_layers": 4, "head_dim": 64}, "no 'num_key_value_heads'"),
        (
            {"model_type": "qwen3_5", "text_config": {"layer_types": ["sliding_attention"]}},
            "sliding_attention",
        ),
    ],
)
def test_unreadable_configs_raise_a_specific_error(config, message):
    with pytest.raises(GeometryError, match=message):
        from_hf_config(config)


def test_missing_linear_dims_are_named():
    cfg = hf("qwen3_next")
    del cfg["linear_num_value_heads"]
    with pytest.raises(GeometryError, match="linear_num_value_heads"):
        from_hf_config(cfg)


def test_a_config_json_states_every_feature_so_nothing_is_merged_from_the_profile():
    g = from_hf_config(hf("qwen3_next"))
    own = g.model_dump(exclude_none=True)
    for absent in ("qsa_index_kv_heads", "qsa_compress_ratio", "ple_short_conv_layers", "ple_table_rows"):
        assert own[absent] == 0
    model = SimpleNamespace(profile="qwen3.8-flash-next", geometry=g)
    assert not resolve_geometry(model).qsa_compress_ratio and not resolve_geometry(model).ple_table_pinned


def test_profile_fields_a_partial_geometry_inherits_are_named():
    model = SimpleNamespace(profile="qwen3.8-flash-next", geometry=Geometry(num_key_value_heads=4))
    merged = profile_fields_merged(model)
    assert "qsaCompressRatio" in merged and "numKeyValueHeads" not in merged
    assert profile_fields_merged(SimpleNamespace(profile=None, geometry=Geometry(num_key_value_heads=4))) == []


def test_ple_table_dtype_follows_the_runtime_rule():
    cfg = hf("qwen4_exp")
    del cfg["text_config"]["ple_embedding_dtype"]
    assert from_hf_config(cfg).ple_table_dtype == "bfloat16"  # NVFP4 checkpoint, no FP8 entry: bf16 table
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.language_model.layers.1.ple.ngram_embedding": {"quant_algo": "FP8"}}}
    assert from_hf_config(cfg).ple_table_dtype == "float8_e4m3fn"


def test_checkpoint_fp8_kv_is_read_from_the_quantization_config():
    cfg = hf("qwen4_exp")
    assert from_hf_config(cfg).checkpoint_kv_fp8 is False
    cfg["quantization_config"]["kv_cache_quant_algo"] = "FP8"
    assert from_hf_config(cfg).checkpoint_kv_fp8 is True


def test_explicit_geometry_overrides_the_profile_field_by_field():
    model = SimpleNamespace(profile="qwen3.8-flash-next", geometry=Geometry(num_key_value_heads=4))
    g = resolve_geometry(model)
    assert g.num_key_value_heads == 4
    assert g.linear_num_value_heads == PROFILES["qwen3.8-flash-next"].linear_num_value_heads


def test_geometry_without_profile_must_be_complete():
    partial = Geometry(full_attention_layers=4, linear_attention_layers=12)
    with pytest.raises(GeometryError, match="numKeyValueHeads.*missing"):
        resolve_geometry(SimpleNamespace(profile=None, geometry=partial))


def test_config_derived_geometry_resolves_without_profile_and_defaults_absent_features():
    g = resolve_geometry(SimpleNamespace(profile=None, geometry=from_hf_config(hf("qwen3_next"))))
    assert g.qsa_compress_ratio == 0 and g.ple_short_conv_layers == 0


def test_partial_qsa_is_refused():
    model = SimpleNamespace(profile="qwen3.8-flash-next", geometry=Geometry(qsa_index_head_dim=0))
    with pytest.raises(GeometryError, match="QSA geometry is partial"):
        resolve_geometry(model)


def test_every_field_is_optional_camel_case_and_documented():
    """Field docstrings become CRD descriptions; every field may be left out to inherit the profile."""
    schema = Geometry.model_json_schema(by_alias=True)
    for name, info in Geometry.model_fields.items():
        assert not info.is_required(), name
        assert info.description, f"{name} has no docstring"
        assert "_" not in (info.alias or name), name
    assert "numKeyValueHeads" in schema["properties"]
