"""The compile caches the operator keeps on the cache volume (`launch.JIT_CACHE_ENV`) are the runtime's own: every
directory the shipped tree redirects under SGLANG_CACHE_DIR, at the same subdirectory, and the operator's values win
over the tree's redirect (it only fills in what the environment lacks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json
from qwen_hicache.launch import JIT_CACHE_ENV

BASE = "/base"


@pytest.fixture(scope="module")
def tree(patched_tree: Path) -> dict:
    return run_json("cache_dirs_probe.py", patched_tree, BASE)


def _operator() -> dict[str, str]:
    return {k: f"{BASE}/{sub}" if sub else BASE for k, sub in JIT_CACHE_ENV}


def test_every_cache_the_runtime_redirects_is_on_the_volume_where_the_runtime_would_put_it(tree: dict) -> None:
    ours = _operator()
    for key, where in tree["third_party"].items():
        assert ours.get(key) == where, key
    for key in ("SGLANG_CUTE_AOT_CACHE_DIR", "SGLANG_DG_CACHE_DIR"):
        assert ours[key] == tree[key]


def test_the_runtimes_own_jit_cache_is_a_variable_it_reads(tree: dict) -> None:
    assert tree["declares_SGLANG_JIT_CACHE_DIR"] and "SGLANG_JIT_CACHE_DIR" in _operator()


def test_the_runtimes_redirect_keeps_what_the_pod_sets(tree: dict) -> None:
    assert tree["triton_after_redirect"] == "/operator/triton"
