"""STAND-IN: the one class `sglang/kernels/ops/attention/flash_mla_interface.py` imports by name."""


class FlashMLASchedMeta:
    def __init__(self, *_a, **_k):
        raise RuntimeError("flash_mla stand-in: the sgl-flash-mla kernels are not installed on this machine")
