"""Patch 0002: --hicache-mamba-host-slots sizes the host Mamba pool independently."""

from __future__ import annotations


def test_flag_sets_slots_and_default_is_unchanged(probes: dict):
    patched, parent = probes["patched"]["mamba_slots"], probes["parent"]["mamba_slots"]
    assert patched["flag_default"] == 0
    assert patched["explicit_size"] == 40 + 1  # requested slots plus the pad slot
    assert patched["default_size"] == parent["default_size"]  # no flag: same pool as the parent


def test_size_split_gives_kv_everything_when_slots_are_explicit(probes: dict):
    patched = probes["patched"]["mamba_slots"]
    assert patched["split_slots_0"] == [6.0, 2.0]  # unchanged proportional split
    assert patched["split_slots_5"] == [8.0, 0]


def test_parent_lacks_the_flag(probes: dict):
    parent = probes["parent"]["mamba_slots"]
    assert parent["flag_default"] == "absent"
    assert str(parent["explicit_size"]).startswith("TypeError")
