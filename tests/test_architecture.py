"""The module map holds: imports point down the layers docs/architecture.md declares, and the import graph's floors
are counted from the code (issue 22's goals)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

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
