"""DIAGNOSTIC for the engine run (`run_engine.py --ordered-hc-mix`): a decode step's hyper-connection mix summed in a
fixed order.

On SM90, `GatedResidual.mix` with at most 16 rows (every decode step at batch size 1) takes the runtime's persistent
`fused_hc_mix` kernel, which adds its split-K partials with device-scope atomics, so the low bits of the sum change
from run to run (`kernels/ops/gemm/hc_mix.py` says so); prefill and extend, with more rows, take the ordered
`_mix_compute`. Loaded by a `sitecustomize` in every server process, `install()` makes the module's
`_deterministic_inference` answer True as soon as it loads: the mix then takes `_mix_compute` at every row count, and
nothing else changes; a run with it says so in its report. On an H100 (2026-12-07, series qhc.12) this gave two cache
hits of one prefix the same tokens and log-probs in 4 of 4 prompts; series qhc.13 does the same by default (patch
0013), so the module matters only for runs of an older series.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

MODULE = "sglang.kernels.ops.gemm.hc_mix"


class _AfterLoad(importlib.abc.MetaPathFinder):
    """Finds MODULE as the path finder would and patches it right after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            module._deterministic_inference = lambda: True

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if not any(isinstance(f, _AfterLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLoad())
