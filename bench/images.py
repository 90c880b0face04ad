"""Images: what `make images-ci` costs once built, how big each image is and what fills it, and how long the engine
stand-in takes to answer /ready when the kubelet stand-in starts it from the runtime image (runc, overlay root,
mounts) against the same program started as a host process from this checkout (the old way), side by side.

    .venv/bin/python bench/images.py [--starts 5] [--smoke]

Cold build times are printed by `python -m harness.images build` when it builds (and kept in bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.deathsig import die_with_parent  # noqa: E402
from harness.images.build import CI_IMAGES, IMAGES, Builder, key_of  # noqa: E402
from harness.sim.images import example_runtime_image, sim_node  # noqa: E402
from harness.sim.kubelet import PodProcesses, Spawner  # noqa: E402

PORT = 30000
ARGS = ["--model-path", "/models/m", "--served-model-name", "bench", "--page-size", "64", "--enable-metrics"]


def _ready(ip: str, deadline: float) -> float:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{ip}:{PORT}/ready", timeout=0.5) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"{ip}:{PORT}/ready")


def host_start(ip: str, root: Path) -> float:
    """The engine stand-in as a host process from this checkout (what the kubelet stand-in ran before images)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(die_with_parent([sys.executable, "-m", "harness.sim.engine", *ARGS, "--host", ip,
                                             "--port", str(PORT)]), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        return _ready(ip, t0 + 180) - t0
    finally:
        proc.terminate()
        proc.wait()


def container_start(node, spawner: Spawner, ip: str, root: Path) -> float:
    """The same program from the runtime image, started by the kubelet stand-in's container path."""
    pod = {"metadata": {"name": "bench", "namespace": "bench", "uid": str(uuid.uuid4())},
           "spec": {"containers": [{"name": "sglang", "image": example_runtime_image(),
                                    "command": ["python3", "-m", "sglang.launch_server"], "args": ARGS,
                                    "ports": [{"name": "http", "containerPort": PORT}]}]}}  # fmt: skip
    procs = PodProcesses(pod, ip, {}, lambda *_: None, spawner, root / pod["metadata"]["uid"], [], node)
    t0 = time.monotonic()
    procs.check_images()
    procs.start_all()
    try:
        return _ready(ip, t0 + 180) - t0
    finally:
        procs.stop_engine(5)
        procs.teardown()


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def sizes(builder: Builder) -> None:
    print(f"\n{'image':13} {'buildah size':>12} {'rootfs (du)':>12}  largest directories")
    full = key_of(IMAGES["runtime"], builder.ensure("base").id)
    for name in CI_IMAGES + (("runtime",) if builder.store.lookup(f"localhost/sglang-hicache:{full}") else ()):
        image = builder.ensure(name)
        root = builder.store.mount(image)
        tops = []
        for top in ("usr/lib", "usr/share", "opt", "var"):
            for child in (root / top).iterdir() if (root / top).is_dir() else []:
                if child.is_dir() and not child.is_symlink():
                    tops.append((du(child), child.relative_to(root)))
        tops.sort(reverse=True)
        parts = ", ".join(f"/{p} {b / 1e6:.0f} MB" for b, p in tops[:4])
        print(f"{name:13} {builder.store.size(image.ref):>12} {du(root) / 1e6:>9.0f} MB  {parts}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one start each, no size breakdown")
    args = ap.parse_args()
    starts = 1 if args.smoke else args.starts
    builder = Builder(log=print)
    t0 = time.monotonic()
    for name in CI_IMAGES:
        builder.ensure(name)
    built = {n: round(t) for n, t in builder.timings.items() if t}
    print(f"make images-ci: {time.monotonic() - t0:.1f} s; built now (s): {built or 'none, every image cached'}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if not args.smoke:
        sizes(builder)
    with tempfile.TemporaryDirectory(prefix="qhc-bench-images-") as tmp:
        root = Path(tmp)
        node, spawner = sim_node(root, print), Spawner()
        try:
            host = [host_start(f"127.231.0.{i + 1}", root) for i in range(starts)]
            box = [container_start(node, spawner, f"127.231.1.{i + 1}", root) for i in range(starts)]
        finally:
            node.runtime.stop()
            spawner.close()
    hm, cm = statistics.median(host), statistics.median(box)
    print(f"\nengine stand-in start -> /ready 200 (median of {starts}): host process from the checkout {hm:.2f} s, "
          f"container from the runtime image {cm:.2f} s (x{cm / hm:.2f})")
    print(f"  host: {' '.join(f'{x:.2f}' for x in host)}\n  container: {' '.join(f'{x:.2f}' for x in box)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
