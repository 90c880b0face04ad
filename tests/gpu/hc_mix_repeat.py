"""DIAGNOSTIC (GPU only): does the runtime's decode-time hyper-connection mix give the same bits every call?

On SM90, `GatedResidual.mix` with at most 16 rows takes `fused_hc_mix` (`sglang/kernels/ops/gemm/hc_mix.py`), a
persistent Triton kernel that adds its split-K partials with device-scope atomics. This calls that kernel, loaded
from the runtime's own file, `--calls` times on fixed inputs at the deep model's widths (hc 4 x hidden 2560, low rank
32) and counts the distinct outputs, next to the ordered torch chain the runtime uses otherwise (`_mix_compute`,
restated here from `srt/layers/hyperconnection.py`). Needs only torch and triton, so it runs on a bare GPU machine:

    python3 tests/gpu/hc_mix_repeat.py --hc-mix PATH/hc_mix.py [--calls 200] [--out report.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch
import torch.nn.functional as F


def load(path: str):
    spec = importlib.util.spec_from_file_location("hc_mix_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mix_compute(x: torch.Tensor, w_down: torch.Tensor, w_up: torch.Tensor, hc: int, hs: int) -> torch.Tensor:
    t = F.silu(F.linear(x, w_down) / hc)
    gate = torch.sigmoid(F.linear(t, w_up)).unflatten(-1, (hc, hs))
    return (gate * x.unflatten(-1, (hc, hs))).mean(dim=-2)


def distinct(outputs: list[torch.Tensor]) -> int:
    return len({o.view(torch.int16).cpu().numpy().tobytes() for o in outputs})


def run(path: str, calls: int, hc: int = 4, hs: int = 2560, lowrank: int = 32) -> dict:
    mod = load(path)
    g = torch.Generator(device="cuda").manual_seed(0)
    report: dict = {"gpu": torch.cuda.get_device_name(), "calls": calls, "hc": hc, "hidden": hs, "lowrank": lowrank,
                    "rows": {}}  # fmt: skip
    w_down = (torch.randn(lowrank, hc * hs, device="cuda", generator=g) * 0.02).bfloat16()
    w_up = (torch.randn(hc * hs, lowrank, device="cuda", generator=g) * 0.02).bfloat16()
    for rows in (1, 2, 4, 16):
        x = torch.randn(rows, hc * hs, device="cuda", generator=g).bfloat16()
        fused = [mod.fused_hc_mix(x, w_down, w_up, hc, hs).clone() for _ in range(calls)]
        ordered = [mix_compute(x, w_down, w_up, hc, hs).clone() for _ in range(calls)]
        torch.cuda.synchronize()
        diff = max((f.float() - fused[0].float()).abs().max().item() for f in fused)
        apart = (fused[0].float() - ordered[0].float()).abs().max().item()
        report["rows"][rows] = {"fused_distinct": distinct(fused), "ordered_distinct": distinct(ordered),
                                "fused_max_abs_diff": diff, "fused_vs_ordered_max_abs": apart}  # fmt: skip
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hc-mix", required=True, help="the runtime's kernels/ops/gemm/hc_mix.py")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    report = run(args.hc_mix, args.calls)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
