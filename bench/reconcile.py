"""Reconcile benchmark: N QwenHiCacheServers applied at once against the local API server.

Why a benchmark and not a test: speed and memory targets depend on the machine, so they are printed
as numbers and per-resource ratios side by side (never asserted on wall time). The one hard rule is
asserted: a no-op resync writes nothing (exit status 1 otherwise).

What runs: a fresh `DevCluster` with the API server's audit log switched on, the generated CRD, and the
operator as a *subprocess* (`qwen-hicache run --standalone`) so its CPU time and peak RSS (VmHWM) are
its own. Requests are counted server-side from the audit log and attributed by User-Agent: the
operator speaks as `kopf/...` (watches, finalizers, annotations, events) and `OpenAPI-Generator/...`
(its reconcile client); this script sets its own User-Agent so its polling is excluded.

    python bench/reconcile.py [--resources 200] [--namespaces 4] [--resync 10] [--compare 20] [--baseline DIR]
                              [--nodes-per-replica 2]

`--nodes-per-replica K` (K > 1) makes every resource a multi-node server (`nodesPerReplica: K`, one
LeaderWorkerSet group of K pods per replica): the real LWS controller runs, and a resource has converged once
its LWS exists and every claim of every group (K per replica, made by LWS's StatefulSets) carries the
fingerprint. Run it beside the default (one node) for the multi-node row.

`--baseline DIR` runs the same N first with the operator of another checkout (e.g. `git worktree add --detach
DIR <commit>`), on a fresh control plane of its own, and prints it beside this checkout's with the ratio.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from qwen_hicache.spec import GROUP, PLURAL, VERSION  # noqa: E402

from harness.demo import install_crd  # noqa: E402 - after the path fix for a non-installed checkout
from harness.devcluster import DevCluster  # noqa: E402
from harness.operator_process import OperatorProcess  # noqa: E402

EXAMPLE = REPO / "examples" / "qwenhicache.yaml"
BENCH_AGENT = "qwen-hicache-bench/1"
MANAGED = "app.kubernetes.io/managed-by=qwen-hicache-operator"
FINGERPRINT = "qwenhicache.io/fingerprint"
HANDLED = f"{GROUP}/last-handled-configuration"
"""Kopf's record that the create handler finished (its last patch of a new resource). A timer pass can converge a
resource before its create handler ran (the create lane is 2 threads): without this, that patch lands later."""
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
WORKLOADS = frozenset({"statefulsets", "leaderworkersets"})
LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")


def open_cluster(lws: bool = False) -> tuple[DevCluster, str]:
    """A real control plane logging every request to the API server's audit log (with the LeaderWorkerSet
    controller when `lws`: multi-node servers)."""
    quiet = lambda msg: None  # noqa: E731 - DevCluster's chatter would break the table
    return DevCluster(request_log=True, lws=lws, log=quiet), "kube-apiserver audit log, DevCluster(request_log=True)"


@dataclass(frozen=True)
class Request:
    """One API request as the server recorded it."""

    verb: str
    agent: str
    resource: str

    @property
    def by_operator(self) -> bool:
        """Kopf's own client, or the kubernetes client the reconciler uses (the bench sets its own agent)."""
        return self.agent.startswith(("kopf/", "OpenAPI-Generator/"))

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def is_pass(self) -> bool:
        """One reconcile pass: every pass reads its serving workload once (the resource itself is read only when
        the trigger's body is not the newest version the operator knows, so its GETs no longer count passes)."""
        return self.verb == "get" and self.resource in WORKLOADS and self.agent.startswith("OpenAPI")


def server_requests(cluster: DevCluster) -> list[Request]:
    """Every request the server has logged so far, oldest first, each once (a watch logs two stages).

    The log is append-only, so `len()` of this list at a moment marks that moment: windows are slices.
    """
    return [
        Request(r["verb"], r["userAgent"], r["resource"] + (f"/{r['subresource']}" if r["subresource"] else ""))
        for r in cluster.requests()
    ]


def bench_client(kubeconfig: Path, pool: int) -> client.ApiClient:
    """A client with its own User-Agent (excluded from the operator's counts) and a pool for `pool` threads."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    api = client.ApiClient(cfg)
    api.user_agent = BENCH_AGENT
    return api


def resources(count: int, namespaces: int, nodes: int = 1) -> list[dict[str, Any]]:
    """`count` copies of the example with distinct names, round-robin over `namespaces` namespaces; `nodes` > 1:
    multi-node servers (the example's tensorParallelSize split over that many nodes)."""
    base = yaml.safe_load(EXAMPLE.read_text())
    if nodes > 1:
        base["spec"]["nodesPerReplica"] = nodes
        base["spec"]["runtime"]["tensorParallelSize"] = max(nodes, base["spec"]["runtime"]["tensorParallelSize"])
    docs = []
    for i in range(count):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"bench-{i:04d}", "namespace": f"bench-{i % namespaces}"}
        docs.append(doc)
    return docs


def apply_all(api: client.ApiClient, docs: list[dict[str, Any]], threads: int) -> None:
    """Server-side apply every resource concurrently, as a burst of `kubectl apply --server-side`."""
    custom = client.CustomObjectsApi(api)

    def one(doc: dict[str, Any]) -> None:
        meta = doc["metadata"]
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], doc,
            field_manager="bench-user", force=True, _content_type="application/apply-patch+yaml",
        )  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, docs))


def converged(api: client.ApiClient, nodes: int = 1) -> int:
    """How many resources have their StatefulSet (LeaderWorkerSet when `nodes` > 1), both Services, a current
    Ready/Progressing status, every cache claim (made by the real StatefulSet controller, in its own time;
    `nodes` per replica) annotated with the fingerprint, and Kopf's record of the handled creation."""
    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    if nodes > 1:
        sts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in custom.list_cluster_custom_object(
            *LWS, label_selector=MANAGED)["items"]}  # fmt: skip
    else:
        sts = {(s.metadata.namespace, s.metadata.name) for s in apps.list_stateful_set_for_all_namespaces(
            label_selector=MANAGED).items}  # fmt: skip
    svc = {(s.metadata.namespace, s.metadata.name) for s in core.list_service_for_all_namespaces(
        label_selector=MANAGED).items}  # fmt: skip
    # LWS's StatefulSets label a group's claims with the LWS's name only, never with the claim template's labels.
    owner, claims = (("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/name") if nodes > 1
                     else ("app.kubernetes.io/instance", MANAGED))  # fmt: skip
    annotated: dict[tuple[str, str], int] = collections.Counter(
        (c.metadata.namespace, c.metadata.labels.get(owner, ""))
        for c in core.list_persistent_volume_claim_for_all_namespaces(label_selector=claims).items
        if FINGERPRINT in (c.metadata.annotations or {}))
    done = 0
    for obj in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        meta, status = obj["metadata"], obj.get("status") or {}
        key = (meta["namespace"], meta["name"])
        types = {c.get("type") for c in status.get("conditions") or []}
        done += (
            key in sts and key in svc and (key[0], f"{key[1]}-headless") in svc
            and status.get("observedGeneration") == meta["generation"] and {"Ready", "Progressing"} <= types
            and annotated[key] == obj["spec"].get("replicas", 1) * nodes
            and HANDLED in (meta.get("annotations") or {})
        )  # fmt: skip
    return done


def wait_until(what: str, check: Any, timeout: float, interval: float = 0.25) -> None:
    """Poll `check()` until true; fail loudly with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def proc_kib(pid: int, field_name: str) -> int:
    """A `Vm*` line of /proc/<pid>/status in KiB (VmHWM is the kernel's own peak-RSS record)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


@dataclass
class Result:
    """The numbers of one run, in base units (seconds, counts, KiB)."""

    n: int
    label: str = ""
    replicas: int = 1
    """Replicas per resource (LWS groups of a multi-node server): the per-replica rows divide by n x this."""
    """Column heading: `N=<n>`, or `<baseline> N=<n>` for a baseline run."""
    source: str = ""
    apply_s: float = 0.0
    converge_s: float = 0.0
    requests: int = 0
    writes: int = 0
    cpu_s: float = 0.0
    noop_window_s: float = 0.0
    noop_reconciles: int = 0
    noop_reads: int = 0
    noop_writes: int = 0
    idle_rss_kib: int = 0
    peak_rss_kib: int = 0
    breakdown: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    noop_breakdown: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)


def run_once(n: int, namespaces: int, resync: float, threads: int, timeout: float, keep_logs: bool,
             repo: Path = REPO, label: str = "", nodes: int = 1) -> Result:
    """One fresh cluster + operator (of checkout `repo`); apply N, wait to converge, then watch >= 2 resync
    periods of no-op."""
    docs = resources(n, namespaces, nodes)
    res = Result(n, label or f"N={n}", replicas=docs[0]["spec"].get("replicas", 1) if docs else 1)
    workdir = Path(tempfile.mkdtemp(prefix="qwen-hicache-bench-"))
    cluster, res.source = open_cluster(lws=nodes > 1)
    with cluster:
        api = bench_client(cluster.kubeconfig, threads)
        install_crd(api)
        core = client.CoreV1Api(api)
        for i in range(namespaces):
            core.create_namespace({"metadata": {"name": f"bench-{i}"}})
        operator = OperatorProcess(cluster.kubeconfig, workdir / "operator.log",
                                   env={"QWEN_HICACHE_RESYNC_SECONDS": str(resync)}, repo=repo)
        proc = operator.start()
        try:
            op = psutil.Process(proc.pid)

            def watching() -> bool:
                if proc.poll() is not None:
                    raise SystemExit(f"error: the operator exited ({proc.returncode}); log: {workdir}/operator.log")
                return any(r.by_operator and r.verb == "watch" and r.resource == PLURAL
                           for r in server_requests(cluster))  # fmt: skip

            wait_until("the operator to watch the CRD", watching, 60)
            time.sleep(1)  # let the initial lists settle before the baseline
            res.idle_rss_kib = proc_kib(proc.pid, "VmRSS")
            cpu0 = sum(op.cpu_times()[:2])
            i0, t0 = len(server_requests(cluster)), time.monotonic()
            apply_all(api, docs, threads)
            res.apply_s = time.monotonic() - t0
            wait_until(f"{n} resources to converge", lambda: converged(api, nodes) == n, timeout)
            res.converge_s = time.monotonic() - t0
            res.cpu_s = sum(op.cpu_times()[:2]) - cpu0
            i1 = len(server_requests(cluster))
            # Settle: Kopf posts events in batches, and StatefulSet watch events queue behind the busy handler
            # pool (measured: up to ~10 s after convergence at N=200), so the no-op window starts a period later.
            time.sleep(max(3.0, resync))
            i2, w0 = len(server_requests(cluster)), time.monotonic()
            time.sleep(2 * resync + 2)
            i3 = len(server_requests(cluster))
            res.noop_window_s = time.monotonic() - w0
            res.peak_rss_kib = proc_kib(proc.pid, "VmHWM")
        finally:
            operator.stop()
        log = server_requests(cluster)
    until = [r for r in log[i0:i1] if r.by_operator]
    res.requests, res.writes = len(until), sum(r.write for r in until)
    res.breakdown.update((r.agent.split("/")[0], r.verb, r.resource) for r in until)
    noop = [r for r in log[i2:i3] if r.by_operator]
    res.noop_reconciles = sum(r.is_pass for r in noop)
    res.noop_writes = sum(r.write for r in noop)
    res.noop_reads = len(noop) - res.noop_writes
    res.noop_breakdown.update((r.agent.split("/")[0], r.verb, r.resource) for r in noop)
    if keep_logs:
        print(f"  (operator log kept in {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return res


def rows(r: Result) -> list[tuple[str, float, str]]:
    """(metric, value, format) for one run; the per-resource rows are the ones that should stay flat."""
    per = max(r.n, 1)
    resyncs = r.noop_reconciles or 1
    return [
        ("resources applied at once", r.n, "{:.0f}"),
        ("apply burst (s)", r.apply_s, "{:.2f}"),
        ("time to converge (s)", r.converge_s, "{:.2f}"),
        ("throughput (resources/s)", r.n / r.converge_s if r.converge_s else 0, "{:.1f}"),
        ("operator requests until converged", r.requests, "{:.0f}"),
        ("  requests / resource", r.requests / per, "{:.2f}"),
        ("  writes / resource", r.writes / per, "{:.2f}"),
        ("  requests / replica (group)", r.requests / (per * r.replicas), "{:.2f}"),
        ("operator CPU until converged (s)", r.cpu_s, "{:.2f}"),
        ("  CPU ms / resource", 1000 * r.cpu_s / per, "{:.1f}"),
        ("  CPU ms / replica (group)", 1000 * r.cpu_s / (per * r.replicas), "{:.1f}"),
        ("no-op window (s)", r.noop_window_s, "{:.1f}"),
        ("  no-op resync reconciles", r.noop_reconciles, "{:.0f}"),
        ("  reads / no-op resync", r.noop_reads / resyncs, "{:.2f}"),
        ("  writes / no-op resync (must be 0)", r.noop_writes / resyncs, "{:.3f}"),
        ("  writes in no-op window", r.noop_writes, "{:.0f}"),
        ("operator RSS idle (MiB)", r.idle_rss_kib / 1024, "{:.1f}"),
        ("operator peak RSS (MiB)", r.peak_rss_kib / 1024, "{:.1f}"),
        ("  peak-idle RSS / resource (KiB)", (r.peak_rss_kib - r.idle_rss_kib) / per, "{:.1f}"),
    ]


def table(results: list[Result]) -> str:
    """Metrics down, runs across; with two runs a last column is the ratio large/small."""
    heads = ["metric", *(r.label for r in results)] + ([f"{results[-1].label} / {results[0].label}"]
                                                       if len(results) == 2 else [])  # fmt: skip
    body = []
    for cells in zip(*(rows(r) for r in results), strict=True):
        line = [cells[0][0], *(fmt.format(v) for _, v, fmt in cells)]
        if len(results) == 2:
            a, b = cells[0][1], cells[1][1]
            line.append(f"{b / a:.2f}x" if a else ("-" if not b else "inf"))
        body.append(line)
    widths = [max(len(row[i]) for row in [heads, *body]) for i in range(len(heads))]

    def fmt_row(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt_row(heads), sep, *map(fmt_row, body)])


def breakdown(title: str, counts: collections.Counter[tuple[str, str, str]], n: int) -> str:
    """Operator requests by client, verb and resource, with the per-resource ratio."""
    lines = [title]
    for (agent, verb, resource), c in counts.most_common():
        lines.append(f"  {agent:<18} {verb:<7} {resource:<40} {c:>7}  {c / max(n, 1):>6.2f}/resource")
    return "\n".join(lines)


def _commit(repo: Path) -> str:
    """Short commit of a checkout (`+` when its tree differs from it), for column headings."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or repo.name) + ("+" if git("status", "--porcelain", "-uno") else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resources", type=int, default=200, help="resources applied at once (default 200)")
    ap.add_argument("--namespaces", type=int, default=4, help="namespaces they are spread over (default 4)")
    ap.add_argument("--resync", type=float, default=10, help="operator resync period, s (default 10)")
    ap.add_argument("--threads", type=int, default=16, help="client threads applying the burst (default 16)")
    ap.add_argument("--timeout", type=float, default=600, help="give up converging after this many s")
    ap.add_argument("--compare", type=int, metavar="N", help="also run N resources first and print the ratio")
    ap.add_argument("--keep-logs", action="store_true", help="keep the operator log (its path is printed)")
    ap.add_argument("--nodes-per-replica", type=int, default=1, metavar="K",
                    help="multi-node servers (K > 1: LeaderWorkerSet groups, the real LWS controller runs)")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="another checkout (e.g. a git worktree of an older commit): run the same N with its "
                         "operator first and print the ratio this/baseline")
    args = ap.parse_args(argv)

    if args.baseline:
        runs = [(args.resources, args.baseline.resolve(), f"{_commit(args.baseline)} N={args.resources}"),
                (args.resources, REPO, f"{_commit(REPO)} N={args.resources}")]
    else:
        sizes = [args.compare, args.resources] if args.compare else [args.resources]
        runs = [(n, REPO, f"N={n}" + (f" x{args.nodes_per_replica}n" if args.nodes_per_replica > 1 else ""))
                for n in sizes]
    print(f"reconcile benchmark: {', '.join(label for _, _, label in runs)}, over {args.namespaces} namespaces, "
          f"resync {args.resync:g}s, {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    results = []
    for n, repo, label in runs:
        started = time.monotonic()
        results.append(run_once(n, args.namespaces, args.resync, args.threads, args.timeout, args.keep_logs,
                                repo, label, args.nodes_per_replica))  # fmt: skip
        print(f"  {label}: done in {time.monotonic() - started:.0f}s", flush=True)
    print(f"operator requests: counted server-side ({results[-1].source}), attributed by User-Agent")
    print()
    print(table(results))
    print()
    for r in results if args.baseline else results[-1:]:
        print(breakdown(f"operator requests until converged, {r.label}:", r.breakdown, r.n))
        print(breakdown(f"operator requests in the no-op window, {r.label}:", r.noop_breakdown, r.n))
    bad = [r for r in results if r.noop_writes]
    for r in bad:
        writes = collections.Counter({k: c for k, c in r.noop_breakdown.items() if k[1] in WRITE_VERBS})
        print(breakdown(f"FAIL: writes during the no-op window, N={r.n}:", writes, r.n))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
