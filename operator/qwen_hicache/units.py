"""Quantities and byte counts: read with `kubernetes.utils.parse_quantity` (the only parser), written for people
in binary units. A leaf: it imports nothing of the package.

Machines get exact integers (the status, the rendered objects); a person reading a size (a condition message,
an event, `qwen-hicache size`, the demo) gets `168Gi`, never `180388626432`.
"""

from __future__ import annotations

import math
from decimal import Decimal

from kubernetes.utils import parse_quantity

KIB, MIB, GIB, TIB, PIB = (1 << (10 * i) for i in range(1, 6))
GB = 10**9
_BINARY = (("Pi", PIB), ("Ti", TIB), ("Gi", GIB), ("Mi", MIB), ("Ki", KIB))


def quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity's value, or None when `value` is not one (a name, a flag, `inf`, `1_000`)."""
    if not isinstance(value, str) or not value or not (value[0].isdigit() or value[0] in "+-."):
        return None
    if "_" in value or value != value.strip():
        return None
    try:
        amount = parse_quantity(value)
    except ValueError:
        return None
    return amount if amount.is_finite() else None


def to_bytes(value: str) -> int:
    """A memory or storage quantity in whole bytes (rounded up); ValueError when it is not a quantity."""
    amount = quantity(value)
    if amount is None:
        raise ValueError(f"{value!r} is not a quantity")
    return math.ceil(amount)


def same_quantity(a: str, b: str) -> bool:
    """Both are quantities of the same value (the API server stores `2000m` as `2`)."""
    qa, qb = quantity(a), quantity(b)
    return qa is not None and qb is not None and qa == qb


def binary(n: int | float | str, down: bool = False) -> str:
    """Bytes (or a quantity) for people: `168Gi`, `600Gi`, `1.5Ti`, `512Mi`, `100B`: at most one decimal, rounded
    up so a requirement is never understated (`down` for a limit, so it is never overstated)."""
    n = to_bytes(n) if isinstance(n, str) else int(math.ceil(n))
    rnd = math.floor if down else math.ceil
    for suffix, size in _BINARY:
        if n >= size:
            whole, rest = divmod(n, size)
            if not rest:
                return f"{whole}{suffix}"
            tenths = rnd(n * 10 / size)
            return f"{tenths // 10}{suffix}" if tenths % 10 == 0 else f"{tenths / 10:.1f}{suffix}"
    return f"{n}B"
