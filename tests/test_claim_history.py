"""Cache namespaces recorded on the claims, so a recreated resource still reports them."""

from __future__ import annotations

from qwen_hicache.claim_history import annotations_for, previous_on_claims
from qwen_hicache.constants import FINGERPRINT_ANNOTATION as FP
from qwen_hicache.constants import PREVIOUS_FINGERPRINTS_ANNOTATION as PREV
from qwen_hicache.status import cache_history
from qwen_hicache.status_model import Cache


def test_a_new_fingerprint_moves_the_old_one_into_the_history_bounded_by_keep() -> None:
    first = annotations_for({}, "v1-a", keep=2)
    assert first == {FP: "v1-a", PREV: ""}
    assert annotations_for(first, "v1-a", keep=2) is None  # nothing to write
    second = annotations_for({"other": "x", **first}, "v1-b", keep=2)
    assert second == {FP: "v1-b", PREV: "v1-a"}
    third = annotations_for(second, "v1-c", keep=2)
    assert third == {FP: "v1-c", PREV: "v1-b,v1-a"}
    assert annotations_for(third, "v1-d", keep=2) == {FP: "v1-d", PREV: "v1-c,v1-b"}
    assert annotations_for(third, "v1-a", keep=2) == {FP: "v1-a", PREV: "v1-c,v1-b"}  # back to an old one
    assert annotations_for(third, "v1-d", keep=0) == {FP: "v1-d", PREV: ""}


def test_a_recreated_resource_reports_what_its_claims_hold() -> None:
    claims = [{"metadata": {"annotations": {FP: "v1-b", PREV: "v1-a"}}},
              {"metadata": {"annotations": {FP: "v1-c", PREV: "v1-b,v1-a"}}}, {"metadata": {}}]  # fmt: skip
    assert previous_on_claims(claims, "v1-c") == ("v1-b", "v1-a")
    cache = Cache(fingerprint="v1-c", directory="/cache/v1-c")
    assert cache_history(cache, None, 3, ("v1-b", "v1-a")).previous_fingerprints == ["v1-b", "v1-a"]
    old = Cache(fingerprint="v1-b", previous_fingerprints=[])
    assert cache_history(cache, old, 1, ("v1-a",)).previous_fingerprints == ["v1-b"]
