"""SIMULATION ONLY (the replicas; the router is real): the `smg` router in front of engine stand-ins on loopback.

What is real: the `smg` binary (the pinned PyPI wheel) started with the flags `render_router.router_args`
renders, reading the worker manifest the operator renders (file discovery), resolving the workers' stable
DNS names; its health checks, policy and retries. What is simulated: cluster DNS and the kubelet's ConfigMap
projection. Cluster DNS is a hosts file bind-mounted over /etc/hosts in the router's own mount namespace
(`unshare -m`, as root): `<pod>.<server>-headless.<ns>.svc.cluster.local` -> the stand-in's current loopback
IP. It is strict: a pod that is stopped has no record (as a deleted pod has none) and a restarted pod gets a
new IP, so nothing works unless the router resolves names. The manifest file is written in place of the
ConfigMap volume (optionally late, as a kubelet is).

    lab = RouterLab(tmp, replicas=2); lab.start(); lab.generate(text); lab.restart_pod(0); lab.restart_router()
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen_hicache import render_router
from qwen_hicache.router import router_workers
from qwen_hicache.spec import QwenHiCacheServerSpec

from harness.sim.cluster import IpPool
from harness.sim.nameshim import NameShim, with_hosts
from harness.sim.sglang_tree import TREE_ENV, patched_sglang_tree

NAME, NAMESPACE, MODEL = "chat", "lab", "Qwen/sim-router"
ENGINE_PORT = 30000
ROUTER_PORT = 8000


def smg_binary() -> str:
    path = Path(sys.executable).with_name("smg")
    return str(path) if path.exists() else (shutil.which("smg") or "smg")


def lab_spec(replicas: int, **router: Any) -> QwenHiCacheServerSpec:
    """A spec for the lab's server: only the router and runtime port matter here."""
    return QwenHiCacheServerSpec.model_validate({
        "model": {"weights": {"claimName": "weights"}, "servedName": MODEL, "revision": "0123456789abcdef"},
        "runtime": {"image": "runtime@sha256:" + "0" * 64, "port": ENGINE_PORT, "maxRequestSeconds": 30},
        "replicas": replicas, "router": {"enabled": True, **router},
    })  # fmt: skip


@dataclass
class Pod:
    """One serving replica: an engine stand-in on a loopback IP that changes at every restart."""

    ordinal: int
    cache_dir: Path
    extra: list[str]
    ip: str = ""
    proc: subprocess.Popen | None = None
    incarnations: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{NAME}-{self.ordinal}"

    @property
    def host(self) -> str:
        return render_router.worker_host(NAME, NAMESPACE, self.ordinal)

    def call(self, method: str, path: str, timeout: float = 10) -> tuple[int, str]:
        req = urllib.request.Request(f"http://{self.ip}:{ENGINE_PORT}{path}", data=b"" if method == "POST" else None,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def info(self) -> dict:
        return json.loads(self.call("GET", "/sim/info")[1])


class RouterLab:
    """N engine stand-ins, their manifest, the name shim and one real `smg` router (restartable)."""

    def __init__(self, root: Path, replicas: int, engine_args: list[str] | None = None,
                 manifest_delay: float = 0.0, **router: Any) -> None:  # fmt: skip
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.spec = lab_spec(replicas, **router)
        self.meta = {"name": NAME, "namespace": NAMESPACE}
        self.manifest_path = self.root / render_router.MANIFEST_KEY
        self.manifest_delay = manifest_delay
        self.shim = NameShim(self.root / "hosts")
        self.ips = IpPool()
        self.router_ip = self.ips.take(ROUTER_PORT)
        self.router_proc: subprocess.Popen | None = None
        self.router_starts = 0
        self.drained: set[str] = set()
        self.tree = str(patched_sglang_tree())
        args = ["--enable-cache-report", "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
                "--enable-metrics", "--served-model-name", MODEL, "--page-size", "64",
                "--hicache-storage-prefetch-policy", "wait_complete", *(engine_args or [])]
        self.pods = [Pod(i, self.root / f"cache-{i}", args) for i in range(replicas)]

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, router: bool = True) -> RouterLab:
        """Start the replicas, and the router unless `router` is False (the plain-Service baseline)."""
        for pod in self.pods:
            self._start_pod(pod)
        for pod in self.pods:
            self._wait_pod(pod)
        self.write_manifest()
        if router:
            self.start_router()
        return self

    def stop(self) -> None:
        self.stop_router()
        for pod in self.pods:
            self._kill(pod)

    def __enter__(self) -> RouterLab:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start_pod(self, pod: Pod) -> None:
        pod.ip = self.ips.take(ENGINE_PORT)
        pod.cache_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, TREE_ENV: self.tree, "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(pod.cache_dir)}
        argv = [sys.executable, "-m", "harness.sim.engine", *pod.extra, "--host", pod.ip, "--port", str(ENGINE_PORT)]
        pod.proc = subprocess.Popen(argv, env=env, cwd=Path(__file__).resolve().parents[2],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pod.incarnations += 1

    def _wait_pod(self, pod: Pod, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if pod.call("GET", "/ready", timeout=2)[0] == 200:
                    self.shim.set(pod.host, pod.ip)  # the pod exists with an IP: its DNS record appears
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{pod.name} not ready")

    def _kill(self, pod: Pod, sig: int = signal.SIGKILL) -> None:
        if pod.proc and pod.proc.poll() is None:
            pod.proc.send_signal(sig)
            pod.proc.wait(30)
        self.shim.set(pod.host, None)
        if pod.ip:
            self.ips.release(pod.ip)

    def stop_pod(self, ordinal: int, flush: bool = True) -> None:
        """preStop (wait for running requests, flush queued disk writes), then SIGTERM; the record goes."""
        pod = self.pods[ordinal]
        if flush:
            pod.call("POST", "/flush_cache?timeout=30", timeout=40)
        pod.proc.send_signal(signal.SIGTERM)
        pod.proc.wait(30)
        self._kill(pod)

    def start_pod(self, ordinal: int) -> None:
        pod = self.pods[ordinal]
        self._start_pod(pod)
        self._wait_pod(pod)

    def kill_pod(self, ordinal: int) -> None:
        """A pod that dies without warning (node loss): no drain, no flush."""
        self._kill(self.pods[ordinal])

    # -- the manifest (what the operator writes into the ConfigMap) ----------------------------
    def write_manifest(self) -> None:
        text = render_router.manifest_text(render_router.manifest(self.meta, self.spec, frozenset(self.drained)))

        def write() -> None:
            time.sleep(self.manifest_delay)
            tmp = self.manifest_path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.manifest_path)  # atomic, as the kubelet swaps a ConfigMap volume's ..data link

        if self.manifest_delay and self.manifest_path.exists():
            threading.Thread(target=write, daemon=True).start()
        else:
            write()

    def workers(self) -> dict[str, str] | None:
        return router_workers(self.router_ip, ROUTER_PORT)

    def wait_workers(self, predicate, timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.workers()
            if seen is not None and predicate(seen):
                return seen
            time.sleep(0.1)
        raise TimeoutError(f"router workers never matched: {seen}")

    def drain(self, ordinal: int) -> None:
        """The rollout's "before delete": out of the manifest, then wait until the router stops routing to it."""
        name = self.pods[ordinal].name
        self.drained.add(name)
        self.write_manifest()
        self.wait_workers(lambda w: w.get(name) in (None, "draining"))

    def undrain(self, ordinal: int) -> None:
        """The rollout's "after warm check": back in the manifest, then wait until the router routes to it."""
        name = self.pods[ordinal].name
        self.drained.discard(name)
        self.write_manifest()
        self.wait_workers(lambda w: w.get(name) == "ready")

    def restart_pod(self, ordinal: int, warm_check: str | None = None) -> None:
        """One step of the operator's rolling restart, with the router seam around the delete."""
        self.drain(ordinal)
        self.stop_pod(ordinal)
        self.start_pod(ordinal)
        if warm_check is not None:
            self.generate_direct(ordinal, warm_check)
        self.undrain(ordinal)

    # -- the router ---------------------------------------------------------------------------
    def router_argv(self) -> list[str]:
        """The rendered `smg launch` flags with the addresses and the manifest path of this lab."""
        args = render_router.router_args(self.spec)
        overrides = {"--host": self.router_ip, "--port": str(ROUTER_PORT), "--discovery-file": str(self.manifest_path),
                     "--prometheus-port": str(ROUTER_PORT + 1), "--prometheus-host": self.router_ip}
        for i, a in enumerate(args[:-1]):
            if a in overrides:
                args[i + 1] = overrides[a]
        return [smg_binary(), "launch", *args]

    def start_router(self) -> None:
        with open(self.root / f"router-{self.router_starts}.log", "wb") as log:  # the child keeps its own fd
            self.router_proc = subprocess.Popen(with_hosts(self.shim.path, self.router_argv()),
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.router_starts += 1
        listed = {p.name for p in self.pods} - self.drained
        self.wait_workers(lambda w: all(w.get(n) == "ready" for n in listed), timeout=90)

    def stop_router(self) -> None:
        if self.router_proc and self.router_proc.poll() is None:
            os.killpg(self.router_proc.pid, signal.SIGKILL)  # a crashed router: nothing of its memory survives
            self.router_proc.wait(30)

    def restart_router(self) -> None:
        self.stop_router()
        self.start_router()

    # -- requests -----------------------------------------------------------------------------
    def generate(self, text: str, max_new_tokens: int = 8, timeout: float = 30) -> dict:
        """One `/generate` through the router; returns `meta_info` (raises on a non-200 answer)."""
        body = {"model": MODEL, "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
        return _post(f"http://{self.router_ip}:{ROUTER_PORT}/generate", body, timeout)

    def generate_direct(self, ordinal: int, text: str, max_new_tokens: int = 8) -> dict:
        """Straight to one replica (what kube-proxy does for a plain Service, or the operator's canary)."""
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
        return _post(f"http://{self.pods[ordinal].ip}:{ENGINE_PORT}/generate", body, 30)

    def received(self) -> list[int]:
        """Per replica: `/generate` requests its current process received (refused ones included)."""
        return [p.info()["received"] if p.proc and p.proc.poll() is None else 0 for p in self.pods]

    def landing(self, text: str) -> tuple[int, dict]:
        """Send one request through the router and tell which replica served it (requests must not overlap)."""
        before = self.received()
        meta = self.generate(text)
        after = self.received()
        moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
        return (moved[0] if len(moved) == 1 else -1), meta


def landing_replicas(router_url: str, model: str, texts: list[str], engine_urls: list[str]) -> list[int]:
    """For any router in front of engine stand-ins (the demo's, say): the index in `engine_urls` of the replica
    that served each text, sent one at a time through `router_url` (-1 when it cannot tell)."""

    def received() -> list[int]:
        out = []
        for url in engine_urls:
            try:
                with urllib.request.urlopen(f"{url}/sim/info", timeout=5) as r:
                    out.append(int(json.loads(r.read())["received"]))
            except OSError:
                out.append(0)
        return out

    landed = []
    for text in texts:
        before = received()
        _post(f"{router_url}/generate", {"model": model, "text": text, "sampling_params": {"max_new_tokens": 8}}, 30)
        moved = [i for i, (a, b) in enumerate(zip(before, received(), strict=True)) if b > a]
        landed.append(moved[0] if len(moved) == 1 else -1)
    return landed


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["meta_info"]


def conversations_stay_on_their_replica(lab: RouterLab, conversations: int = 8, system_chars: int = 1000) -> dict:
    """For the demo: N conversations through the router before and after a full rolling restart and a router
    restart; the replica each landed on every time, and whether its prefix came back from disk."""
    system = ("You are a helpful assistant for the qwen-hicache demo. " * 40)[:system_chars]
    texts = [f"{system}\nUser {c}: tell me about topic {c} in detail please." for c in range(conversations)]
    before = [lab.landing(t)[0] for t in texts]
    for i in reversed(range(len(lab.pods))):
        lab.restart_pod(i)
    after_rollout = [lab.landing(t) for t in texts]
    lab.restart_router()
    after_router = [lab.landing(t)[0] for t in texts]
    return {
        "before": before,
        "afterRollingRestart": [r for r, _ in after_rollout],
        "afterRouterRestart": after_router,
        "storageTokensAfterRestart": [m.get("cached_tokens_details", {}).get("storage", 0) for _, m in after_rollout],
        "stayed": before == [r for r, _ in after_rollout] == after_router,
    }
