"""Upstream fixes the original change backported must stay in the pinned parent.

Each marker is the code that carries the fix in sglang 0.5.23 (see
runtime_patches/README.md); a future parent that loses one fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARKERS = {
    "#38851 64-bit QSA gather offsets": (
        "sglang/srt/layers/attention/qsa/kernel.py",
        ["def _gather_qsa_compressed_keys_kernel(", "rows = (start + blocks).to(tl.int64)"],
    ),
    "#36738 load-back fenced behind the forward stream": (
        "sglang/srt/managers/cache_controller.py",
        ["host_to_device_stream.wait_stream(\n                self.load_fence_stream"],
    ),
    "#39446 compressed-key gather rows clamped": (
        "sglang/srt/layers/attention/qsa/mqa.py",
        ["k_cache[page_table.long().clamp_min(0).reshape(-1), :, 0]"],
    ),
    "#39446 compressed page table clamped": (
        "sglang/srt/layers/attention/qsa/metadata.py",
        ["(token_slot_table[:, ::full_page].long() // full_page)\n        .clamp_min(0)"],
    ),
}


@pytest.mark.parametrize("item", sorted(MARKERS))
def test_backport_present_in_parent(parent_tree: Path, item: str):
    path, needles = MARKERS[item]
    text = (parent_tree / path).read_text()
    missing = [n for n in needles if n not in text]
    assert not missing, f"{item}: {path} no longer contains {missing}"
