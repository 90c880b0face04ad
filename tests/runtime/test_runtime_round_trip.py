"""A restarted pod reads back exactly what it wrote: every component of every page, through 0.5.23's own pools.

roundtrip_probe.py writes in one interpreter and reads in another (what a restart does) with the runtime's
host pools (MHA KV, Mamba with MTP draft and PLE side states, QSA indexer with target and draft keys) and
the tree's HiCacheFile. Each component is compared on its own, so a page that silently drops one fails by
name. The doctored cases revert one piece of 0.5.23's hybrid HiCache code the project relies on and name the
components that must then fail (the table in runtime_patches/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
COMPONENTS = {
    "kv.k", "kv.v", "qsa.keys.target", "qsa.keys.draft", "mamba.ssm.target", "mamba.ssm.draft",
    "mamba.conv.target", "mamba.conv.draft", "ple.conv_window", "ngram.context",
}  # fmt: skip
MAMBA_HOST = "sglang/srt/mem_cache/pool_host/mamba.py"
QSA_HOST = "sglang/srt/mem_cache/pool_host/qsa.py"
REVERTED = {  # item: (file, old, new, components that must fail)
    "PLE side-state registration on the Mamba host pool": (
        MAMBA_HOST,
        "            buf for info in buffer_infos for buf in info.extra_checkpoint_buffers\n",
        "            buf for info in () for buf in info.extra_checkpoint_buffers\n",
        {"ple.conv_window", "ngram.context"},
    ),
    "side-state carriage in Mamba host pages": (
        MAMBA_HOST,
        "        for state_buf in self.slot_state_buffers:\n"
        "            yield state_buf[index : index + self.page_size]\n",
        "",
        {"ple.conv_window", "ngram.context"},
    ),
    "MTP draft Mamba state in the host slot": (
        MAMBA_HOST,
        "        self.num_mamba_layers = buffer_info.temporal.shape[0] + len(\n",
        "        self.num_mamba_layers = buffer_info.temporal.shape[0] + 0 * len(\n",
        {"mamba.ssm.draft", "mamba.conv.draft"},
    ),
    "MTP draft QSA sidecar": (
        QSA_HOST,
        "        pools = (device_pool, *mtp_draft_device_pools)\n",
        "        pools = (device_pool,)\n",
        {"qsa.keys.draft"},
    ),
}


def round_trip(tree: Path, work: Path) -> dict:
    """Write in one interpreter, read in a fresh one; the read's report."""
    out = {}
    for phase in ("write", "read"):
        proc = subprocess.run(
            [sys.executable, str(HERE / "roundtrip_probe.py"), str(tree), str(work), phase],
            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )  # fmt: skip
        if proc.returncode:
            return {"error": proc.stderr[-2000:], "phase": phase}
        out[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="session")
def patched_round_trip(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return round_trip(patched_tree, tmp_path_factory.mktemp("roundtrip"))


def test_every_component_reads_back_byte_for_byte_after_a_restart(patched_round_trip: dict):
    out = patched_round_trip
    assert "error" not in out, out
    assert out["write"]["results"] == {"kv": [True, True], "mamba": [True, True], "indexer": [True, True]}
    assert out["read"]["results"] == out["write"]["results"] and out["read"]["kv_hit_pages"] == 2
    assert out["read"]["same"] == dict.fromkeys(COMPONENTS, True)


def test_pages_are_checksummed_files(patched_round_trip: dict, patched_tree: Path):
    """Each page file is the header plus exactly the pool's page (PLE side states included in the Mamba page)."""
    page_bytes = patched_round_trip["write"]["page_bytes"]
    assert page_bytes["mamba"] == 2 * 4 * 4 * 4 * 3 + 8 * 3 * 2 * 3 + 3 * 5 * 2 + 7 * 4  # SSM + conv (x3 layers) + PLE


@pytest.mark.parametrize("item", sorted(REVERTED))
def test_reverting_a_relied_on_piece_fails_by_component(item: str, tree_copy: Path, tmp_path: Path):
    path, old, new, failing = REVERTED[item]
    target = tree_copy / path
    text = target.read_text()
    assert text.count(old) == 1, f"{item}: anchor not unique in {path}"
    target.write_text(text.replace(old, new))
    out = round_trip(tree_copy, tmp_path / "work")
    if "error" in out:
        return  # the pools can no longer even be built or written: the revert is caught as loudly as it gets
    same = out["read"]["same"]
    assert {c for c, ok in same.items() if not ok} >= failing, same


def test_qsa_host_pool_moves_whole_pages_only(probes: dict, run_probe, tree_copy: Path, tmp_path: Path):
    """`page_aligned_only=True` (pool_host/qsa.py:56): a token-granular move of packed compressed groups is refused.

    Reverted, the pool would accept token-granular moves of a row that is not laid out per token."""
    for tree in ("patched", "parent"):
        assert probes[tree]["qsa_page_aligned"] == {"page_aligned_only": True, "backup_tokens": "refused"}
    target = tree_copy / QSA_HOST
    text = target.read_text()
    assert text.count("            page_aligned_only=True,\n") == 1
    target.write_text(text.replace("            page_aligned_only=True,\n", "            page_aligned_only=False,\n"))
    doctored = run_probe(tree_copy, tmp_path / "work", only="qsa_page_aligned")["qsa_page_aligned"]
    assert doctored != {"page_aligned_only": True, "backup_tokens": "refused"}
