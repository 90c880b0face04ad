"""Patch 0004: a hybrid cache-mode disk hit larger than the free host capacity is loaded whole or revoked.

storage_hit_probe.py runs each tree's own code on CPU: a node of 4 pages was backed up by the controller's
_page_backup (KV pages + its Mamba state under the last page hash) to a real HiCacheFile directory; a later
request's hit query finds all 4 pages while other host nodes leave 3 host pages free. The scheduler-side
allocation (UnifiedRadixCache._drain_storage_control_queues_impl -> HybridCacheController.allocate_storage_hit),
the IO thread's transfer (_page_transfer, with the Mamba sidecar) and _check_hybrid_prefetch_result decide
what the request gets. See upstream #40193.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json

PAGE, HIT_PAGES, FREE_PAGES = 64, 4, 3


def storage_hit(tree: Path, work: Path) -> dict:
    report = run_json("storage_hit_probe.py", tree, work)
    for name, out in report.items():
        assert "error" not in out, (name, out["error"])
        # The setup each scenario relies on: the whole hit is on disk and the host pool is short of it.
        assert out["stored"] == {"kv_pages": HIT_PAGES, "backup_completed_tokens": HIT_PAGES * PAGE}, name
        assert out["hit_tokens_found"] == HIT_PAGES * PAGE and out["free_host_tokens_before"] == FREE_PAGES * PAGE
        assert out["evict_host_calls"] == [HIT_PAGES * PAGE], name  # the runtime tried host eviction first
    return report


@pytest.fixture(scope="module")
def reports(parent_tree: Path, patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {
        "parent": storage_hit(parent_tree, tmp_path_factory.mktemp("hit-parent")),
        "patched": storage_hit(patched_tree, tmp_path_factory.mktemp("hit-patched")),
    }


def test_parent_shortens_a_hybrid_hit_and_then_drops_it(reports: dict):
    """The gap: the 4-page hit is cut to the 3 free pages, the Mamba key moves to page 3 (no state there), the
    KV pages are read and the whole prefetch is discarded: a full disk hit becomes a recompute, no retry armed."""
    out = reports["parent"]["hybrid_short_capacity"]
    assert out["queued_for_transfer"] is True
    assert (out["transfer_tokens"], out["transfer_pages"]) == (FREE_PAGES * PAGE, FREE_PAGES)  # silently shortened
    assert out["completed_tokens"] == FREE_PAGES * PAGE  # the KV pages were read...
    assert out["mamba_key_read"] == [FREE_PAGES] and out["mamba_pages_read"] == 0  # ...the state is not there
    assert out["loaded_tokens"] == 0 and out["retry_armed"] is False
    assert out["leaked"] == {"host_tokens": 0, "mamba_slots": 0}


def test_patched_revokes_a_hybrid_hit_that_does_not_fit(reports: dict):
    """No shortened read: the hit is revoked through the host_capacity path (nothing staged stays allocated)
    and the storage prefetch retry is armed, so the request tries again once host pages can be evicted."""
    out = reports["patched"]["hybrid_short_capacity"]
    assert out["queued_for_transfer"] is False and out["transfer_tokens"] == 0
    assert out["loaded_tokens"] == 0 and out["retry_armed"] is True
    assert out["ongoing_after"] is False and out["leaked"] == {"host_tokens": 0, "mamba_slots": 0}


@pytest.mark.parametrize("tree", ["parent", "patched"])
def test_a_hybrid_hit_that_fits_after_eviction_is_loaded_whole(reports: dict, tree: str):
    """Control: when the other host nodes are evictable the whole hit loads, with its Mamba state (page 4)."""
    out = reports[tree]["hybrid_evictable"]
    assert (out["transfer_tokens"], out["completed_tokens"], out["loaded_tokens"]) == (HIT_PAGES * PAGE,) * 3
    assert out["mamba_key_read"] == [HIT_PAGES] and out["mamba_pages_read"] == 1


@pytest.mark.parametrize("tree", ["parent", "patched"])
def test_a_kv_only_hit_is_still_shortened_to_the_free_capacity(reports: dict, tree: str):
    """Unchanged without a trailing-state sidecar: the shorter KV prefix is usable, so it is loaded."""
    out = reports[tree]["kv_only_short_capacity"]
    assert (out["transfer_tokens"], out["completed_tokens"], out["loaded_tokens"]) == (FREE_PAGES * PAGE,) * 3
    assert out["mamba_key_read"] is None
