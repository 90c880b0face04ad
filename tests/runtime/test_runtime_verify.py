"""The verifier passes on the pinned parent and fails closed on every kind of drift."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MANIFEST, PATCHES

VERIFY = PATCHES / "verify.py"
HICACHE = "sglang/srt/mem_cache/hicache_storage.py"


def verify(*args: str, patches: Path = PATCHES) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(VERIFY), "--patches-dir", str(patches), *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def assert_fails(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.fixture
def patches_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "runtime_patches"
    shutil.copytree(PATCHES, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def edit_manifest(patches: Path, change) -> None:
    manifest = json.loads((patches / "manifest.json").read_text())
    change(manifest)
    (patches / "manifest.json").write_text(json.dumps(manifest))


def test_manifest_alone_passes_and_prints_json_summary():
    proc = verify()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ok"] and summary["mode"] == "manifest"
    assert summary["parent_files"] == MANIFEST["parent"]["file_count"]


def test_clean_apply_to_pinned_wheel_then_tree_reads_as_patched(tree_copy: Path):
    proc = verify("--tree", str(tree_copy), "--apply")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mode"] == "applied"
    again = verify("--tree", str(tree_copy))
    assert json.loads(again.stdout)["state"] == "patched"
    assert_fails(verify("--tree", str(tree_copy), "--apply"), "tree is not the pinned parent")


def test_lock_pins_the_manifest_wheel():
    lock = (PATCHES / "requirements.lock").read_text()
    block = lock.split("\nsglang==")[1].split("\n    # via")[0]
    assert block.startswith(MANIFEST["parent"]["version"])
    assert MANIFEST["parent"]["wheel_sha256"] in block


def test_regen_reproduces_the_committed_manifest(wheel: Path, patches_copy: Path):
    subprocess.run(
        [sys.executable, str(patches_copy / "regen.py"), "--wheel", str(wheel)], check=True, capture_output=True
    )
    assert json.loads((patches_copy / "manifest.json").read_text()) == MANIFEST


def test_tampered_patch_byte(patches_copy: Path):
    patch = patches_copy / "patches" / MANIFEST["patches"][0]["name"]
    data = bytearray(patch.read_bytes())
    data[-2] ^= 0x01
    patch.write_bytes(bytes(data))
    assert_fails(verify(patches=patches_copy), "sha256 changed")


def test_reordered_series(patches_copy: Path):
    names = [p["name"] for p in MANIFEST["patches"]]
    (patches_copy / "series").write_text("\n".join(reversed(names)) + "\n")
    assert_fails(verify(patches=patches_copy), "series file does not match")


def test_inventory_digest_drift(patches_copy: Path):
    inv = patches_copy / MANIFEST["parent"]["inventory"]
    inv.write_bytes(inv.read_bytes().replace(b"  sglang/__init__.py", b"  sglang/__init__.pyc", 1))
    assert_fails(verify(patches=patches_copy), "digest drift")


def test_inventory_count_drift(patches_copy: Path):
    edit_manifest(patches_copy, lambda m: m["parent"].update(file_count=m["parent"]["file_count"] + 1))
    assert_fails(verify(patches=patches_copy), "count drift")


def test_broken_hash_chain(patches_copy: Path):
    def corrupt(m: dict) -> None:
        files = m["patches"][-1]["files"]
        files[next(iter(files))]["before"] = "0" * 64

    edit_manifest(patches_copy, corrupt)
    assert_fails(verify(patches=patches_copy), "does not chain")


def test_patch_that_does_not_apply_cleanly(patches_copy: Path, tree_copy: Path):
    """Alter a context line and re-pin the patch's sha: the hunk no longer matches the parent."""
    name = MANIFEST["patches"][0]["name"]
    patch = patches_copy / "patches" / name
    lines = patch.read_text().splitlines(keepends=True)
    first_hunk = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    context = next(i for i in range(first_hunk, len(lines)) if lines[i].startswith(" "))
    lines[context] = lines[context].rstrip("\n") + "  # drift\n"
    text = "".join(lines)
    patch.write_text(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    edit_manifest(patches_copy, lambda m: m["patches"][0].update(sha256=sha))
    assert verify(patches=patches_copy).returncode == 0  # manifest-level checks cannot see it
    assert_fails(verify("--tree", str(tree_copy), "--apply", patches=patches_copy), "does not apply cleanly")


def test_dropped_file(tree_copy: Path):
    (tree_copy / "sglang/srt/mem_cache/storage/file/__init__.py").unlink()
    assert_fails(verify("--tree", str(tree_copy), "--apply"), "missing file")


def test_extra_file(tree_copy: Path):
    (tree_copy / "sglang/srt/sitecustomize.py").write_text("")
    assert_fails(verify("--tree", str(tree_copy), "--apply"), "extra file")


def test_modified_parent_file(tree_copy: Path):
    target = tree_copy / HICACHE
    target.write_bytes(target.read_bytes() + b"\n")
    assert_fails(verify("--tree", str(tree_copy), "--apply"), "content differs")


def test_tree_must_be_the_patched_result_unless_told(tree_copy: Path):
    """A parent tree where the patched one is expected fails closed; --expect parent/either accept it."""
    assert_fails(verify("--tree", str(tree_copy)), "tree is the parent")
    assert json.loads(verify("--tree", str(tree_copy), "--expect", "parent").stdout)["state"] == "parent"
    assert json.loads(verify("--tree", str(tree_copy), "--expect", "either").stdout)["state"] == "parent"


@pytest.mark.parametrize("where", ["file", "dir", "package"])
def test_symlink_anywhere_in_the_tree(tree_copy: Path, tmp_path: Path, where: str):
    outside = tmp_path / "outside"
    outside.mkdir()
    if where == "file":  # same bytes as the pinned file, but a link: still refused
        target = tree_copy / HICACHE
        (outside / "h.py").write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(outside / "h.py")
    elif where == "dir":
        (tree_copy / "sglang/srt/linked").symlink_to(outside, target_is_directory=True)
    else:
        shutil.move(tree_copy / "sglang", outside / "sglang")
        (tree_copy / "sglang").symlink_to(outside / "sglang", target_is_directory=True)
    assert_fails(verify("--tree", str(tree_copy), "--apply"), "symlink in tree")
    assert_fails(verify("--tree", str(tree_copy), "--expect", "either"), "symlink in tree")


def test_manifest_wheel_hash_must_be_in_the_lock(patches_copy: Path):
    edit_manifest(patches_copy, lambda m: m["parent"].update(wheel_sha256="ab" * 32))
    assert_fails(verify(patches=patches_copy), "not among requirements.lock's hashes")
    lock = patches_copy / "requirements.lock"
    lock.write_text(lock.read_text().replace("\nsglang==0.5.23 ", "\nsglang==0.5.22 "))
    assert_fails(verify(patches=patches_copy), "does not pin sglang==0.5.23")
