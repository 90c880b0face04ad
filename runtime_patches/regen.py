#!/usr/bin/env python3
"""Regenerate the parent inventory and manifest.json after a deliberate change.

Run after editing a patch, the series, or the pinned wheel; review the diff of
manifest.json like code. Reads the pinned wheel (zip) directly, stdlib only:

    python3 runtime_patches/regen.py --wheel PATH/sglang-0.5.23-cp312-...whl [--version V] \
        [--abi-wheel PATH/sglang-0.5.23-cp311-...whl]   # pin the same release's wheel for another ABI

Pinned ABI variants (``parent.abi_variants``) are kept unless a new wheel for that ABI is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify  # noqa: E402  (sibling module; the directory is not a package)

HERE = verify.HERE


def wheel_files(wheel: Path) -> dict[str, bytes]:
    """The sglang/ package files of the wheel, path -> bytes."""
    with zipfile.ZipFile(wheel) as zf:
        return {
            info.filename: zf.read(info)
            for info in zf.infolist()
            if info.filename.startswith(f"{verify.PACKAGE}/") and not info.is_dir()
        }


def chain_patches(files: dict[str, bytes], names: list[str], rp_dir: Path) -> list[dict]:
    """Apply each patch in memory, recording every touched file's before/after hash."""
    entries = []
    for name in names:
        data = (rp_dir / "patches" / name).read_bytes()
        touched = {}
        for fpatch in verify.parse_patch(data.decode()):
            old = files.get(fpatch.path)
            new = verify.apply_file(old, fpatch, name)
            touched[fpatch.path] = {
                "before": None if old is None else verify.sha256_bytes(old),
                "after": None if new is None else verify.sha256_bytes(new),
            }
            if new is None:
                files.pop(fpatch.path, None)
            else:
                files[fpatch.path] = new
        entries.append({"name": name, "sha256": verify.sha256_bytes(data), "files": touched})
    return entries


def abi_variant(wheel: Path) -> tuple[str, dict]:
    """(ABI tag, entry) for ``parent.abi_variants``: the wheel and its native extensions' hashes."""
    native = {p: verify.sha256_bytes(d) for p, d in wheel_files(wheel).items() if verify.NATIVE_RE.search(p)}
    tag = verify.native_tag(native)
    if tag is None:
        raise SystemExit(f"{wheel.name} has no native extensions: it needs no ABI variant")
    return tag, {"wheel": wheel.name, "wheel_sha256": verify.sha256_file(wheel), "native": native}


def regenerate(wheel: Path, rp_dir: Path, version: str | None, abi_wheels: tuple[Path, ...] = ()) -> dict:
    old = verify.load_manifest(rp_dir) if (rp_dir / "manifest.json").exists() else {}
    parent = old.get("parent", {})
    files = wheel_files(wheel)
    inventory = {path: verify.sha256_bytes(data) for path, data in files.items()}
    inv_bytes = verify.render_inventory(inventory)
    inv_name = parent.get("inventory", "inventory-sglang-0.5.23.txt")
    (rp_dir / inv_name).write_bytes(inv_bytes)
    patches = chain_patches(files, verify.read_series(rp_dir), rp_dir)
    result = {path: verify.sha256_bytes(data) for path, data in files.items()}
    manifest = {
        "series_version": version or old.get("series_version", "0.5.23-qhc.1"),
        "parent": {
            "package": verify.PACKAGE,
            "version": parent.get("version", "0.5.23"),
            "wheel": wheel.name,
            "wheel_sha256": verify.sha256_file(wheel),
            "inventory": inv_name,
            "inventory_sha256": verify.sha256_bytes(inv_bytes),
            "file_count": len(inventory),
            "abi_variants": {**parent.get("abi_variants", {}), **dict(map(abi_variant, abi_wheels))},
        },
        "patches": patches,
        "result": {
            "inventory_sha256": verify.sha256_bytes(verify.render_inventory(result)),
            "file_count": len(result),
        },
    }
    (rp_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--version", help="new series version label (default: keep)")
    ap.add_argument("--abi-wheel", type=Path, action="append", default=[], help="the same release for another ABI")
    ap.add_argument("--patches-dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    args = ap.parse_args()
    manifest = regenerate(args.wheel, args.patches_dir, args.version, tuple(args.abi_wheel))
    print(json.dumps({"series_version": manifest["series_version"], **manifest["result"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
