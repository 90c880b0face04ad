"""Rollout benchmark: many cache-aware rolling restarts at once, and a new resource created meanwhile.

Why a benchmark: how long rollouts take depends on the machine, so the figures are printed beside a baseline
measured in the same run (one rollout alone, a new resource on an idle operator), never asserted on wall time.
Two rules are checked (exit status 1 otherwise): every rollout completes, and the new resource gets its
StatefulSet while the rollouts run (an operator whose rollouts held its worker threads would starve it).

What runs: a fresh real control plane (harness.devcluster), the kubelet stand-ins (harness.sim: nodes, pods
as processes on loopback, the engine stand-in), the operator as a subprocess (`qwen-hicache run
--standalone`). Servers are the shipped example with one replica and no disk tier (a stand-in engine with
the disk tier imports torch: 50 of them do not fit in 24 GB), so a rollout is: canary, delete, a new pod,
readiness, the check.

    python bench/rollouts.py [--servers 50] [--timeout 900] [--smoke] [--baseline DIR] [--groups]

`--groups` adds the multi-node row: on a fresh control plane with the real LeaderWorkerSet controller, one
server of 2 replicas x 2 nodes (LWS groups) with its disk tier, restarted once: time per group restart (release
-> ready, from status), the whole rollout, warm groups, and the operator's CPU per group.

`--baseline DIR` runs everything first with the operator of another checkout (a git worktree of an older
commit), on a fresh control plane of its own, and prints both side by side with the ratio this/baseline.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import math
import statistics
import sys
import tempfile
import time
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
from harness.polling import wait_for  # noqa: E402
from harness.sim.cluster import SimCluster  # noqa: E402

EXAMPLE = REPO / "examples" / "qwenhicache.yaml"
NAMESPACE = "bench-rollouts"


def server_doc(name: str) -> dict[str, Any]:
    """The shipped example: one replica, no disk tier, a short request drain."""
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    spec = doc["spec"]
    spec["replicas"] = 1
    spec["hicache"]["disk"] = {"enabled": False}
    spec["runtime"]["maxRequestSeconds"] = 2
    spec["rollout"] = {"podTimeoutSeconds": 600}
    return doc


class Bench:
    """The cluster-side helpers: create servers, restart them, read their rollouts."""

    def __init__(self, api: client.ApiClient, sim: SimCluster) -> None:
        self.custom, self.apps, self.sim = client.CustomObjectsApi(api), client.AppsV1Api(api), sim

    def create(self, name: str) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, server_doc(name))

    def has_sts(self, name: str) -> bool:
        try:
            return bool(self.apps.read_namespaced_stateful_set(name, NAMESPACE))
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise

    def sts_latency(self, name: str, timeout: float) -> float:
        """Seconds from creating `name` until its StatefulSet exists."""
        began = time.monotonic()
        self.create(name)
        wait_for(lambda: self.has_sts(name), f"StatefulSet {name}", timeout, interval=0.05)
        return time.monotonic() - began

    def up(self, names: list[str], timeout: float) -> None:
        for name in names:
            self.create(name)
        for name in names:
            self.sim.wait_ready(NAMESPACE, name, 1, timeout=timeout)

    def restart(self, name: str, value: str) -> None:
        body = {"spec": {"restart": value}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, body)

    def finished(self, name: str, value: str) -> dict[str, Any] | None:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        rs = (obj.get("status") or {}).get("restart") or {}
        return rs if rs.get("id", "").endswith(f"/{value}") and rs.get("phase") in ("Complete", "Paused") else None


def rollout_seconds(rs: dict[str, Any]) -> float:
    """started -> finished of a rollout, from its status (second resolution)."""
    def t(stamp: str) -> float:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))

    return t(rs["finished"]) - t(rs["started"])


PROBES, PROBE_GAP = 5, 4.0  # new resources created while the rollouts run, one every 4 s after the first


def roll_all(bench: Bench, names: list[str], value: str, probe: str | None, timeout: float) -> dict[str, Any]:
    """Restart every server at once (one thread each); meanwhile create PROBES new resources named `probe-<i>`
    one after the other (one sample said little: the same operator's gave 1.1 and 2.1 s); wait for every rollout."""
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: bench.restart(n, value), names))
    latency, latencies = None, []
    if probe:
        time.sleep(2)  # every rollout has started
        for i in range(PROBES):
            latencies.append(round(bench.sts_latency(f"{probe}-{i}", timeout=120), 2))
            time.sleep(PROBE_GAP)
        latency = statistics.median(latencies)
    results = {}
    for name in names:
        results[name] = wait_for(lambda n=name: bench.finished(n, value), f"rollout of {name}", timeout,
                                 interval=0.5)
    wall = time.monotonic() - began
    per = [rollout_seconds(rs) for rs in results.values() if rs["phase"] == "Complete"] or [0.0]
    complete = sum(rs["phase"] == "Complete" for rs in results.values())
    for name, rs in results.items():
        if rs["phase"] != "Complete":
            print(f"{name}: {rs['phase']} {rs.get('reason')}: {rs.get('message')}", flush=True)
    return {"wall": wall, "median": statistics.median(per), "max": max(per), "complete": complete,
            "latency": latency, "latencies": latencies}  # fmt: skip


def _rows(run: dict[str, Any], n: int) -> list[tuple[str, float, float]]:
    alone, many = run["alone"], run["many"]
    return [
        ("rollouts at once", 1, n),
        ("all rollouts complete (s)", alone["wall"], many["wall"]),
        ("rollout, median (s)", alone["median"], many["median"]),
        ("rollout, slowest (s)", alone["max"], many["max"]),
        ("completed", alone["complete"], many["complete"]),
        ("new resource -> STS, median (s)", run["idle_latency"], many["latency"]),
    ]


def table(run: dict[str, Any], n: int, baseline: dict[str, Any] | None = None) -> str:
    """alone / idle, N at once and their ratio; with a baseline run also its N column and this/baseline."""
    head = f"{'metric':34} {'alone / idle':>13} {'N at once':>10} {'ratio':>8}"
    if baseline:
        head = f"{'metric':34} {'baseline N':>11} {'alone / idle':>13} {'N at once':>10} {'ratio':>8} {'vs base':>8}"
    lines = [head, "-" * len(head)]
    base_rows = _rows(baseline, n) if baseline else [None] * 6
    for (label, a, b), base in zip(_rows(run, n), base_rows, strict=True):
        ratio = f"{b / a:.2f}x" if a else "-"
        if base is None:
            lines.append(f"{label:34} {a:13.2f} {b:10.2f} {ratio:>8}")
        else:
            versus = f"{b / base[2]:.2f}x" if base[2] else "-"
            lines.append(f"{label:34} {base[2]:11.2f} {a:13.2f} {b:10.2f} {ratio:>8} {versus:>8}")
    return "\n".join(lines)


def run(servers: int, timeout: float, workdir: Path, repo: Path = REPO) -> dict[str, Any]:
    """One fresh cluster, nodes and operator (of checkout `repo`): a rollout alone, then `servers` at once."""
    workdir.mkdir(parents=True, exist_ok=True)
    quiet = lambda msg: None  # noqa: E731 - DevCluster's chatter would break the table
    with DevCluster(lws=False, log=quiet) as cluster:  # single-node servers: no LWS controller in the measurement
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        nodes = math.ceil((servers + 3) * 2 / 8) + 1  # the example's pods ask for 2 GPUs; 8 per node
        with SimCluster(api, workdir / "volumes", NAMESPACE, nodes=nodes) as sim:
            sim.weights_claim(NAMESPACE)
            op = OperatorProcess(cluster.kubeconfig, workdir / "operator.log", repo=repo)
            op.start()
            try:
                bench = Bench(api, sim)
                bench.up(["solo"], timeout=180)
                idle_latency = bench.sts_latency("probe-idle", timeout=120)
                alone = roll_all(bench, ["solo"], "alone", None, timeout)
                names = [f"s{i:03d}" for i in range(servers)]
                bench.up(names, timeout=max(180, servers * 6))
                many = roll_all(bench, names, "many", "probe-busy", timeout)
            finally:
                op.stop()
    return {"alone": alone, "idle_latency": idle_latency, "many": many, "nodes": nodes, "workdir": workdir}


def group_doc(name: str, replicas: int, nodes: int) -> dict[str, Any]:
    """A multi-node server: `replicas` LWS groups of `nodes` pods, each pod with its own disk-tier claim."""
    doc = server_doc(name)
    spec = doc["spec"]
    spec.update(replicas=replicas, nodesPerReplica=nodes, router={"enabled": False})
    spec["hicache"]["disk"] = {"enabled": True, "size": "8Gi"}
    return doc


def run_groups(timeout: float, workdir: Path, repo: Path = REPO, replicas: int = 2, nodes: int = 2) -> dict[str, Any]:
    """The multi-node row: one group server restarted once on the real LWS controller (see the module doc)."""
    workdir.mkdir(parents=True, exist_ok=True)
    quiet = lambda msg: None  # noqa: E731
    with DevCluster(log=quiet) as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        with SimCluster(api, workdir / "volumes", NAMESPACE, nodes=replicas * nodes, max_grace_seconds=30) as sim:
            sim.weights_claim(NAMESPACE)
            op = OperatorProcess(cluster.kubeconfig, workdir / "operator.log", repo=repo)
            proc = op.start()
            try:
                bench, custom = Bench(api, sim), client.CustomObjectsApi(api)
                began = time.monotonic()
                custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, group_doc("g", replicas,
                                                                                                       nodes))
                wait_for(lambda: _ready_groups(custom, "g") == replicas, "groups ready", timeout, interval=0.5)
                up = time.monotonic() - began
                cpu = psutil.Process(proc.pid)
                cpu0 = sum(cpu.cpu_times()[:2])
                bench.restart("g", "groups")
                rs = wait_for(lambda: bench.finished("g", "groups"), "the group rollout", timeout, interval=0.5)
                cpu_s = sum(cpu.cpu_times()[:2]) - cpu0
            finally:
                op.stop()
    per = [r.get("timeToReadySeconds") or 0 for r in rs.get("results") or []]
    return {"up": up, "rollout": rollout_seconds(rs) if rs["phase"] == "Complete" else 0.0, "phase": rs["phase"],
            "per_group": per, "warm": sum(bool(r.get("warm")) for r in rs.get("results") or []),
            "replicas": replicas, "nodes": nodes, "cpu_per_group": cpu_s / replicas, "workdir": workdir}


def _ready_groups(custom: client.CustomObjectsApi, name: str) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return sum(g.get("readyNodes") == len(g.get("nodes") or [0]) for g in (obj.get("status") or {}).get("groups")
               or [])  # fmt: skip


def groups_table(g: dict[str, Any]) -> str:
    per = g["per_group"] or [0]
    return "\n".join([
        f"multi-node row: {g['replicas']} groups x {g['nodes']} nodes, disk tier on, real LWS v0.9.0",
        f"{'groups ready after create (s)':34} {g['up']:13.2f}",
        f"{'group rollout complete (s)':34} {g['rollout']:13.2f}",
        f"{'group restart, release -> ready (s)':34} {statistics.median(per):13.2f}  (each: {per})",
        f"{'groups warm after restart':34} {g['warm']:13d}",
        f"{'operator CPU / group restart (s)':34} {g['cpu_per_group']:13.2f}",
    ])


def _ok(result: dict[str, Any], servers: int, what: str) -> bool:
    ok = result["many"]["complete"] == servers and result["alone"]["complete"] == 1
    if not ok:
        print(f"FAIL ({what}): {servers - result['many']['complete']} rollouts did not complete "
              f"(see {result['workdir']}/operator.log)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the rollouts to finish")
    ap.add_argument("--smoke", action="store_true", help="3 servers: CI's check that the benchmark still runs")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="another checkout (a git worktree of an older commit): run it first, print both")
    ap.add_argument("--groups", action="store_true",
                    help="also the multi-node row (2 LWS groups x 2 nodes, restarted once; needs the LWS build)")
    args = ap.parse_args(argv)
    servers = 3 if args.smoke else args.servers
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp:
        base = None
        if args.baseline:
            base = run(servers, args.timeout, Path(tmp) / "baseline", args.baseline.resolve())
        this = run(servers, args.timeout, Path(tmp) / "this")
        print(f"bench/rollouts.py: {servers} servers (1 replica each, no disk tier), real control plane, "
              f"kubelet stand-ins on {this['nodes']} nodes, operator as a subprocess"
              + (f"; baseline: the operator of {args.baseline}" if base else ""))
        print(table(this, servers, base))
        print(f"new resources during the rollouts -> StatefulSet (s): {this['many']['latencies']}"
              + (f"; baseline {base['many']['latencies']}" if base else ""))
        ok = _ok(this, servers, "this checkout") and (base is None or _ok(base, servers, "baseline"))
        if args.groups:
            groups = run_groups(args.timeout, Path(tmp) / "groups")
            print(groups_table(groups))
            if groups["phase"] != "Complete" or groups["warm"] != groups["replicas"]:
                print(f"FAIL (groups): the group rollout is {groups['phase']}, {groups['warm']} warm "
                      f"(see {groups['workdir']}/operator.log)")
                ok = False
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
