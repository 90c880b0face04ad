"""Sizes: parsed by kubernetes.utils.parse_quantity only, written for people in binary units."""

from __future__ import annotations

import pytest
from qwen_hicache.units import GIB, binary, same_quantity, to_bytes


@pytest.mark.parametrize(("n", "text"), [(168 * GIB, "168Gi"), (600 * GIB, "600Gi"), (1536 * GIB, "1.5Ti"),
                                         (512 << 20, "512Mi"), (100, "100B"), (GIB + 1, "1.1Gi")])
def test_binary_is_what_a_person_reads(n: int, text: str) -> None:
    assert binary(n) == text


def test_a_requirement_rounds_up_and_a_limit_down() -> None:
    assert binary(int(1.04 * GIB)) == "1.1Gi" and binary(int(1.06 * GIB), down=True) == "1Gi"


def test_a_quantity_string_reads_as_its_bytes() -> None:
    assert binary("644245094400") == "600Gi" == binary("600Gi") and binary("1.5Ti") == "1.5Ti"
    assert to_bytes("2Gi") == 2 * GIB and same_quantity("2000m", "2")
    with pytest.raises(ValueError):
        to_bytes("lots")
