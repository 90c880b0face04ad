"""Build flashinfer's JIT modules the engine run loads, before a server needs them, and time each build.

    CUDA_HOME=/root/cuda-lock PATH=/root/site/bin:$PATH PYTHONPATH=/root/site \
        python3 tests/gpu/flashinfer_prebuild.py --out $OUT/prebuild.json [--only topk]

A server builds them at first use, inside a forward: the sampling module at the first top-k/top-p request, the top-k
module at the first prefill in deterministic mode. Its scheduler watchdog (`--watchdog-timeout`) and the run's request
timeouts count that build, so a lease builds them once, beside an earlier call; the servers then load them from the
same cache (`~/.cache/flashinfer`), as a pod would after its own first build. The target is the visible GPU's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODULES = {"sampling": "flashinfer.jit.sampling:gen_sampling_module", "topk": "flashinfer.jit.topk:gen_topk_module"}


def build(name: str) -> dict:
    """One module: built (or found up to date) and how long it took, or the end of the error."""
    module, func = MODULES[name].split(":")
    t = time.time()
    try:
        spec = getattr(__import__(module, fromlist=[func]), func)()
        spec.build(verbose=False)
    except Exception as e:  # noqa: BLE001 - the report says what failed; the lease goes on
        return {"ok": False, "seconds": round(time.time() - t, 1), "error": str(e)[-1500:]}
    return {"ok": True, "seconds": round(time.time() - t, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", choices=sorted(MODULES), action="append")
    args = ap.parse_args()
    report = {name: build(name) for name in args.only or MODULES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0 if all(r["ok"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
