"""The engine run's wheels: fetch and check them here, stage them for the device tool, install them there.

    python3 tests/gpu/engine_wheels.py fetch [--cache DIR]            # pip download + sha256 check + slim
    python3 tests/gpu/engine_wheels.py stage --repo CHECKOUT         # pieces under CHECKOUT/.gpu/cNN (<= 60 MiB)
    python3 tests/gpu/engine_wheels.py install --pieces DIR --site DIR   # on the GPU machine: join, check, install

``tests/gpu/runtime-wheels.txt`` pins every wheel by file and sha256. The device tool carries at most 64 MiB per
call (the checkout included), so ``stage`` writes every wheel into one tar stream and cuts it into pieces of
``PIECE`` bytes, one folder per call (``.gpu/c01`` ...); each call copies its piece to a folder outside the
checkout that lives while the machine is warm, and ``install`` joins the pieces, checks every wheel's sha256
against the manifest again, and installs them with pip (``--no-deps --no-index``), as Dockerfile.hicache does.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "runtime-wheels.txt"
PIECE = 60 << 20
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_18_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")  # fmt: skip
# sglang-kernel 0.4.10 is 373 MB; these files are loaded only by modules the engine run never imports
# (flash_mla.py loads flashmla_ops, MLA models only; sm100/ is Blackwell's build of common_ops, while the H200
# (sm90) loads sm90/common_ops.abi3.so through load_utils). flash_ops.abi3.so (FA3, 326 MiB of the wheel) stays:
# the QSA paged-attention call goes to it (tests/gpu/shim/flash_attn). What stays is 342 MB.
SLIM = {
    "wheel": "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl",
    "remove": ["sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/sm100/"],
}
SLIM_SHA256 = "cd75971e0f4dbd5f3ba5604d0c884edf7d5d2f8daddcd566c5298186e5df32db"
LINE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9.-]*)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})"
                  r"  # (?P<file>\S+\.whl)$")


def manifest(path: Path = MANIFEST) -> list[dict]:
    """The pinned wheels: name, version, sha256, file; a malformed line raises."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            raise ValueError(f"{path.name}:{n}: not 'name==version --hash=sha256:<64 hex>  # file.whl': {line!r}")
        rows.append(m.groupdict())
    return rows


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def slim_name() -> str:
    return "slim-" + SLIM["wheel"]


def _dropped(name: str, entry: str) -> bool:
    return name == entry or (entry.endswith("/") and name.startswith(entry))


def slim_wheel(src: Path, dst: Path) -> None:
    """Copy the wheel without SLIM['remove'], entries and their dates unchanged (same input -> same bytes)."""
    drop = SLIM["remove"]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if any(_dropped(info.filename, d) for d in drop):
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                rows = zin.read(info).decode().splitlines()
                kept = [r for r in rows if not any(_dropped(r.split(",")[0], d) for d in drop)]
                zout.writestr(info, "\n".join(kept) + "\n", compress_type=info.compress_type)
                continue
            zout.writestr(info, zin.read(info), compress_type=info.compress_type)


def fetch(cache: Path) -> list[Path]:
    """Download every pinned wheel (pip, no deps), check its sha256, build the slim sglang-kernel."""
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for row in manifest():
        path = cache / row["file"]
        if not path.exists() or sha256(path) != row["sha"]:
            plat = [a for p in PLATFORMS for a in ("--platform", p)]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(cache),
                            f"{row['name']}=={row['version']}"], check=True)  # fmt: skip
        if sha256(path) != row["sha"]:
            raise SystemExit(f"{path.name}: sha256 {sha256(path)} is not the pinned {row['sha']}")
        out.append(path)
    src = cache / SLIM["wheel"]
    slim = cache / slim_name()
    slim_wheel(src, slim)
    got = sha256(slim)
    if got != SLIM_SHA256:
        raise SystemExit(f"{slim.name}: sha256 {got} differs from SLIM_SHA256 {SLIM_SHA256}")
    return [p for p in out if p.name != SLIM["wheel"]] + [slim]


def stage(cache: Path, repo: Path) -> list[str]:
    """One tar stream of every wheel, cut into PIECE-byte files under repo/.gpu/cNN; returns the folders."""
    wheels = fetch(cache)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for w in sorted(wheels, key=lambda p: p.name):
            info = tar.gettarinfo(str(w), arcname=w.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(w, "rb") as f:
                tar.addfile(info, f)
    data = buf.getvalue()
    root = repo / ".gpu"
    folders = []
    for i in range(0, len(data), PIECE):
        folder = root / f"c{i // PIECE + 1:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("piece-*"):
            old.unlink()
        (folder / f"piece-{i // PIECE + 1:02d}").write_bytes(data[i:i + PIECE])
        folders.append(str(folder.relative_to(repo)))
    (root / "stream.json").write_text(json.dumps({"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                                  "pieces": len(folders)}) + "\n")  # fmt: skip
    return folders


def install(pieces: Path, site: Path, wheels: Path) -> None:
    """Join the pieces, check every wheel against the manifest, pip-install them into site (no deps, no index)."""
    wheels.mkdir(parents=True, exist_ok=True)
    parts = sorted(pieces.glob("piece-*"))
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        tar.extractall(wheels, filter="data")
    want = {r["file"]: r["sha"] for r in manifest()}
    want.pop(SLIM["wheel"])
    want[slim_name()] = SLIM_SHA256
    for name, sha in want.items():
        got = sha256(wheels / name)
        if got != sha:
            raise SystemExit(f"{name}: sha256 {got} is not the pinned {sha}")
    slim = wheels / slim_name()
    slim.rename(wheels / SLIM["wheel"])
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *files], check=True)  # fmt: skip
    print(f"installed {len(files)} wheels ({len(joined)} bytes in {len(parts)} pieces) into {site}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--cache", type=Path, default=Path.home() / ".cache/qwen-hicache/engine-wheels")
    s = sub.add_parser("stage")
    s.add_argument("--cache", type=Path, default=Path.home() / ".cache/qwen-hicache/engine-wheels")
    s.add_argument("--repo", type=Path, required=True)
    i = sub.add_parser("install")
    i.add_argument("--pieces", type=Path, required=True)
    i.add_argument("--site", type=Path, required=True)
    i.add_argument("--wheels", type=Path, default=Path("/root/engine-wheels"))
    args = ap.parse_args()
    if args.cmd == "fetch":
        for p in fetch(args.cache):
            print(p)
    elif args.cmd == "stage":
        print(json.dumps(stage(args.cache, args.repo)))
    else:
        install(args.pieces, args.site, args.wheels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
