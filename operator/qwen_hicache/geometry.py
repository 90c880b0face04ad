"""Model geometry: the per-layer shapes that decide how many bytes a cached token and a state slot take.

Every field is optional so a spec can override single values of a built-in profile or a `config.json`.
`resolve_geometry` merges profile and overrides and refuses a geometry that cannot be sized.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from .typed import ApiModel

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
PleTableDtype = Literal["bfloat16", "float8_e4m3fn"]
SsmDtypeName = Literal["float32", "bfloat16", "float16"]


class GeometryError(ValueError):
    """A geometry that cannot be read or is incomplete; the message names the field and the fix."""


class Geometry(ApiModel):
    """Shapes of a hybrid (full attention + GDN/Mamba) Qwen model, as in its Hugging Face `config.json`."""

    full_attention_layers: NonNegative | None = None
    """Decoder layers with full (QSA) attention: they hold KV."""
    linear_attention_layers: NonNegative | None = None
    """Decoder layers with GDN linear attention: they hold a Mamba (conv + SSM) state instead of KV."""
    num_key_value_heads: Positive | None = None
    """KV heads of a full-attention layer (split across TP ranks; at least one per rank)."""
    head_dim: Positive | None = None
    """Key head dimension of a full-attention layer."""
    v_head_dim: Positive | None = None
    """Value head dimension of a full-attention layer; `headDim` when unset."""
    linear_num_key_heads: Positive | None = None
    """GDN key heads (`linear_num_key_heads`): the conv state carries query and key channels for them."""
    linear_num_value_heads: Positive | None = None
    """GDN value heads (`linear_num_value_heads`): the SSM state has one head x keyDim x valueDim per head."""
    linear_key_head_dim: Positive | None = None
    """GDN key head dimension (`linear_key_head_dim`)."""
    linear_value_head_dim: Positive | None = None
    """GDN value head dimension (`linear_value_head_dim`)."""
    linear_conv_kernel_dim: Positive | None = None
    """GDN short-convolution kernel width (the conv state keeps kernel-1 positions)."""
    mamba_ssm_dtype: SsmDtypeName | None = None
    """The checkpoint's SSM state dtype (`mamba_ssm_dtype`), used when `runtime.mambaSsmDtype` is unset."""
    mtp_layers: NonNegative | None = None
    """MTP layers the checkpoint declares (`mtp_num_hidden_layers`). Informational for sizing: with speculative
    decoding sglang 0.5.23 loads exactly one MTP draft layer for every supported model type, declared or not
    (`srt/configs/model_config.py:1133-1181`), and packs its KV into the host KV pool."""
    mtp_linear_layers: NonNegative | None = None
    """MTP draft layers with their own GDN state packed into the Mamba host slot (0 for every supported model
    type: their draft keeps no Mamba pool)."""
    checkpoint_kv_fp8: bool | None = None
    """Whether the checkpoint's `quantization_config` declares `kv_cache_quant_algo: FP8`; then
    `kvCacheDtype: auto` means FP8 E4M3 KV (`srt/mem_cache/kv_cache_dtype.py:49-58`), otherwise the model dtype.
    Unknown (unset) with `auto` is sized as bf16 and said so in `status.sizing.notes`."""
    qsa_index_kv_heads: NonNegative | None = None
    """QSA indexer key heads (`indexer_kv_heads`, replicated on every rank; 0 when the model has no QSA)."""
    qsa_index_head_dim: NonNegative | None = None
    """QSA indexer key dimension (`indexer_head_dim`); keys are stored in bf16."""
    qsa_compress_ratio: NonNegative | None = None
    """Tokens per compressed QSA key (`indexer_compress_ratio`); the page size must be a multiple of it."""
    ple_short_conv_layers: NonNegative | None = None
    """PLE short-convolution side states per Mamba slot (one per distinct `ple_layer_ids` entry)."""
    ple_channels: NonNegative | None = None
    """Channels of the PLE short-conv window (`hidden_size` x `hc_count`), replicated on every rank."""
    ple_conv_kernel_size: NonNegative | None = None
    """PLE short-conv kernel (`ple_conv_kernel_size`); the window keeps (kernel-1) x ngramSize positions."""
    ngram_size: NonNegative | None = None
    """PLE n-gram size; the slot also keeps the last ngramSize-1 token ids (int64)."""
    ple_table_rows: NonNegative | None = None
    """Rows of the hashed n-gram PLE table (all heads, padded), split across TP ranks."""
    ple_table_row_dim: NonNegative | None = None
    """Elements per PLE table row (`ple_embed_dim` / ((ngram_size-1) x heads_per_ngram))."""
    ple_table_dtype: PleTableDtype | None = None
    """Storage of the pinned PLE table: the checkpoint's dtype, fp8 or bf16 (sglang 0.5.23 offloads only those,
    `srt/models/qwen4_exp.py:113-128,935-944`; an NVFP4 checkpoint keeps its n-gram table in fp8 or bf16)."""
    ple_table_pinned: bool | None = None
    """Whether the PLE table lives in pinned host RAM (`ple_offload_embedding` with the pinned backend)."""
    max_context_length: Positive | None = None
    """Longest context the model supports, as the runtime derives it from config.json (`from_hf_config`);
    a longer `runtime.contextLength` is refused. Unknown (not checked) when unset."""
    gpu_weight_bytes: NonNegative | None = None
    """Weights resident on the GPUs, all ranks together; only used to estimate the device KV pool when
    `hicache.deviceKVTokens` is unset."""


REQUIRED = (
    "full_attention_layers",
    "linear_attention_layers",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
"""Fields without which no byte count is possible."""

DEFAULTS: dict[str, Any] = {
    "mtp_layers": 0,
    "mtp_linear_layers": 0,
    "qsa_index_kv_heads": 0,
    "qsa_index_head_dim": 0,
    "qsa_compress_ratio": 0,
    "ple_short_conv_layers": 0,
    "ple_channels": 0,
    "ple_conv_kernel_size": 0,
    "ngram_size": 0,
    "ple_table_rows": 0,
    "ple_table_row_dim": 0,
    "ple_table_pinned": False,
}
"""What an absent optional feature means: no MTP, no QSA, no PLE."""


def _load_profiles() -> dict[str, Geometry]:
    """Built-in profiles ship as camelCase JSON next to the package (profiles/<name>.json)."""
    out: dict[str, Geometry] = {}
    for entry in resources.files(__package__).joinpath("profiles").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text(encoding="utf-8"))
            data.pop("$comment", None)
            out[entry.name.removesuffix(".json")] = Geometry.model_validate(data)
    return out


PROFILES: dict[str, Geometry] = _load_profiles()


def profile_fields_merged(model_spec: Any) -> list[str]:
    """Fields an explicit `model.geometry` leaves unset and takes from the profile (the CRD defaults
    `model.profile`, so a partial geometry silently inherits the Flash-Next shapes): status says which."""
    profile, explicit = getattr(model_spec, "profile", None), getattr(model_spec, "geometry", None)
    if profile is None or explicit is None or profile not in PROFILES:
        return []
    own = explicit.model_dump(exclude_none=True)
    return sorted(
        Geometry.model_fields[name].alias or name
        for name in PROFILES[profile].model_dump(exclude_none=True)
        if name not in own
    )


def resolve_geometry(model_spec: Any) -> Geometry:
    """The profile overridden field by field by `model.geometry`, absent features defaulted; or an error."""
    profile = getattr(model_spec, "profile", None)
    if profile is not None and profile not in PROFILES:
        raise GeometryError(f"unknown model profile {profile!r}; built-in profiles: {sorted(PROFILES)}")
    merged: dict[str, Any] = dict(DEFAULTS)
    if profile is not None:
        merged.update(PROFILES[profile].model_dump(exclude_none=True))
    explicit = getattr(model_spec, "geometry", None)
    if explicit is not None:
        merged.update(explicit.model_dump(exclude_none=True))
    missing = [name for name in REQUIRED if merged.get(name) is None]
    if missing:
        names = ", ".join(Geometry.model_fields[n].alias or n for n in missing)
        raise GeometryError(
            f"model geometry is incomplete: {names} missing; set model.profile or model.geometry "
            "(e.g. from the checkpoint's config.json with `from_hf_config`)"
        )
    _check_consistent(merged)
    return Geometry.model_validate(merged)


def _check_consistent(g: dict[str, Any]) -> None:
    """Partial features cannot be sized: QSA needs dims and a ratio, PLE needs a kernel and an n-gram size."""
    qsa = (g["qsa_index_kv_heads"], g["qsa_index_head_dim"], g["qsa_compress_ratio"])
    if any(qsa) and not all(qsa):
        raise GeometryError(
            "QSA geometry is partial: qsaIndexKvHeads, qsaIndexHeadDim and qsaCompressRatio must all be > 0 "
            f"or all be 0, got {qsa}"
        )
    if g["ple_short_conv_layers"] and not (
        g["ple_channels"] and g["ple_conv_kernel_size"] and g["ngram_size"]
    ):
        raise GeometryError(
            "PLE geometry is partial: pleShortConvLayers needs pleChannels, pleConvKernelSize and ngramSize"
        )


# --- Hugging Face config.json -------------------------------------------------------------------------------

SUPPORTED_MODEL_TYPES = ("qwen4_exp", "qwen3_next", "qwen3_5", "qwen3_5_moe")
_FULL_TYPES = frozenset({"full_attention", "attention", "qwen_sparse_attention", "indexed_attention"})


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints nest the decoder under `text_config`; old text-only ones do not."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _need(text: dict[str, Any], key: str, model_type: str) -> Any:
    value = text.get(key)
    if value is None:
        raise GeometryError(f"config.json ({model_type}) has no {key!r}; cannot size this model")
    return value


def _layer_counts(text: dict[str, Any], model_type: str) -> tuple[int, int]:
    """(full, linear) from `layer_types`, else from `full_attention_interval` like the runtime."""
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        unknown = sorted({t for t in types if t not in _FULL_TYPES and t != "linear_attention"})
        if unknown:
            raise GeometryError(f"config.json ({model_type}) has unsupported layer_types {unknown}")
        full = sum(1 for t in types if t in _FULL_TYPES)
        return full, len(types) - full
    layers = int(_need(text, "num_hidden_layers", model_type))
    interval = int(text.get("full_attention_interval", 4))
    if interval < 1:
        raise GeometryError(
            f"config.json ({model_type}) has full_attention_interval {interval}; must be >= 1"
        )
    full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
    return full, layers - full


_NO_QSA = {"qsa_index_kv_heads": 0, "qsa_index_head_dim": 0, "qsa_compress_ratio": 0}
_NO_PLE = {
    "ple_short_conv_layers": 0, "ple_channels": 0, "ple_conv_kernel_size": 0, "ngram_size": 0,
    "ple_table_rows": 0, "ple_table_row_dim": 0, "ple_table_pinned": False,
}
"""A config.json states its features completely: absent means none, so nothing is merged from a profile."""


def _qsa_fields(text: dict[str, Any]) -> dict[str, int]:
    if text.get("indexer_n_heads") is None:
        return dict(_NO_QSA)
    return {
        "qsa_index_kv_heads": int(_need(text, "indexer_kv_heads", "qsa")),
        "qsa_index_head_dim": int(_need(text, "indexer_head_dim", "qsa")),
        "qsa_compress_ratio": int(_need(text, "indexer_compress_ratio", "qsa")),
    }


def _ple_table_dtype(config: dict[str, Any], text: dict[str, Any]) -> str:
    """`_ple_table_is_fp8` (`srt/models/qwen4_exp.py:113-128`): fp8 when the config says so, for an fp8
    checkpoint, or a ModelOpt MIXED_PRECISION entry of FP8 for the n-gram table; otherwise bf16."""
    if text.get("ple_embedding_dtype") == "float8_e4m3fn":
        return "float8_e4m3fn"
    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    if not isinstance(quant, dict):
        return "bfloat16"
    if str(quant.get("quant_method", "")).lower() == "fp8":
        return "float8_e4m3fn"
    layers = quant.get("quantized_layers") or {}
    if str(quant.get("quant_algo", "")).upper() == "MIXED_PRECISION" and isinstance(layers, dict):
        for name, entry in layers.items():
            if "ngram_embedding" in name and isinstance(entry, dict) and entry.get("quant_algo") == "FP8":
                return "float8_e4m3fn"
    return "bfloat16"


def _ple_fields(config: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """PLE side state and table, as `Qwen4ExpTextConfig` and `Qwen4ExpNGramEmbedding` derive them."""
    layer_ids = text.get("ple_layer_ids") or []
    if not layer_ids:
        return dict(_NO_PLE)
    hidden = int(_need(text, "hidden_size", "qwen4_exp"))
    ngram = int(text.get("ngram_size", 3))
    heads = (ngram - 1) * int(text.get("heads_per_ngram", 8))
    embed_dim = int(text.get("ple_embed_dim") or hidden)
    divisible = int(text.get("make_ngram_vocab_size_divisible_by", 128))
    rows = heads * int(text.get("ngram_vocab_size_base", 20_000_000))
    return {
        "ple_short_conv_layers": len({int(i) - 1 for i in layer_ids}),
        "ple_channels": hidden * int(text.get("hc_count", 4)),
        "ple_conv_kernel_size": int(text.get("ple_conv_kernel_size", 4)),
        "ngram_size": ngram,
        "ple_table_rows": -(-rows // divisible) * divisible,
        "ple_table_row_dim": embed_dim // heads if heads else 0,
        "ple_table_dtype": _ple_table_dtype(config, text),
        # the runtime offloads by default on CUDA with a bf16 model (arg_groups/model_overrides/qwen4_exp.py:43-49)
        "ple_table_pinned": bool(text.get("ple_offload_embedding", True))
        and text.get("ple_offload_backend", "pinned") == "pinned",
    }


CONTEXT_LENGTH_KEYS = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings",
)
"""The runtime's `CONTEXT_LENGTH_KEYS`, in its order of preference (tests compare)."""


def max_context_length(text: dict[str, Any]) -> int | None:
    """The runtime's `get_context_length` on the text config: rope factor x the first key present. None when
    config.json names none (the runtime would then use its config class default, which is not restated)."""
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    factor = rope.get("factor", 1) if rope else 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return None


def from_hf_config(config: dict[str, Any]) -> Geometry:
    """Geometry of a `qwen4_exp`, `qwen3_next` or `qwen3_5` checkpoint from its parsed `config.json`."""
    if not isinstance(config, dict):
        raise GeometryError(f"config.json must be a JSON object, got {type(config).__name__}")
    model_type = str(config.get("model_type", "")).removesuffix("_text")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise GeometryError(
            f"unsupported model_type {config.get('model_type')!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    text = _text_config(config)
    full, linear = _layer_counts(text, model_type)
    head_dim = text.get("head_dim") or int(_need(text, "hidden_size", model_type)) // int(
        _need(text, "num_attention_heads", model_type)
    )
    fields: dict[str, Any] = {
        "full_attention_layers": full,
        "linear_attention_layers": linear,
        "num_key_value_heads": int(_need(text, "num_key_value_heads", model_type)),
        "head_dim": int(head_dim),
        "mtp_layers": int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0),
        "mtp_linear_layers": 0,
        **{k: int(_need(text, k, model_type)) for k in REQUIRED[4:]},
        **_qsa_fields(text),
        **_ple_fields(config, text),
        "max_context_length": max_context_length(text),
    }
    if text.get("mamba_ssm_dtype") is not None:
        fields["mamba_ssm_dtype"] = text["mamba_ssm_dtype"]
    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    algo = quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None
    fields["checkpoint_kv_fp8"] = isinstance(algo, str) and algo.upper() == "FP8"
    try:
        return Geometry.model_validate(fields)
    except ValidationError as err:
        raise GeometryError(f"config.json ({model_type}) has invalid values: {err}") from err
