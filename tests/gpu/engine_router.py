"""Issue 23 item 5: two servers of the tiny model on one GPU behind the real `smg` router, as the operator renders
them, and a rolling restart in the rollout's order driven by the operator's own code.

What runs: the StatefulSet's two pods (tests/gpu/data/tiny-qhc.yaml at `replicas: 2`, each with its own cache
volume, each on its own loopback address, a new one at every restart as a pod gets a new IP), the router as the
rendered Deployment starts it (`smg launch` with the rendered flags: file discovery, `prefix_hash`, health checks;
only the listen addresses and the manifest's path are this machine's), its worker manifest written by the
operator's own `router.sync` / `router.ready_to_delete` through `LocalKube` (the kubelet's ConfigMap projection:
the file smg watches), the pods' stable DNS names in a hosts file only the router sees (harness/sim/nameshim.py,
strict: a stopped pod has no record). The rollout is engine_pod.rolling_restart: canary, the router seam's
"before delete" (out of the manifest, and every ready router's own `GET /workers` no longer routes to it), stop
as a pod stops (preStop flush, SIGTERM), start, warm check, re-list (router.sync after each pass).
Judged: both pods warm, and every conversation's next turn lands, through the router, on the replica that
served its first turn (told apart by each replica's own `sglang:num_requests_total`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import engine_pod as ep

MANIFEST_DIR = "/etc/smg"


class LocalKube:
    """The Kube calls router.py makes (get, apply) and the router pods a reconcile gathers, answered here: the
    manifest ConfigMap applied is written to the file smg watches (atomically, as the kubelet swaps a ConfigMap
    volume), and the router pod is listed Ready, with its address, while its `/readiness` answers 200 (its
    readiness probe)."""

    def __init__(self, manifest_path: Path, router_ip: str, router_port: int, router_pod: str) -> None:
        self.path, self.ip, self.port, self.pod = manifest_path, router_ip, router_port, router_pod
        self.objects: dict[tuple[str, str], dict] = {}
        self.writes = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        return self.objects.get((kind, name))

    def apply(self, obj: dict) -> dict:
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj
        if obj["kind"] == "ConfigMap":
            (key, text), = obj["data"].items()
            tmp = self.path.with_suffix(".partial")
            tmp.write_text(text)
            tmp.replace(self.path)
            self.writes += 1
        return obj

    def list(self, api_version: str, kind: str, namespace: str, selector: dict) -> list[dict]:
        ready = ep.http_status(self.ip, self.port, "/readiness") == 200
        conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
        return [{"metadata": {"name": self.pod}, "status": {"podIP": self.ip, "conditions": conditions}}]


class RouterSeam:
    """The router side of the rollout, the operator's functions over LocalKube; pods' DNS records follow them."""

    def __init__(self, site: Path, spec_path: Path, kube: LocalKube, shim) -> None:
        from qwen_hicache import render_router, router
        from qwen_hicache.plan import parse_spec

        self.router, self.render_router = router, render_router
        import yaml

        doc = yaml.safe_load(spec_path.read_text())
        self.meta = {"name": doc["metadata"]["name"], "namespace": doc["metadata"].get("namespace", "default"),
                     "uid": "engine-run"}  # the owner reference the manifest ConfigMap carries
        self.spec = parse_spec(doc["spec"])
        self.kube, self.shim = kube, shim
        self.previous = None
        self.deferred = 0

    def host_of(self, ordinal: int) -> str:
        return self.render_router.worker_host(self.meta["name"], self.meta["namespace"], ordinal)

    def pod_up(self, slot: ep.Slot) -> None:
        """The pod has an IP: its record appears (the headless Service publishes not-ready addresses)."""
        self.shim.set(self.host_of(slot.ordinal), slot.server.host)

    def pod_gone(self, slot: ep.Slot) -> None:
        self.shim.set(self.host_of(slot.ordinal), None)

    def _gathered(self):
        """What a reconcile pass gathers first: the live children (read on demand) and the router pods."""
        from qwen_hicache.gather import Live

        return Live(), self.kube.list("v1", "Pod", self.meta["namespace"], {})

    def ready_to_delete(self, rs, pod: str) -> bool:
        live, routers = self._gathered()
        ok = self.router.ready_to_delete(self.kube, live, self.meta, self.spec, rs, pod, routers)
        self.deferred += not ok
        return ok

    def sync(self, rs) -> dict:
        live, routers = self._gathered()
        self.previous = self.router.sync(self.kube, live, self.meta, self.spec, rs, routers, self.previous)
        return self.previous.model_dump(mode="json", by_alias=True, exclude_none=True) if self.previous else {}

    def workers(self) -> dict[str, str] | None:
        return self.router.router_workers(self.kube.ip, self.kube.port)

    def wait_workers(self, want: dict[str, str], timeout: float = 60) -> dict:
        deadline, seen = time.time() + timeout, None
        while time.time() < deadline:
            seen = self.workers()
            if seen is not None and all(seen.get(k) == v for k, v in want.items()):
                return seen
            time.sleep(0.2)
        raise TimeoutError(f"router workers {seen} never matched {want}")


def smg_binary(site: Path) -> str:
    for cand in (site / "bin" / "smg", Path(sys.executable).with_name("smg")):
        if cand.exists():
            return str(cand)
    return shutil.which("smg") or "smg"


def router_argv(site: Path, docs: list[dict], ip: str, manifest: Path) -> tuple[list[str], int, dict]:
    """The rendered Deployment's `smg launch` command line, with this machine's listen addresses and file path."""
    dep = next(d for d in docs if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    args = list(c["args"])
    over = {"--host": ip, "--prometheus-host": ip, "--discovery-file": str(manifest)}
    for i, a in enumerate(args[:-1]):
        if a in over:
            args[i + 1] = over[a]
    port = int(args[args.index("--port") + 1])
    cmd = list(c["command"])
    assert cmd[0] == "smg", cmd
    shown = {"command": cmd, "args": c["args"], "name": dep["metadata"]["name"]}
    return [smg_binary(site), *cmd[1:], *args], port, shown


def served_counts(pods: list[ep.Slot], engine) -> list[float]:
    """Per replica: requests its current process has counted (`sglang:num_requests_total`)."""
    out = []
    for s in pods:
        m = engine.cache_metrics(s.server.host, s.server.port) if s.server is not None else {}
        out.append(m.get("sglang:num_requests_total", 0.0))
    return out


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def through_router(st, text: str) -> dict:
    """One request through the router; which replica served it (its request counter moved) and its cache report."""
    before = served_counts(st.slots, st.engine)
    body = {"model": st.model, "text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    t = time.time()
    meta = post(f"http://{st.kube.ip}:{st.kube.port}/generate", body)["meta_info"]
    took = time.time() - t
    after = served_counts(st.slots, st.engine)
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
    return {"replica": moved[0] if len(moved) == 1 else -1, "cached": meta.get("cached_tokens_details") or {},
            "prompt_tokens": meta.get("prompt_tokens"), "seconds": round(took, 4)}  # fmt: skip


def start(args, st, rep: dict) -> None:
    """Both pods (in parallel), their DNS records, the manifest (router.sync), then smg; both workers ready."""
    if str(ep.REPO) not in sys.path:
        sys.path.insert(0, str(ep.REPO))
    from harness.sim.nameshim import NameShim, unshare_available, with_hosts

    engine, _, _, _ = ep.operator_modules(args.site)
    st.engine = engine
    root = args.work / "router"
    shutil.rmtree(root, ignore_errors=True)
    for i in (0, 1):  # new volumes; with --keep-compile-caches they take the one-pod volume's kernels
        ep.empty_volume(root / f"volume-{i}", args.keep_compile_caches, args.work / "hicache" / ep.JIT_DIR)
    (root / "logs").mkdir(parents=True)
    st.root, st.logs = root, root / "logs"
    spec_path = ep.spec_file(root, args.tp, replicas=2)
    docs = ep.rendered(args.site, spec_path)
    st.model = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    st.model = st.model["args"][st.model["args"].index("--served-model-name") + 1]
    ips = iter(f"127.0.{args.router_net}.{i}" for i in range(10, 250))
    st.ips = ips
    router_ip = next(ips)
    manifest = root / "workers.json"
    argv, port, rendered = router_argv(args.site, docs, router_ip, manifest)
    rep["rendered_router"] = rendered
    st.kube = LocalKube(manifest, router_ip, port, f"{rendered['name']}-0")
    private = unshare_available()
    shim = NameShim(root / "hosts" if private else Path("/etc/hosts"))
    st.shim, st.private_dns = shim, private
    rep["dns"] = ("hosts file bind-mounted over /etc/hosts for the router only (unshare -m)" if private else
                  "the machine's /etc/hosts rewritten (no private mount namespace here), restored afterwards")
    st.spec_path = spec_path
    st.seam = RouterSeam(args.site, spec_path, st.kube, shim)
    name = st.seam.meta["name"]

    base = {i: ep.plan(args.site, spec_path, st.model_dir, root / f"volume-{i}", 30000) for i in (0, 1)}

    def pod(ordinal: int, n: int) -> ep.Server:  # each incarnation on a new address, as a new pod gets a new IP
        return ep.Server(ep.with_host(base[ordinal], next(ips)), args.site, st.logs, f"{name}-{ordinal}.{n}", args.tp)

    counters = {0: 0, 1: 0}

    def successor(ordinal: int):
        def make() -> ep.Server:
            counters[ordinal] += 1
            return pod(ordinal, counters[ordinal])
        return make

    st.slots = [ep.Slot(f"{name}-{i}", i, pod(i, 0), successor(i)) for i in (0, 1)]
    for s in st.slots:
        s.incarnations.append(s.server.tag)
    rep["pods"] = {s.name: {"fingerprint": s.server.p["fingerprint"], "cache_dir": s.server.p["cache_dir"]}
                   for s in st.slots}  # fmt: skip
    rep["launch_argv"] = st.slots[0].server.p["argv"]
    rep["start_s"] = []
    for s in st.slots:  # one after the other: see engine_pod.start_together
        s.server.launch()
        st.seam.pod_up(s)
        rep["start_s"].append(s.server.wait_ready())
    rep["manifest_initial"] = st.seam.sync(None)
    env = {**os.environ, "PYTHONPATH": str(args.site)}
    cmd = with_hosts(shim.path, argv) if private else argv
    st.router_log = open(st.logs / "router.log", "wb")  # noqa: SIM115 - smg writes it until it exits
    st.router = subprocess.Popen(cmd, env=env, stdout=st.router_log, stderr=subprocess.STDOUT, start_new_session=True)
    rep["router_argv"] = argv
    t = time.time()
    rep["workers_initial"] = st.seam.wait_workers({s.name: "ready" for s in st.slots}, timeout=90)
    rep["router_ready_s"] = round(time.time() - t, 2)
    ep.log(f"router ready at {router_ip}:{port}: {rep['workers_initial']}")


def first_turns(args, st, rep: dict) -> None:
    st.convs = ep.conversations(args.router_conversations, 2, args.router_prompt_chars, first=100)
    st.before = [through_router(st, c[0]) for c in st.convs]
    rep["landed_before"] = [r["replica"] for r in st.before]
    rep["first_turns"] = st.before
    ep.log(f"first turns landed on {rep['landed_before']}")


def rollout(args, st, rep: dict) -> None:
    files_down = {}

    def on_down(slot: ep.Slot) -> None:
        d = Path(slot.server.p["cache_dir"]) if slot.server else None
        files_down[slot.name] = len([f for f in os.listdir(d) if f.endswith(".bin")]) if d and d.exists() else 0

    st.seam.deferred = 0
    ro = ep.rolling_restart(args.site, st.spec_path, st.slots, seam=st.seam, on_down=on_down)
    rep["rollout"] = {k: v for k, v in ro.items() if k != "router"}
    rep["rollout"]["router_status_per_pass"] = ro["router"]
    rep["rollout"]["deferred_deletes"] = st.seam.deferred
    rep["rollout"]["page_files_at_stop"] = files_down
    rep["warm"] = ro["warm"]


def next_turns(args, st, rep: dict) -> None:
    """Back in the router: both listed and ready, then every conversation's second turn."""
    rep["workers_after"] = st.seam.wait_workers({s.name: "ready" for s in st.slots}, timeout=60)
    st.after = [through_router(st, c[1]) for c in st.convs]
    rep["landed_after"] = [r["replica"] for r in st.after]
    rep["next_turns"] = st.after
    rep["stayed"] = rep["landed_after"] == rep["landed_before"] and -1 not in rep["landed_before"]
    rep["spread"] = sorted(set(rep["landed_before"]))
    restarted_first = {}
    for i, r in enumerate(st.after):
        restarted_first.setdefault(r["replica"], (i, int(r["cached"].get("storage") or 0)))
    rep["storage_tokens_first_returning"] = {str(k): v[1] for k, v in sorted(restarted_first.items())}
    rep["storage_tokens_after"] = sum(int(r["cached"].get("storage") or 0) for r in st.after)
    rep["status_router"] = st.seam.sync(None)
    ep.log(f"second turns landed on {rep['landed_after']} (stayed: {rep['stayed']}), storage tokens "
           f"{rep['storage_tokens_after']}")  # fmt: skip


def stop(st) -> None:
    if getattr(st, "router", None) is not None and st.router.poll() is None:
        os.killpg(st.router.pid, 9)
        st.router.wait(30)
    if getattr(st, "shim", None) is not None and not st.private_dns:
        st.shim.clear()  # the machine's /etc/hosts as it was
    ep.stop_all()


def run(run_, args, model_dir_of) -> None:
    """The router part as steps of the run (each with its budget; the report's `router` section)."""
    rep = run_.report.setdefault("router", {})
    st = SimpleNamespace()

    def begin() -> None:
        st.model_dir = model_dir_of()
        start(args, st, rep)

    try:
        run_.step("router_start", args.router_budget_start, begin, needs=("model",))
        run_.step("router_first_turns", 90, lambda: first_turns(args, st, rep), needs=("router_start",))
        run_.step("router_rollout", args.router_budget_rollout, lambda: rollout(args, st, rep),
                  needs=("router_first_turns",))  # fmt: skip
        run_.step("router_next_turns", 90, lambda: next_turns(args, st, rep), needs=("router_rollout",))
    finally:
        stop(st)
        run_.save()
