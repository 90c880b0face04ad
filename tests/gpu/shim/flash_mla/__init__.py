"""STAND-IN (a name only): sglang 0.5.23's EAGLE worker imports `FlashMLABackend` when it captures CUDA graphs,
only for an isinstance check, and that module imports `flash_mla` (the `sgl-flash-mla` wheel, in the image's lock
but not carried to the GPU machine). Every kernel here raises if called: no backend this run uses calls one."""


def _absent(*_a, **_k):
    raise RuntimeError("flash_mla stand-in: the sgl-flash-mla kernels are not installed on this machine")


fused_norm_rope_attn_rope_cast = _absent


def __getattr__(name: str):
    return _absent
