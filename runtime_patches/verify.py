#!/usr/bin/env python3
"""Fail-closed verifier for the SGLang runtime patch series (stdlib only).

The runtime image must contain exactly the pinned parent's files plus the series'
changes, nothing else. Any drift -- inventory, series order, patch bytes, a file's
before/after hash chain, a hunk that does not apply verbatim, an extra or missing
file -- exits non-zero with one line naming the first difference.

    python3 runtime_patches/verify.py                    # manifest alone, no tree
    python3 runtime_patches/verify.py --tree SITE        # SITE/sglang must be the patched result
    python3 runtime_patches/verify.py --tree SITE --expect parent   # ... or the pinned parent (either: any)
    python3 runtime_patches/verify.py --tree SITE --apply  # verify parent, apply, verify result
    python3 runtime_patches/verify.py --tree SITE --ignore-bytecode  # a built image: __pycache__ left aside

A symlink anywhere under SITE/sglang fails (it could point the checked path at unchecked bytes), and the
manifest's wheel sha256 must be one of the hashes requirements.lock pins for the same sglang version.

The parent's wheel carries native extensions named for one CPython ABI (``*.cpython-312-*.so``). A tree
installed from the same release's wheel for another ABI (the images' CPython 3.11) differs in exactly those
files: ``parent.abi_variants[TAG]`` pins that wheel and each of its native files, the tree's own extension
names say which ABI it is, and every other file is checked against the one inventory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "sglang"
NATIVE_RE = re.compile(r"\.(cpython-3\d+)-[^/]*\.so$")  # a native extension, named for its ABI
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_EOL = "\\ No newline at end of file"


class Drift(Exception):
    """A difference between what the manifest promises and what is there."""


@dataclass
class Hunk:
    old_start: int
    old_len: int
    lines: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    path: str
    hunks: list[Hunk] = field(default_factory=list)
    created: bool = False
    deleted: bool = False


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_inventory(inventory: dict[str, str]) -> bytes:
    """sha256sum-compatible text, sorted by path, so the digest is canonical."""
    return "".join(f"{digest}  {path}\n" for path, digest in sorted(inventory.items())).encode()


def parse_inventory(data: bytes) -> dict[str, str]:
    inventory = {}
    for line in data.decode().splitlines():
        digest, path = line.split("  ", 1)
        inventory[path] = digest
    return inventory


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name.split("/", 1)[1] if name.startswith(("a/", "b/")) else name


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a unified diff; anything before the first '--- ' line is the header."""
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
            created, deleted = old == "/dev/null", new == "/dev/null"
            files.append(FilePatch(new if created else old, [], created, deleted))
            i += 2
            continue
        match = HUNK_RE.match(lines[i])
        if match and files:
            old_len = 1 if match.group(2) is None else int(match.group(2))
            files[-1].hunks.append(Hunk(int(match.group(1)), old_len))
        elif files and files[-1].hunks and lines[i].rstrip("\n") == NO_EOL:
            files[-1].hunks[-1].lines[-1] = files[-1].hunks[-1].lines[-1].rstrip("\n")
        elif files and files[-1].hunks and lines[i][:1] in (" ", "-", "+"):
            files[-1].hunks[-1].lines.append(lines[i])
        i += 1
    return files


def apply_hunks(old: str, fpatch: FilePatch, patch_name: str) -> str:
    """Apply hunks at their exact line numbers: no fuzz, no offset."""
    src = old.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for hunk in fpatch.hunks:
        start = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
        if start < pos:
            raise Drift(f"patch {patch_name} does not apply cleanly: overlapping hunks in {fpatch.path}")
        out.extend(src[pos:start])
        pos = start
        for line in hunk.lines:
            tag, body = line[0], line[1:]
            if tag in " -":
                if pos >= len(src) or src[pos] != body:
                    raise Drift(f"patch {patch_name} does not apply cleanly to {fpatch.path} at line {pos + 1}")
                pos += 1
            if tag in " +":
                out.append(body)
    out.extend(src[pos:])
    return "".join(out)


def apply_file(old: bytes | None, fpatch: FilePatch, patch_name: str) -> bytes | None:
    if fpatch.deleted:
        return None
    return apply_hunks("" if old is None else old.decode(), fpatch, patch_name).encode()


def load_manifest(rp_dir: Path) -> dict:
    return json.loads((rp_dir / "manifest.json").read_text())


def read_series(rp_dir: Path) -> list[str]:
    lines = (rp_dir / "series").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _check_digest(what: str, data: bytes, want_sha: str, want_count: int) -> dict[str, str]:
    got = sha256_bytes(data)
    if got != want_sha:
        raise Drift(f"{what} digest drift: manifest {want_sha[:16]}, found {got[:16]}")
    inventory = parse_inventory(data)
    if len(inventory) != want_count:
        raise Drift(f"{what} count drift: manifest {want_count}, found {len(inventory)}")
    return inventory


def lock_hashes(rp_dir: Path, package: str, version: str) -> set[str]:
    """The sha256 hashes requirements.lock pins for package==version (empty when it is not pinned)."""
    hashes: set[str] = set()
    inside = False
    for line in (rp_dir / "requirements.lock").read_text().splitlines():
        if line and not line[0].isspace():
            inside = line.split(" ", 1)[0].strip() == f"{package}=={version}"
        elif inside:
            hashes.update(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return hashes


def check_lock(rp_dir: Path, parent: dict) -> None:
    """The wheel the manifest pins must be one the lock installs: else the image is not what was verified."""
    hashes = lock_hashes(rp_dir, PACKAGE, parent["version"])
    if not hashes:
        raise Drift(f"requirements.lock does not pin {PACKAGE}=={parent['version']}")
    if parent["wheel_sha256"] not in hashes:
        raise Drift(f"manifest wheel sha256 {parent['wheel_sha256'][:16]} is not among requirements.lock's "
                    f"hashes for {PACKAGE}=={parent['version']}")


def native_tag(inventory: dict[str, str]) -> str | None:
    """The one CPython ABI the tree's native extensions are built for (None: it has none)."""
    tags = {m.group(1) for path in inventory if (m := NATIVE_RE.search(path))}
    if len(tags) > 1:
        raise Drift(f"native extensions for several ABIs in one tree: {sorted(tags)}")
    return next(iter(tags), None)


def for_abi(manifest: dict, parent_inv: dict[str, str], result: dict[str, str],
            tag: str | None) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """(parent, result) inventories for a tree whose native extensions are built for ``tag``."""
    canonical = native_tag(parent_inv)
    if tag is None or tag == canonical:
        return parent_inv, result
    variant = manifest["parent"].get("abi_variants", {}).get(tag)
    if variant is None:
        raise Drift(f"the manifest pins {PACKAGE} for {canonical} only; parent.abi_variants has no {tag}")
    natives = {p for p in parent_inv if NATIVE_RE.search(p)}
    if set(variant["native"]) != {p.replace(f".{canonical}-", f".{tag}-") for p in natives}:
        raise Drift(f"abi_variants[{tag}] does not name the parent's native extensions for {tag}")
    if any(NATIVE_RE.search(path) for entry in manifest["patches"] for path in entry["files"]):
        raise Drift("a patch touches a native extension: no ABI variant can be derived")

    def swap(inv: dict[str, str]) -> dict[str, str]:
        return {**{p: d for p, d in inv.items() if p not in natives}, **variant["native"]}

    return swap(parent_inv), swap(result)


def check_variants(rp_dir: Path, manifest: dict, parent_inv: dict[str, str], result: dict[str, str]) -> None:
    """Every ABI variant's wheel is one the lock installs, and its native files replace the parent's one for one."""
    parent = manifest["parent"]
    hashes = lock_hashes(rp_dir, PACKAGE, parent["version"])
    for tag, variant in parent.get("abi_variants", {}).items():
        if variant["wheel_sha256"] not in hashes:
            raise Drift(f"abi_variants[{tag}] wheel sha256 {variant['wheel_sha256'][:16]} is not among "
                        f"requirements.lock's hashes for {PACKAGE}=={parent['version']}")
        for_abi(manifest, parent_inv, result, tag)


def check_manifest(rp_dir: Path) -> tuple[dict, dict[str, str], dict[str, str]]:
    """Check everything that needs no tree; return (manifest, parent, expected result)."""
    manifest = load_manifest(rp_dir)
    parent = manifest["parent"]
    check_lock(rp_dir, parent)
    inv_bytes = (rp_dir / parent["inventory"]).read_bytes()
    parent_inv = _check_digest("parent inventory", inv_bytes, parent["inventory_sha256"], parent["file_count"])
    state = dict(parent_inv)
    names = [p["name"] for p in manifest["patches"]]
    series = read_series(rp_dir)
    if series != names:
        raise Drift(f"series file does not match the manifest: series {series}, manifest {names}")
    for entry in manifest["patches"]:
        data = (rp_dir / "patches" / entry["name"]).read_bytes()
        if sha256_bytes(data) != entry["sha256"]:
            raise Drift(f"patch {entry['name']} sha256 changed: manifest {entry['sha256'][:16]}")
        touched = sorted(fp.path for fp in parse_patch(data.decode()))
        if touched != sorted(entry["files"]):
            raise Drift(f"patch {entry['name']} touches {touched}, manifest lists {sorted(entry['files'])}")
        for path, hashes in entry["files"].items():
            if state.get(path) != hashes["before"]:
                raise Drift(f"patch {entry['name']}: before hash of {path} does not chain")
            if hashes["after"] is None:
                state.pop(path, None)
            else:
                state[path] = hashes["after"]
    result = manifest["result"]
    if sha256_bytes(render_inventory(state)) != result["inventory_sha256"]:
        raise Drift("patched inventory digest drift: the chained hashes do not give the manifest's result")
    if len(state) != result["file_count"]:
        raise Drift(f"patched count drift: manifest {result['file_count']}, chain gives {len(state)}")
    check_variants(rp_dir, manifest, parent_inv, state)
    return manifest, parent_inv, state


def tree_inventory(site: Path, ignore_bytecode: bool = False) -> dict[str, str]:
    """Every file under SITE/sglang, path relative to SITE -> sha256 (``__pycache__`` left out when asked:
    the image byte-compiles the tree after verifying it)."""
    root = site / PACKAGE
    if root.is_symlink():
        raise Drift(f"symlink in tree: {PACKAGE}")
    if not root.is_dir():
        raise Drift(f"no {PACKAGE}/ package under {site}")
    inventory = {}
    for dirpath, dirs, files in os.walk(root):
        if ignore_bytecode:
            dirs[:] = [d for d in dirs if d != "__pycache__" or Path(dirpath, d).is_symlink()]
        for name in (*dirs, *files):
            full = Path(dirpath, name)
            if full.is_symlink():
                raise Drift(f"symlink in tree: {full.relative_to(site).as_posix()}")
        for name in files:
            full = Path(dirpath, name)
            if not full.is_file():
                raise Drift(f"not a regular file in tree: {full.relative_to(site).as_posix()}")
            inventory[full.relative_to(site).as_posix()] = sha256_file(full)
    return inventory


def first_difference(actual: dict[str, str], expected: dict[str, str], label: str) -> str | None:
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    changed = sorted(p for p in expected.keys() & actual.keys() if expected[p] != actual[p])
    if missing:
        return f"{label}: missing file {missing[0]} ({len(missing)} missing)"
    if extra:
        return f"{label}: extra file {extra[0]} ({len(extra)} extra)"
    if changed:
        return f"{label}: content differs for {changed[0]} ({len(changed)} changed)"
    return None


def apply_series(site: Path, rp_dir: Path, manifest: dict) -> None:
    """Apply each patch, checking every touched file's hash before and after."""
    for entry in manifest["patches"]:
        text = (rp_dir / "patches" / entry["name"]).read_text()
        for fpatch in parse_patch(text):
            target = site / fpatch.path
            old = target.read_bytes() if target.exists() else None
            hashes = entry["files"][fpatch.path]
            if (None if old is None else sha256_bytes(old)) != hashes["before"]:
                raise Drift(f"patch {entry['name']}: {fpatch.path} before hash differs from manifest")
            new = apply_file(old, fpatch, entry["name"])
            if (None if new is None else sha256_bytes(new)) != hashes["after"]:
                raise Drift(f"patch {entry['name']}: {fpatch.path} after hash differs from manifest")
            if new is None:
                target.unlink()
            else:
                target.write_bytes(new)


def run(rp_dir: Path, tree: Path | None, apply: bool, expect: str = "patched", ignore_bytecode: bool = False) -> dict:
    manifest, parent, result = check_manifest(rp_dir)
    summary = {
        "ok": True,
        "series_version": manifest["series_version"],
        "parent": f"{PACKAGE}=={manifest['parent']['version']}",
        "parent_files": len(parent),
        "patches": len(manifest["patches"]),
        "result_files": len(result),
        "result_inventory_sha256": manifest["result"]["inventory_sha256"],
    }
    if tree is None:
        return {**summary, "mode": "manifest"}
    actual = tree_inventory(tree, ignore_bytecode and not apply)
    tag = native_tag(actual)
    parent, result = for_abi(manifest, parent, result, tag)
    summary["abi"] = tag or native_tag(parent)
    if apply:
        diff = first_difference(actual, parent, "tree is not the pinned parent")
        if diff:
            raise Drift(diff)
        apply_series(tree, rp_dir, manifest)
        diff = first_difference(tree_inventory(tree), result, "patched tree")
        if diff:
            raise Drift(diff)
        return {**summary, "mode": "applied", "tree": str(tree)}
    if actual == result:
        state = "patched"
    elif actual == parent:
        state = "parent"
    else:
        label = {"patched": "tree is not the patched result", "parent": "tree is not the pinned parent"}
        raise Drift(first_difference(actual, result if expect == "patched" else parent,
                                     label.get(expect, "tree is neither the parent nor the patched result")))
    if expect != "either" and state != expect:
        raise Drift(f"tree is the {state} {PACKAGE}=={manifest['parent']['version']}, expected the {expect} one")
    return {**summary, "mode": "tree", "state": state, "tree": str(tree)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, help="directory that contains the installed sglang/ package")
    ap.add_argument("--apply", action="store_true", help="apply the series to --tree, verifying both ends")
    ap.add_argument("--expect", choices=("patched", "parent", "either"), default="patched",
                    help="what --tree (without --apply) must be (default: patched)")
    ap.add_argument("--ignore-bytecode", action="store_true",
                    help="leave __pycache__ directories out of the --tree check (a byte-compiled image)")
    ap.add_argument("--patches-dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.apply and args.tree is None:
        ap.error("--apply needs --tree")
    try:
        summary = run(args.patches_dir, args.tree, args.apply, args.expect, args.ignore_bytecode)
    except (Drift, OSError, KeyError, ValueError) as exc:
        print(f"runtime_patches verify FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
