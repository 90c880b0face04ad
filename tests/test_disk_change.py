"""Disk-tier changes become operations (grow, re-create) or refusals (shrink, class change)."""

from __future__ import annotations

from qwen_hicache import disk_change
from qwen_hicache.plan import objects, plan
from resources import variant

META = {"name": "flash-next", "namespace": "ns", "uid": "u1"}


def _sts(**changes: object) -> dict:
    p = plan(META, variant(**changes)["spec"])
    return next(o for o in objects(p) if o["kind"] == "StatefulSet")


def test_same_spec_needs_nothing() -> None:
    assert disk_change.classify(_sts(), _sts()).kind == "none"
    assert disk_change.classify(None, _sts()).kind == "none"


def test_growing_is_an_expansion() -> None:
    change = disk_change.classify(_sts(), _sts(**{"spec.hicache.disk.size": "800Gi"}))
    assert (change.kind, change.size, change.refused) == ("grow", str(800 * 2**30), False)
    assert "from 600Gi to 800Gi" in change.message


def test_shrinking_is_refused_with_the_current_size() -> None:
    change = disk_change.classify(_sts(), _sts(**{"spec.hicache.disk.size": "500Gi"}))
    assert change.kind == "shrink" and change.refused and "at least 600Gi" in change.message


def test_enabling_or_disabling_the_tier_recreates_the_set() -> None:
    off = {"spec.hicache.disk": {"enabled": False}}
    assert disk_change.classify(_sts(**off), _sts()).kind == "recreate"
    assert disk_change.classify(_sts(), _sts(**off)).kind == "recreate"


def test_storage_class_change_is_refused() -> None:
    change = disk_change.classify(_sts(), _sts(**{"spec.hicache.disk.storageClassName": "fast"}))
    assert change.kind == "class" and change.refused


def test_claims_below_the_new_size_are_expanded() -> None:
    claims = [{"metadata": {"name": f"hicache-x-{i}"}, "spec": {"resources": {"requests": {"storage": s}}}}
              for i, s in enumerate(["600Gi", "800Gi"])]
    assert disk_change.claims_to_expand(claims, "800Gi") == ["hicache-x-0"]


def test_growing_keeps_the_pods_target_and_enabling_changes_it() -> None:
    target = plan(META, variant()["spec"]).target
    assert plan(META, variant(**{"spec.hicache.disk.size": "800Gi"})["spec"]).target == target
    assert plan(META, variant(**{"spec.hicache.disk": {"enabled": False}})["spec"]).target != target
