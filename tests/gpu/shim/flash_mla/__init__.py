"""STAND-IN (names only): sglang 0.5.23's EAGLE worker imports `FlashMLABackend` when it captures CUDA graphs,
only for an isinstance check, and that module imports `flash_mla` (the `sgl-flash-mla` wheel, in the image's lock
but not carried to the GPU machine). Only the names its import reads are here, each raising if called; any other
name is missing, so nothing can take this module for the real one."""


def _absent(*_a, **_k):
    raise RuntimeError("flash_mla stand-in: the sgl-flash-mla kernels are not installed on this machine")


fused_norm_rope_attn_rope_cast = _absent
