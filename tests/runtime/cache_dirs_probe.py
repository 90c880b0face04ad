"""Where one SGLang tree puts its compile caches under a given SGLANG_CACHE_DIR, and whether values already in the
environment survive its redirect; print JSON.

``python cache_dirs_probe.py TREE BASE``. Imports the tree's own ``sglang.srt.environ`` with SGLANG_CACHE_DIR=BASE
and reports ``third_party_cache_defaults()``, its CuTe and DeepGEMM cache directories, whether it declares
SGLANG_JIT_CACHE_DIR, and ``redirect_third_party_caches()`` run over an environment that already names
TRITON_CACHE_DIR (as the operator's pod does).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import cpu_stub

TREE, BASE = Path(sys.argv[1]), sys.argv[2]
os.environ["SGLANG_CACHE_DIR"] = BASE
os.environ["TRITON_CACHE_DIR"] = "/operator/triton"
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

from sglang.srt import environ  # noqa: E402

environ.redirect_third_party_caches()
print(json.dumps({
    "third_party": environ.third_party_cache_defaults(),
    "SGLANG_CUTE_AOT_CACHE_DIR": environ.envs.SGLANG_CUTE_AOT_CACHE_DIR.get(),
    "SGLANG_DG_CACHE_DIR": environ.envs.SGLANG_DG_CACHE_DIR.get(),
    "declares_SGLANG_JIT_CACHE_DIR": hasattr(environ.envs, "SGLANG_JIT_CACHE_DIR"),
    "triton_after_redirect": os.environ["TRITON_CACHE_DIR"],
}))
