"""The engine stand-in: the runtime's HTTP contract and a disk tier kept by the real HiCacheFile."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from harness.sim.engine import parse_args
from harness.sim.sglang_tree import TREE_ENV, patched_sglang_tree
from harness.sim.tiers import page_keys

PROMPT = "You are a helpful assistant. " * 24  # 720 bytes: 11 full pages of 64, 10 matchable
PAGES = (len(PROMPT) - 1) // 64


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_page_keys_are_a_sha256_chain_over_uint32_pages() -> None:
    import hashlib
    import struct

    tokens = list(range(130))
    first = hashlib.sha256(struct.pack("<64I", *tokens[:64])).digest()
    second = hashlib.sha256(first + struct.pack("<64I", *tokens[64:128])).hexdigest()
    assert page_keys(tokens, 64) == [first.hex(), second]


def test_argv_of_the_runtime_is_accepted() -> None:
    args = parse_args(["--model-path", "/m", "--tp-size", "2", "--kv-cache-dtype", "fp8_e4m3",
                       "--hicache-storage-backend-extra-config", '{"prefetch_threshold": 128}'])  # fmt: skip
    assert (args.served_model_name, args.tp_size, args.prefetch_threshold) == ("/m", 2, 128)


def test_device_hits_metrics_and_admin_key(start_engine, tmp_path: Path) -> None:
    engine = start_engine(tmp_path / "cache")
    assert engine.call("GET", "/health")[0] == 200
    before = engine.call("GET", "/metrics")[1]
    assert "sglang:cached_tokens_total" not in before  # labelled counters appear on first increment
    assert metric(before, "sglang:num_running_reqs") == 0
    first, second = engine.generate(PROMPT), engine.generate(PROMPT)
    assert first["cached_tokens"] == 0 and first["prompt_tokens"] == len(PROMPT)
    assert second["cached_tokens_details"] == {"device": PAGES * 64, "host": 0, "storage": 0}
    assert engine.flush(key=None)[0] == 401
    assert engine.flush(key="wrong")[0] == 401
    assert engine.flush() == (200, "Cache flushed.\n")
    after = engine.call("GET", "/metrics")[1]
    assert metric(after, "sglang:cached_tokens_total", cache_source="device") == PAGES * 64
    assert metric(after, "sglang:hicache_host_used_tokens") == 0  # flush cleared the host tier
    assert metric(after, "sglang:backuped_tokens_total") == (len(PROMPT) // 64) * 64
    assert engine.stop() == 0


def test_flushed_pages_are_read_back_after_a_restart(start_engine, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    engine = start_engine(cache)
    engine.generate(PROMPT)
    assert engine.flush()[0] == 200
    files = sorted(os.listdir(cache))
    assert any(re.fullmatch(r"[0-9a-f]{64}\.mamba_Qwen-sim-test_1_2\.bin", f) for f in files)
    assert any(re.fullmatch(r"[0-9a-f]{64}\.indexer_Qwen-sim-test_0_2\.bin", f) for f in files)
    assert engine.stop() == 0

    cold = start_engine(cache, QWEN_HICACHE_SIM_COLD="1")
    assert cold.generate(PROMPT)["cached_tokens"] == 0
    cold.stop()

    warm = start_engine(cache)
    assert warm.info()["tree"]["patched"] is True
    assert warm.generate(PROMPT)["cached_tokens_details"] == {"device": 0, "host": 0, "storage": PAGES * 64}
    assert warm.generate(PROMPT)["cached_tokens_details"]["device"] == PAGES * 64
    assert warm.info()["corrupt_pages"] == 0
    assert metric(warm.call("GET", "/metrics")[1], "sglang:prefetched_tokens_total") == PAGES * 64


def test_short_storage_hits_are_not_fetched(start_engine, tmp_path: Path) -> None:
    engine = start_engine(tmp_path / "cache")
    engine.generate(PROMPT[:300])  # 4 pages on disk: 256 tokens, the threshold
    assert engine.flush()[0] == 200
    assert engine.generate(PROMPT[:300])["cached_tokens_details"]["storage"] == 256
    engine.generate(PROMPT)  # device now holds 4 pages; 6 more on disk after a flush
    assert engine.flush()[0] == 200
    engine.generate(PROMPT[:300])  # 4 pages back on device
    assert engine.generate(PROMPT)["cached_tokens_details"] == {"device": 256, "host": 0, "storage": 384}


def test_sigterm_without_flush_and_without_a_drain_budget_drops_queued_writes(start_engine, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    engine = start_engine(cache, "--sim-write-delay", "0.3", SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT="0")
    engine.generate(PROMPT)
    assert engine.info()["pending_writes"] > 0
    assert engine.stop(signal.SIGTERM) == 0
    assert len([f for f in os.listdir(cache) if f.endswith(".bin")]) < 2 * 2 * (len(PROMPT) // 64)
    restarted = start_engine(cache)
    assert restarted.generate(PROMPT)["cached_tokens_details"]["storage"] < PAGES * 64


def test_sigterm_drains_queued_writes_within_the_budget(start_engine, tmp_path: Path) -> None:
    """Patch 0003: the patched runtime writes what is queued at SIGTERM (here 11 pages x 0.1 s, budget 30 s)."""
    cache = tmp_path / "cache"
    engine = start_engine(cache, "--sim-write-delay", "0.1", SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT="30")
    engine.generate(PROMPT)
    assert engine.info()["pending_writes"] > 0
    assert engine.stop(signal.SIGTERM) == 0
    restarted = start_engine(cache)
    assert restarted.generate(PROMPT)["cached_tokens_details"]["storage"] == PAGES * 64


@pytest.mark.parametrize("damage", ["same_size_garbage", "truncated"])
def test_a_damaged_page_is_a_miss_not_a_crash(start_engine, tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    engine = start_engine(cache)
    engine.generate(PROMPT)
    assert engine.flush()[0] == 200
    engine.stop()
    keys = page_keys(list(PROMPT.encode()), 64)
    victim = cache / f"{keys[7]}_Qwen-sim-test_0_2.bin"  # a KV page of rank 0
    size = victim.stat().st_size
    if damage == "truncated":
        os.truncate(victim, size // 2)
    else:
        victim.write_bytes(b"\0" * size)
    warm = start_engine(cache)
    details = warm.generate(PROMPT)["cached_tokens_details"]
    assert details["storage"] < PAGES * 64  # cut before page 7 (or nothing, if under the threshold)
    assert warm.call("GET", "/health")[0] == 200
    assert warm.info()["corrupt_pages"] == 1  # the runtime's own check refused it (checksum / size), and counted it
    assert warm.info()["wrong_bytes_served"] == 0
    assert not victim.exists() or victim.stat().st_size == size  # discarded, not served again


def _doctored(tree: Path, site: Path, path: str, old: str, new: str) -> Path:
    """``tree`` with one source edit (every other file a symlink into it); its recorded info still says patched."""
    shutil.copytree(tree, site, copy_function=os.symlink)
    target = site / path
    source = target.read_text()
    assert source.count(old) == 1, f"{path} no longer holds the text to doctor"
    target.unlink()
    target.write_text(source.replace(old, new))
    return site


DRAIN_CALL = "            self.cache_controller.drain_storage_backup()\n"


@pytest.mark.parametrize("tree_kind", ["parent", "patched, release_host_resources without its drain"])
def test_sigterm_runs_the_trees_own_release(start_engine, sglang_tree: Path, tmp_path: Path, tree_kind: str) -> None:
    """SIGTERM runs the tree's UnifiedRadixCache.release_host_resources: on the parent, or on a patched tree whose
    release no longer calls drain_storage_backup, queued writes die with the process despite a 30 s budget (the
    patched tree writes them all: test_sigterm_drains_queued_writes_within_the_budget)."""
    if tree_kind == "parent":
        tree = patched_sglang_tree(patched=False)
    else:
        path = "sglang/srt/mem_cache/unified_radix_cache.py"
        tree = _doctored(sglang_tree, tmp_path / "site", path, DRAIN_CALL, "            pass\n")
    cache = tmp_path / "cache"
    env = {TREE_ENV: str(tree), "SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT": "30"}
    engine = start_engine(cache, "--sim-write-delay", "0.1", **env)
    assert engine.info()["tree"]["patched"] is (tree_kind != "parent")
    engine.generate(PROMPT)
    assert engine.info()["pending_writes"] > 0
    assert engine.stop(signal.SIGTERM) == 0
    written = [f for f in os.listdir(cache) if f.endswith(".bin")]
    assert len(written) < 2 * (2 * (len(PROMPT) // 64) + 1)  # KV + indexer per page, one Mamba slot; per rank
    restarted = start_engine(cache, **env)
    assert restarted.generate(PROMPT)["cached_tokens_details"]["storage"] < PAGES * 64


def test_flush_waits_on_the_trees_own_idle_check(start_engine, sglang_tree: Path, tmp_path: Path) -> None:
    """/flush_cache defers on the tree's Scheduler.is_fully_idle: one that forgets ongoing_backup flushes at once,
    with the backups still in flight (the real check waits: test_flushed_pages_are_read_back_after_a_restart)."""
    path = "sglang/srt/managers/scheduler.py"
    check = "                    idle &= len(tc.ongoing_backup) == 0\n"
    tree = _doctored(sglang_tree, tmp_path / "site", path, check, "")
    engine = start_engine(tmp_path / "cache", "--sim-write-delay", "0.2", **{TREE_ENV: str(tree)})
    engine.generate(PROMPT)
    assert engine.flush() == (200, "Cache flushed.\n")
    assert engine.info()["pending_writes"] > 0
