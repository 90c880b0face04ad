"""Model geometry: the per-layer shapes that decide how many bytes a cached token and a state slot take.

Every field is optional so a spec can override single values of a built-in profile or a config.json.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .typed import ApiModel

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class Geometry(ApiModel):
    """Shapes of a hybrid (full attention + GDN/Mamba) Qwen model, as in its Hugging Face `config.json`."""

    full_attention_layers: NonNegative | None = None
    """Decoder layers with full (QSA) attention: they hold KV."""
    linear_attention_layers: NonNegative | None = None
    """Decoder layers with GDN linear attention: they hold a Mamba (conv + SSM) state instead of KV."""
    num_key_value_heads: Positive | None = None
    """KV heads of a full-attention layer (split across TP ranks)."""
    head_dim: Positive | None = None
    """Key head dimension of a full-attention layer."""
    linear_num_key_heads: Positive | None = None
    """GDN key heads."""
    linear_num_value_heads: Positive | None = None
    """GDN value heads."""
    linear_key_head_dim: Positive | None = None
    """GDN key head dimension."""
    linear_value_head_dim: Positive | None = None
    """GDN value head dimension."""
    linear_conv_kernel_dim: Positive | None = None
    """GDN short-convolution kernel width (the conv state keeps kernel-1 positions)."""
    mtp_layers: NonNegative | None = None
    """MTP draft layers (full attention, packed into the KV host pool)."""
    qsa_index_head_dim: NonNegative | None = None
    """QSA indexer key dimension (0 when the model has no QSA)."""
    qsa_compress_ratio: NonNegative | None = None
    """Tokens per compressed QSA key."""
