"""Build flashinfer's JIT modules the engine run loads ahead of time, time each build, and lay them out as flashinfer's
own AOT modules.

    CUDA_HOME=... PATH=SITE/bin:$PATH PYTHONPATH=SITE python3 tests/gpu/flashinfer_prebuild.py \
        --out report.json [--arch 9.0a] [--aot DIR] [--only topk]

A server builds them at first use, inside a forward: the sampling module at the first top-k/top-p request, the top-k
module at the first prefill in deterministic mode, the norm module (sgl_kernel's gemma_rmsnorm goes through it) at
start, in the MTP draft's CUDA-graph capture (31 s on an H100 machine's 16 cores, 40 s on 2 cores here; its norm.cu
includes cublasLt.h, from the lock's nvidia-cublas). The runtime's watchdog ends a server whose forward takes over
`--watchdog-timeout` (300 s by default), and the top-k build took 885 s on one core here (`cub_topk.cu`), so a
GPU lease (10 minutes a call) cannot build it at first use. `--arch 9.0a` builds here for the H100/H200 without a
GPU (the lock's nvcc, CUDA_HOME from images/runtime/cuda-home.sh; the link needs a `libcuda.so`, which a GPU machine
has and `$CUDA_HOME/lib64/stubs` may stand in for); `--aot DIR` copies each `<name>.so` to `DIR/<name>/<name>.so`,
the layout flashinfer loads from `flashinfer/data/aot` before it builds anything (`jit/env.py`, `get_aot_artifacts`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

MODULES = {
    "sampling": "flashinfer.jit.sampling:gen_sampling_module",
    "topk": "flashinfer.jit.topk:gen_topk_module",
    "norm": "flashinfer.jit.norm:gen_norm_module",  # sgl_kernel's gemma_rmsnorm, where flashinfer imports
}


def build(name: str, aot: Path | None) -> dict:
    """One module: built (or found up to date), how long it took, where it was put; or the end of the error."""
    module, func = MODULES[name].split(":")
    t = time.time()
    try:
        spec = getattr(__import__(module, fromlist=[func]), func)()
        spec.build(verbose=False)
    except Exception as e:  # noqa: BLE001 - the report says what failed; the other module still builds
        first = re.search(r"^.*\berror\b.*$", str(e), re.M)  # a compiler's first error, far above the tail
        return {"ok": False, "seconds": round(time.time() - t, 1), "first_error": first and first.group(0)[-500:],
                "error": str(e)[-1500:]}  # fmt: skip
    out = {"ok": True, "seconds": round(time.time() - t, 1)}
    if aot:
        dest = aot / name / f"{name}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, dest)
        out["aot"] = str(dest)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", choices=sorted(MODULES), action="append")
    ap.add_argument("--arch", help="target without a GPU, as FLASHINFER_CUDA_ARCH_LIST takes it (9.0a: H100/H200)")
    ap.add_argument("--aot", type=Path, help="copy each module here in flashinfer's AOT layout")
    args = ap.parse_args()
    if args.arch:
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = args.arch  # read when flashinfer.jit is first imported
    report = {name: build(name, args.aot) for name in args.only or MODULES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0 if all(r["ok"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
