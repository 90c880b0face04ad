"""Ask one SGLang tree's hyper-connection mix which kernel a decode step takes, on CPU; print JSON.

``python hc_mix_order_probe.py TREE``. ``GatedResidual.mix`` takes the persistent ``fused_hc_mix`` (split-K partials
added with device-scope atomics) wherever ``fused_hc_mix_supported`` says yes, else the ordered ``_mix_compute``.
The probe loads the tree's own ``kernels/ops/gemm/hc_mix.py`` once per value of ``SGLANG_HC_MIX_ATOMIC`` (the module
reads it at import) and asks it about decode-sized inputs: a CPU tensor standing in for a CUDA one (only the
attributes the check reads), bf16 rows at the deep model's width (hc 4 x hidden 2,560), low rank 32.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import cpu_stub

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402

HC, HIDDEN, LOWRANK = 4, 2560, 32
ROWS = (1, 2, 4, 16, 17)


class CudaLike:
    """A CPU tensor that answers ``is_cuda`` as a GPU tensor would; the supported-check reads nothing else."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t, self.is_cuda, self.dtype, self.shape = t, True, t.dtype, t.shape

    def dim(self) -> int:
        return self._t.dim()

    def is_contiguous(self) -> bool:
        return self._t.is_contiguous()


def load(atomic: str | None, n: int):
    """The tree's hc_mix module, executed fresh with SGLANG_HC_MIX_ATOMIC as given (None: unset)."""
    os.environ.pop("SGLANG_HC_MIX_ATOMIC", None)
    if atomic is not None:
        os.environ["SGLANG_HC_MIX_ATOMIC"] = atomic
    path = TREE / "sglang" / "kernels" / "ops" / "gemm" / "hc_mix.py"
    spec = importlib.util.spec_from_file_location(f"hc_mix_probe_{n}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def takes_atomic(module) -> dict[str, bool]:
    w_down = CudaLike(torch.zeros(LOWRANK, HC * HIDDEN, dtype=torch.bfloat16))
    w_up = CudaLike(torch.zeros(HC * HIDDEN, LOWRANK, dtype=torch.bfloat16))
    return {str(rows): bool(module.fused_hc_mix_supported(
        CudaLike(torch.zeros(rows, HC * HIDDEN, dtype=torch.bfloat16)), w_down, w_up)) for rows in ROWS}  # fmt: skip


def main() -> None:
    out = {}
    for n, (name, value) in enumerate((("unset", None), ("1", "1"), ("0", "0"))):
        try:
            out[name] = takes_atomic(load(value, n))
        except Exception as err:  # reported, so the test shows which case broke
            out[name] = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
