"""Patch 0012: the file tier reads a disk hit straight into the host pools where a page is a few contiguous spans,
verifying it there; SGLANG_HICACHE_FILE_DIRECT_READ=0 keeps 0008's staging pages.

file_tier_direct_read_probe.py runs each tree's own code on CPU: a hybrid backup (6 KV pages, each page's QSA index
sidecar, the Mamba state on the last page) written by the HybridCacheController's backup thread, read back by the
controller's own _page_transfer into other host pages (filled with a sentinel first) and another Mamba slot; then
the same read with one page file damaged; then the scheduler side around such a read (storage_hit_probe.py's
stand-in for UnifiedRadixCache: allocate_storage_hit, _drain_ack_prefetch, _check_hybrid_prefetch_result).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_run import run_json

PAGES, PAGE, BAD = 6, 64, 2
ALL = ["exact"] * PAGES


def _probe(tree: Path, work: Path) -> dict:
    report = run_json("file_tier_direct_read_probe.py", tree, work)
    for name, out in report.items():
        assert "error" not in out, (name, out["error"])
    return report


@pytest.fixture(scope="module")
def patched(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _probe(patched_tree, tmp_path_factory.mktemp("direct-patched"))


@pytest.fixture(scope="module")
def parent(parent_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("direct-parent")
    return run_json("file_tier_direct_read_probe.py", parent_tree, work, "roundtrip")


def test_every_layout_restores_every_page_and_the_state_exactly_either_way(patched: dict):
    rt = patched["roundtrip"]
    for layout in ("page_first", "page_first_direct", "layer_first"):
        for switch in ("1", "0"):
            read = rt[layout][switch]
            assert (read["kv_tokens"], read["mamba_states"]) == (PAGES * PAGE, 1), (layout, switch)
            assert (read["kv"], read["index"], read["mamba"]) == (ALL, ALL, "exact"), (layout, switch)
            assert read["discards"] == {}


def test_page_first_layouts_read_into_the_pools_with_no_staging(patched: dict):
    rt = patched["roundtrip"]
    assert rt["has_spans"]["page_first"] == rt["has_spans"]["page_first_direct"] == {
        "kv": True, "indexer": True, "mamba": True}  # fmt: skip
    for layout in ("page_first", "page_first_direct"):
        read = rt[layout]["1"]
        # One preadv per page file (KV pages, index sidecars, the state), every payload byte into host pool memory.
        assert (read["preadv_into_pool"], read["preadv_elsewhere"], read["staging_pages"]) == (2 * PAGES + 1, 0, 0)
    assert rt["default"] == rt["page_first"]["1"]  # the switch unset: on


def test_kv_pages_go_through_staging_where_the_tail_could_be_freed_while_a_read_is_in_flight(patched: dict):
    # An operation whose controller frees the unfinished tail at termination, not after the final ack: a direct
    # read still in flight could rewrite pages already handed to another node, so its KV pages are staged.
    read = patched["roundtrip"]["tail_freed_at_termination"]
    assert (read["kv"], read["index"], read["mamba"]) == (ALL, ALL, "exact")
    assert (read["staging_pages"], read["preadv_elsewhere"]) == (PAGES, PAGES)
    assert read["preadv_into_pool"] == PAGES + 1  # the sidecars: hybrid operations only, freed at the ack


def test_layer_first_keeps_staging_for_kv_and_index_the_state_reads_in_place(patched: dict):
    rt = patched["roundtrip"]
    assert rt["has_spans"]["layer_first"] == {"kv": False, "indexer": False, "mamba": True}  # Mamba: page-first only
    read = rt["layer_first"]["1"]
    assert (read["preadv_into_pool"], read["preadv_elsewhere"]) == (1, 2 * PAGES)
    assert read["staging_pages"] == 2 * PAGES  # a 6-page KV arena, then one index page at a time


def test_the_switch_at_zero_reads_everything_through_staging(patched: dict):
    for layout in ("page_first", "page_first_direct", "layer_first"):
        read = patched["roundtrip"][layout]["0"]
        assert (read["preadv_into_pool"], read["preadv_elsewhere"]) == (0, 2 * PAGES + 1), layout
        assert read["staging_pages"] == 2 * PAGES + 1, layout


def test_parent_reads_every_page_outside_the_pools(parent: dict):
    rt = parent["roundtrip"]
    assert "error" not in rt, rt.get("error")
    assert not any(rt["has_spans"]["page_first"].values())
    read = rt["page_first"]["1"]
    assert (read["kv"], read["index"], read["mamba"]) == (ALL, ALL, "exact")
    assert read["preadv_into_pool"] == 0


def _case(patched: dict, switch: str, target: str, how: str) -> dict:
    return patched["corrupt"][f"{switch}:{target}:{how}"]


@pytest.mark.parametrize("how,reason", [("bitflip", "checksum"), ("truncated", "size"), ("zeroed", "header"),
                                        ("other_key", "key")])  # fmt: skip
def test_a_damaged_kv_page_ends_the_prefix_and_nothing_after_it_is_read(patched: dict, how: str, reason: str):
    for switch in ("1", "0"):
        got = _case(patched, switch, "kv", how)
        assert got["kv_tokens"] == BAD * PAGE, (switch, how)  # only the verified prefix is acked
        assert got["kv"][:BAD] == ["exact"] * BAD
        assert got["kv"][BAD + 1 :] == ["sentinel"] * (PAGES - BAD - 1)  # the read stops at the bad page
        assert got["mamba_states"] == 0 and got["mamba"] == "sentinel"  # KV short: the state is not read
        assert got["discards"] == {reason: 1} and not got["file_left"]
    # The direct read has written the bad page's host page (all but a short file), the staging read has not:
    # the ack above is what keeps it out of use.
    direct = _case(patched, "1", "kv", how)["kv"][BAD]
    assert direct == {"bitflip": "partly_written", "truncated": "sentinel", "zeroed": "partly_written",
                      "other_key": "other_key"}[how]  # fmt: skip
    assert _case(patched, "0", "kv", how)["kv"][BAD] == "sentinel"
    assert _case(patched, "1", "kv", how)["staging_pages"] == 0


@pytest.mark.parametrize("how", ["bitflip", "other_key"])
def test_a_damaged_index_sidecar_shortens_the_prefix_to_before_it(patched: dict, how: str):
    for switch in ("1", "0"):
        got = _case(patched, switch, "index", how)
        assert got["kv_tokens"] == (PAGES - 1) * PAGE  # the last page's sidecar is bad: min(KV, index) hits
        assert got["index"][: PAGES - 1] == ["exact"] * (PAGES - 1)
        assert got["mamba_states"] == 0


@pytest.mark.parametrize("how", ["bitflip", "truncated"])
def test_a_damaged_mamba_state_is_not_a_hit(patched: dict, how: str):
    for switch in ("1", "0"):
        got = _case(patched, switch, "mamba", how)
        assert (got["kv_tokens"], got["mamba_states"]) == (PAGES * PAGE, 0), (switch, how)
        assert got["kv"] == ALL and not got["file_left"]
    assert _case(patched, "1", "mamba", how)["mamba"] == ("partly_written" if how == "bitflip" else "sentinel")


HIT_PAGES = 4  # storage_hit_probe.py's hit


def test_a_bad_page_read_into_the_pool_lands_only_in_the_prefetchs_own_pages_and_is_never_kept(patched: dict):
    s = patched["safety"]
    for switch in ("1", "0"):
        kv, hybrid, state = (s[f"{switch}:{name}"] for name in ("kv_only", "hybrid", "hybrid_state"))
        for rec in (kv, hybrid, state):
            # allocate_storage_hit gave the prefetch host pages and a Mamba slot apart from a live node's, and the
            # live node is untouched after the read; nothing is left allocated but what was inserted.
            assert rec["host_pages_were_free"] and rec["mamba_slot_was_free"] and rec["live_node_intact"]
            assert rec["mamba_slots_still_allocated"] == 0 and rec["mamba_pages_read"] == 0
        assert kv["completed_tokens"] == hybrid["completed_tokens"] == BAD * PAGE
        # KV only: the verified prefix is inserted, the rest (the bad page included) goes back to the host pool.
        assert (kv["usable"], kv["inserted_tokens"]) == (True, BAD * PAGE)
        assert kv["host_tokens_still_allocated"] == BAD * PAGE
        # Hybrid, a bad KV page or a bad Mamba state: all or nothing; every host page and the slot go back.
        assert state["completed_tokens"] == HIT_PAGES * PAGE
        for rec in (hybrid, state):
            assert (rec["usable"], rec["inserted_tokens"], rec["host_tokens_still_allocated"]) == (False, 0, 0)
    for name in ("kv_only", "hybrid", "hybrid_state"):  # the direct read did write the bad page; staging did not
        assert s[f"1:{name}"]["bad_page_written"] and not s[f"0:{name}"]["bad_page_written"], name
        assert s[f"0:{name}"]["preadv_into_pool"] == 0
    assert s["1:kv_only"]["preadv_into_pool"] == BAD + 1  # the good prefix, then the bad page; nothing after it
    assert s["1:hybrid_state"]["preadv_into_pool"] == HIT_PAGES + 1
