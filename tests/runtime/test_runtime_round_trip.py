"""A restarted pod reads back exactly what it wrote: every component of every page, through 0.5.23's own pools.

roundtrip_probe.py writes in one interpreter and reads in another (what a restart does). The write side builds
the runtime's device pools on CPU (``HybridReqToTokenPool``: the target ``MambaPool`` with the PLE side states
``ShortConvPool`` and ``NGramPool`` registered on it, and the MTP draft's Mamba pool), stores known bytes in
them and moves them to the host with ``MambaPoolHost``'s own pure-torch copy; the read side loads them back
into fresh device pools the same way and compares on the device. KV and QSA keys are filled on the host rows
(their device<->host copies are CUDA kernels only). Host pools: MHA KV, Mamba with the MTP draft and the side
states, QSA indexer with target and draft keys; the tree's HiCacheFile. Each component is compared on its own,
so a page that silently drops one fails by name. The doctored cases revert one piece of 0.5.23's hybrid HiCache
code the project relies on and name the components that must then fail (the table in runtime_patches/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
COMPONENTS = {
    "kv.k", "kv.v", "qsa.keys.target", "qsa.keys.draft", "mamba.ssm.target", "mamba.ssm.draft",
    "mamba.conv.target", "mamba.conv.draft", "ple.conv_window", "ngram.context",
}  # fmt: skip
MAMBA_HOST = "sglang/srt/mem_cache/pool_host/mamba.py"
QSA_HOST = "sglang/srt/mem_cache/pool_host/qsa.py"
MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"
PLE_POOLS = "sglang/srt/mem_cache/ple_state_pool.py"
REVERTED = {  # item: (file, old, new, components that must fail | (phase, the error that phase must raise))
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
        # The pool's pure-torch D2H copies every device layer it was given and finds no host layer for the draft
        # (the CUDA kernel, told num_mamba_layers, would drop the draft silently: draft SSM and conv would differ).
        ("write", "IndexError: index 2 is out of bounds for dimension 1 with size 2"),
    ),
    "MTP draft QSA sidecar": (
        QSA_HOST,
        "        pools = (device_pool, *mtp_draft_device_pools)\n",
        "        pools = (device_pool,)\n",
        {"qsa.keys.draft"},
    ),
    "MambaPool.register_slot_state keeps the side state": (
        MEMORY_POOL,
        "        self._slot_siblings = [*self._slot_siblings, state]\n",
        "        pass\n",
        {"ple.conv_window", "ngram.context"},
    ),
    "MambaPool exports its side states as extra checkpoint buffers": (
        MEMORY_POOL,
        "                        for sibling in self._slot_siblings\n",
        "                        for sibling in ()\n",
        {"ple.conv_window", "ngram.context"},
    ),
    "ShortConvPool registered on the Mamba pool": (
        MEMORY_POOL,
        "            self.mamba_pool.register_slot_state(self.short_conv_pool)\n",
        "            pass\n",
        {"ple.conv_window"},
    ),
    "NGramPool registered on the Mamba pool": (
        MEMORY_POOL,
        "            self.mamba_pool.register_slot_state(self.ngram_pool)\n",
        "            pass\n",
        {"ngram.context"},
    ),
    "ShortConvPool exports its conv window": (
        PLE_POOLS,
        '        """Yield replicated per-layer state for PD transfer."""\n        if self.conv_state is None:\n',
        '        """Yield replicated per-layer state for PD transfer."""\n        if True:\n',
        {"ple.conv_window"},
    ),
    "NGramPool exports its context": (
        PLE_POOLS,
        '        if self.context is not None:\n            yield "ple_ngram"',
        '        if False:\n            yield "ple_ngram"',
        {"ngram.context"},
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
    assert out["read"]["dtypes"]["ngram.context"] == "torch.int64"  # NGramPool's own dtype (token ids)


def test_pages_are_checksummed_files(patched_round_trip: dict, patched_tree: Path):
    """Each page file is the header plus exactly the pool's page (PLE side states included in the Mamba page)."""
    page_bytes = patched_round_trip["write"]["page_bytes"]
    ssm_conv = (2 * 4 * 4 * 4 + 8 * 3 * 2) * 3  # fp32 SSM + bf16 conv, 2 target layers + 1 draft
    assert page_bytes["mamba"] == ssm_conv + 3 * 5 * 2 + 7 * 8  # + PLE conv window (bf16) + n-gram context (int64)


@pytest.fixture(scope="module")
def doctored_round_trips(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each REVERTED item's round trip on its own copy of the patched tree (parent + series: what ships).

    The cases are independent interpreters, so they run side by side (up to 4)."""
    items = sorted(REVERTED)
    bases = {item: tmp_path_factory.mktemp("doctored") for item in items}

    def run(item: str) -> dict:
        path, old, new, _ = REVERTED[item]
        site = bases[item] / "site"
        shutil.copytree(patched_tree, site)
        target = site / path
        text = target.read_text()
        if text.count(old) != 1:
            return {"anchor": f"{item}: anchor not unique in {path}"}
        target.write_text(text.replace(old, new))
        try:
            return round_trip(site, bases[item] / "work")
        finally:
            shutil.rmtree(site)

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        return dict(zip(items, pool.map(run, items), strict=True))


@pytest.mark.parametrize("item", sorted(REVERTED))
def test_reverting_a_relied_on_piece_fails_by_component(item: str, doctored_round_trips: dict):
    """The patched tree with one piece reverted: the named components differ (or the named error is raised).

    The probe must otherwise run through: a crash elsewhere would not show that the guard sees the revert."""
    failing = REVERTED[item][3]
    out = doctored_round_trips[item]
    assert "anchor" not in out, out["anchor"]
    if isinstance(failing, tuple):
        phase, error = failing
        assert out.get("phase") == phase and error in out["error"], out
        return
    assert "error" not in out, out
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
