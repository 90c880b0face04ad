"""How the runtime's own argparse reads an `extraArgs` token: which setting it sets, or why it fails.

The table (`data/runtime-flags.json`) is generated from SGLang's parser by `python -m harness.runtime_flags`
and checked against it by tests, so aliases (`--tensor-parallel-size`), abbreviations (`--hicache-si`, which
argparse accepts as `--hicache-size`) and misspellings are judged as the runtime judges them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Table:
    options: dict[str, str]
    """Option string -> the setting (argparse `dest`) it sets."""
    switches: frozenset[str]
    """Option strings that take no value (`store_true` and the like): the token after one is not its value."""
    allow_abbrev: bool
    prefix_chars: str
    runtime: str


@cache
def table() -> Table:
    raw = json.loads(resources.files(__package__).joinpath("data/runtime-flags.json").read_text())
    return Table(raw["options"], frozenset(raw["switches"]), raw["allowAbbrev"], raw["prefixChars"], raw["runtime"])


@dataclass(frozen=True)
class Resolved:
    """What one token means to the runtime's parser."""

    token: str
    option: str | None = None
    """The option string argparse picks (None: not an option, or no option matches)."""
    dest: str | None = None
    error: str | None = None
    """'unrecognized' or 'ambiguous' (the runtime exits at startup), else None."""
    candidates: tuple[str, ...] = ()


def resolve(token: str, t: Table | None = None) -> Resolved | None:
    """argparse's `_parse_optional` for one token; None when the token is a value, not an option."""
    t = t or table()
    if not token or token[0] not in t.prefix_chars or len(token) == 1:
        return None
    if token in t.options:
        return Resolved(token, token, t.options[token])
    name = token.split("=", 1)[0] if "=" in token else token
    if name in t.options:
        return Resolved(token, name, t.options[name])
    if t.allow_abbrev and name.startswith("--"):
        matches = tuple(sorted(o for o in t.options if o.startswith(name)))
        if len(matches) == 1:
            return Resolved(token, matches[0], t.options[matches[0]])
        if len(matches) > 1:
            return Resolved(token, error="ambiguous", candidates=matches)
    if " " in token:
        return None
    return Resolved(token, error="unrecognized")


_FLAG = re.compile(r"^(--[a-z0-9-]+)")


def flag_name(arg: str) -> str | None:
    """The `--flag` part of `--flag=value` or `--flag`, else None."""
    m = _FLAG.match(arg)
    return m.group(1) if m else None


def flag_names(args: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The flags an argument list sets (values left out)."""
    return frozenset(f for f in map(flag_name, args) if f)

