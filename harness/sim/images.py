"""SIMULATION ONLY: the images the simulated nodes run, built from this checkout (harness.images).

Pods run their images for real (harness.sim.containers). What a cluster would pull from a registry is found in
the node's local image store instead:

- any reference naming a built image: ``localhost/<repository>:<key>``, ``localhost/<repository>@sha256:...``, or a
  short name the store holds under ``localhost/`` (the operator's default router image
  ``qwen-hicache-router:smg-1.13.0`` is the built router image, tagged so);
- the examples' placeholder runtime reference (``registry.example.com/qwen-hicache/sglang@sha256:0f4b...``, a
  digest no registry has) is served by the test-only runtime image ``runtime-sim`` (the ``tree`` target of
  Dockerfile.hicache plus the engine stand-in layer): the one mirror entry, since every example and most tests
  name it. Kinder than a registry in one way: that digest is not the served image's;
- anything else is ``ErrImagePull``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import yaml

from harness.images import tools
from harness.images.build import REPO, Builder
from harness.images.store import LocalImage

from . import containers
from .kubelet import CLUSTER_HOSTS, Node

ROUTER_ALIAS = "localhost/qwen-hicache-router:smg-1.13.0"  # the operator's default `spec.router.image`


def example_runtime_image() -> str:
    doc = yaml.safe_load((REPO / "examples" / "qwenhicache.yaml").read_text())
    return doc["spec"]["runtime"]["image"]


def built(name: str, log: Callable[[str], None] = print) -> LocalImage:
    """One of harness.images.build.IMAGES, built first when the store lacks it (minutes, once per machine)."""
    return Builder(log=log).ensure(name)


def sim_node(root: Path, log: Callable[[str], None] = print) -> Node:
    """The node side shared by a SimCluster's pods: images (built if needed), runc, the reaper."""
    tools.ensure(tools.RUN_TOOLS, log)
    builder = Builder(log=log)
    runtime = builder.ensure("runtime-sim")
    router = builder.ensure("router")
    if builder.store.lookup(ROUTER_ALIAS) is None or builder.store.lookup(ROUTER_ALIAS).id != router.id:
        builder.store.tag(router.ref, ROUTER_ALIAS)
    images = containers.Images(builder.store, {example_runtime_image(): runtime})
    runtime_dir = Path("/run") if Path("/run").is_dir() else root
    group = f"qwen-hicache-sim-{hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]}"  # one per SimCluster
    rt = containers.Runtime(runtime_dir / "qwen-hicache-runc" / group, group)
    rt.start_reaper(root)
    from harness import runtime_env

    torch = runtime_env.env_dir() / "lib" / "python3.11" / "site-packages"
    return Node(images, rt, torch_env=torch if torch.is_dir() else None, hosts=CLUSTER_HOSTS)
