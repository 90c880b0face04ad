"""The module map holds: imports point down the layers docs/architecture.md declares, and the import graph's floors
are counted from the code (issue 22's goals)."""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

import pytest
from resources import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "qwen_hicache"
DOC = ROOT / "docs" / "architecture.md"
FLOOR_GOAL = 10
FLOORS_NOW = 10
"""Measured after issue 22's flattening (cli > handlers > reconciler > execute > plan_model > derive > fingerprint
> spec > geometry > typed; as long: plan, status or workload in execute's place, render or policies in
plan_model's, sizing or rollout in fingerprint's); it may only go down."""


def modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def imports(module: str) -> set[str]:
    """The package's modules `module` imports, anywhere in it (function-level imports count)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        parts = (node.module or "").split(".")
        if node.level == 1:
            out |= {parts[0]} if node.module else {a.name for a in node.names}
        elif parts[0] == "qwen_hicache":
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
    return (out & set(modules())) - {module}


def declared_layers() -> dict[str, int]:
    """`| \\`module\\` | layer | ... |` rows of the doc's table: the one place layers are declared."""
    return {m: int(n) for m, n in re.findall(r"^\| `([a-z_]+)` \| (\d+) \|", DOC.read_text(), re.M)}


@functools.cache
def floor(module: str) -> int:
    return 1 + max((floor(m) for m in imports(module)), default=0)


def test_every_module_has_a_declared_layer() -> None:
    assert sorted(declared_layers()) == modules()


def test_no_module_imports_one_above_it() -> None:
    layers = declared_layers()
    upward = [f"{m} ({layers[m]}) imports {d} ({layers[d]})" for m in modules() for d in sorted(imports(m))
              if layers[d] > layers[m]]  # fmt: skip
    assert not upward


def test_the_import_graph_never_grows_a_floor() -> None:
    assert max(map(floor, modules())) <= FLOORS_NOW


def test_at_most_ten_floors_of_imports() -> None:
    assert max(map(floor, modules())) <= FLOOR_GOAL


ENTRY_GOAL = 2
"""Issue 22: following a spec from `plan()` enters no module more than twice."""


def entries_following(doc: dict) -> Counter[str]:
    """How often `plan()` of `doc` enters each module of the package, traced call by call.

    An entry is a call of a function defined in a module whose nearest calling package frame is in another module
    (a dataclass's generated `__init__` and a property count). Calls a library makes back into the package during
    one library call (pydantic running the spec's validators) are one entry: the spec is parsed once. The
    declared layer-1 modules are the package's vocabulary (names, quantities, the typed base, the runtime's flag
    table), read like the standard library, and are not counted."""
    from qwen_hicache.cli import offline_meta
    from qwen_hicache.plan import plan

    prefix, vocabulary = "qwen_hicache.", {m for m, n in declared_layers().items() if n == 1}

    def module(frame: FrameType | None) -> str | None:
        name = frame.f_globals.get("__name__", "") if frame else ""
        return name.removeprefix(prefix) if name.startswith(prefix) else None

    entries: Counter[str] = Counter()
    via: dict[str, FrameType] = {}

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        callee = module(frame)
        if event != "call" or callee is None or callee in vocabulary:
            return
        caller, library = frame.f_back, None
        while caller is not None and module(caller) is None:
            library, caller = caller, caller.f_back
        if module(caller) == callee or (library is not None and via.get(callee) is library):
            return
        if library is not None:
            via[callee] = library
        entries[callee] += 1

    meta = offline_meta(doc)
    plan(meta, doc["spec"])  # imports and caches first: the walk is what one more pass does
    sys.setprofile(profile)
    try:
        p = plan(meta, doc["spec"])
    finally:
        sys.setprofile(None)
    assert not p.blocked, p.problems
    return entries


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_following_a_spec_from_plan_enters_no_module_more_than_twice(name: str) -> None:
    entries = entries_following(VARIANTS[name])
    assert {m: n for m, n in entries.items() if n > ENTRY_GOAL} == {}, sorted(entries.items())
