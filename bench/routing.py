"""Routing benchmark: cached-prefix ratio of a multi-turn chat workload with many conversations in flight through
(a) a plain Service, (b) the router's cache-aware default, (c) the chosen configuration (prefix_hash on stable
worker names) and (d) prefix_hash at other load factors, against (o) a perfect-affinity oracle, per phase.

    .venv/bin/python bench/routing.py [--replicas 4] [--in-flight 8 32 64] [--load-factors 2 100] [--turns 7]
    .venv/bin/python bench/routing.py --smoke      # N=2, 4 in flight: what the test runs

In flight: K conversations, each sending its next turn as soon as its previous answer came back (K client
threads, one per conversation; every engine request takes --request-ms, so requests overlap at the router and
the replicas as they do in production). The oracle sends every conversation straight to its own replica
(conversation c to replica c mod N: perfectly balanced, perfectly affine), and while that replica is out during
the rollout to the next one: no router can keep more of the cache. Reported per configuration: the cached ratio
per phase, over the whole run, and as a share of the oracle's; the replica load spread (the busiest replica's
share of the requests x N: 1.0 is even).

Real: the `smg` router (pinned wheel) with the operator's rendered flags and worker manifest, the rollout's
drain/undrain around every pod restart, the disk tier's file code (HiCacheFile) in each engine stand-in.
Simulated: the model and its device/host pools (LRU page sets, see harness.sim.engine), cluster DNS (a
strict hosts file), and the plain Service, which is a uniform random choice among the ready replicas per
request: what kube-proxy's iptables/IPVS rules do for a ClusterIP Service without session affinity.

Phases: steady state (after a warm-up round), during a full rolling restart (each pod drained, flushed by its
preStop hook, restarted on a new IP, put back; one round of traffic while it is out, one after), after it,
after a router restart (the router process is killed and started again; for (a) nothing changes). Per phase:
cached ratio = (device + host + storage tokens) / prompt tokens, and disk share = storage tokens / prompt tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from qwen_hicache.launch import MAX_SIZE_ENV  # noqa: E402

from harness.sim.nameshim import unshare_available  # noqa: E402
from harness.sim.routerlab import RouterLab  # noqa: E402

PHASES = ("steady", "during rollout", "after rollout", "after router restart")
ORACLE = "oracle (perfect affinity)"
CHOSEN = "router prefix_hash (chosen)"
CONFIGS: dict[str, dict | None] = {
    ORACLE: None,
    "plain Service": None,
    "router cache_aware (smg default)": {"policy": "cache_aware", "balanceAbsThreshold": 64},
    CHOSEN: {"policy": "prefix_hash"},
}
"""The chosen configuration is the operator's defaults (spec.RouterSpec): prefix_hash, its load factor and
balance threshold."""
SYSTEM_PROMPTS = 4
SYSTEM_CHARS = 960  # below 4 x prefixTokens (1024 characters): the hashed head includes the conversation's opening
USER_CHARS = 160
ANSWER_TOKENS = 64
# Device and host pools per replica, in 64-token pages: the whole workload fits the fleet, not one replica.
ENGINE_ARGS = ["--sim-device-pages", "128", "--sim-host-pages", "256"]
REQUEST_MS = 50  # each /generate holds its replica this long, so K conversations overlap


@dataclass
class Tally:
    prompt: int = 0
    cached: int = 0
    storage: int = 0
    errors: int = 0
    spread: float = 0.0
    """Steady state: the busiest replica's share of the requests x N (1.0: even)."""

    def add(self, meta: dict) -> None:
        d = meta.get("cached_tokens_details") or {}
        self.prompt += int(meta["prompt_tokens"])
        self.cached += int(d.get("device", 0)) + int(d.get("host", 0)) + int(d.get("storage", 0))
        self.storage += int(d.get("storage", 0))

    @property
    def ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    @property
    def disk(self) -> float:
        return self.storage / self.prompt if self.prompt else 0.0


@dataclass
class Conversation:
    system: str
    cid: int
    history: str = ""
    turn: int = 0
    user_chars: int = USER_CHARS

    def next_prompt(self) -> str:
        user = f"\nuser-{self.cid:04d} turn {self.turn}: " + _words(f"{self.cid}/{self.turn}", self.user_chars)
        self.history += user
        self.turn += 1
        return self.system + self.history + "\nassistant:"

    def answered(self, text: str) -> None:
        self.history += "\nassistant:" + text


@dataclass
class Workload:
    conversations: list[Conversation]
    rng: random.Random = field(default_factory=lambda: random.Random(7))


def _words(seed: str, chars: int) -> str:
    out, i = [], 0
    while sum(len(w) + 1 for w in out) < chars:
        out.append("w" + hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:5])
        i += 1
    return " ".join(out)[:chars]


def workload(n_conv: int, system_chars: int = SYSTEM_CHARS, user_chars: int = USER_CHARS) -> Workload:
    text = "Be concise, cite the order number, never invent facts. " * (system_chars // 50 + 1)
    systems = [(f"[system {s}] " + text)[:system_chars] for s in range(SYSTEM_PROMPTS)]
    return Workload([Conversation(systems[c % SYSTEM_PROMPTS], c, user_chars=user_chars) for c in range(n_conv)])


class Client:
    """Sends one round (a turn of every conversation, `in_flight` at a time, in a shuffled order) through the
    config's path: the router, a random ready replica (plain Service), or the conversation's own (oracle)."""

    def __init__(self, lab: RouterLab, mode: str, rng: random.Random, in_flight: int = 1) -> None:
        self.lab, self.mode, self.rng, self.in_flight = lab, mode, rng, in_flight
        self.down: set[int] = set()
        self.lock = threading.Lock()

    def send(self, conv: Conversation, text: str) -> tuple[dict, str]:
        if self.mode == "router":
            return _with_text(self.lab, text, None)
        n = len(self.lab.pods)
        if self.mode == "oracle":
            home = conv.cid % n
            return _with_text(self.lab, text, next((home + i) % n for i in range(n) if (home + i) % n not in self.down))
        with self.lock:
            ordinal = self.rng.choice([i for i in range(n) if i not in self.down])
        return _with_text(self.lab, text, ordinal)

    def _turn(self, conv: Conversation, tally: Tally) -> None:
        try:
            meta, text = self.send(conv, conv.next_prompt())
        except Exception:  # noqa: BLE001 - a failed request is counted, the conversation goes on
            with self.lock:
                tally.errors += 1
            conv.answered("")
            return
        with self.lock:
            tally.add(meta)
        conv.answered(text)

    def round(self, wl: Workload, tally: Tally) -> None:
        order = list(wl.conversations)
        wl.rng.shuffle(order)
        with ThreadPoolExecutor(self.in_flight) as pool:
            list(pool.map(lambda conv: self._turn(conv, tally), order))


def _with_text(lab: RouterLab, text: str, ordinal: int | None) -> tuple[dict, str]:
    import json
    import urllib.request

    body = {"text": text, "sampling_params": {"max_new_tokens": ANSWER_TOKENS, "temperature": 0}}
    if ordinal is None:
        url = f"http://{lab.router_ip}:8000/generate"
        body["model"] = "Qwen/sim-router"
    else:
        url = f"http://{lab.pods[ordinal].ip}:30000/generate"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    return out["meta_info"], out["text"]


def run_config(root: Path, replicas: int, label: str, router: dict | None, n_conv: int, turns: int,
               disk_cap: int | None = None, chars: tuple[int, int] = (SYSTEM_CHARS, USER_CHARS),
               in_flight: int = 1, request_ms: int = REQUEST_MS) -> dict[str, Tally]:
    if disk_cap:  # the runtime's own cap: HiCacheFile's LRU evictor reads it (the operator sets it from capPerRank)
        os.environ[MAX_SIZE_ENV] = str(disk_cap)
    else:
        os.environ.pop(MAX_SIZE_ENV, None)
    lab = RouterLab(root, replicas, [*ENGINE_ARGS, "--sim-request-seconds", str(request_ms / 1000)],
                    **(router or {}))
    tallies = {p: Tally() for p in PHASES}
    try:
        lab.start(router=router is not None)
        mode = "router" if router is not None else ("oracle" if label == ORACLE else "plain")
        client = Client(lab, mode, random.Random(11), in_flight)
        wl = workload(n_conv, *chars)
        client.round(wl, Tally())  # warm-up: first turns
        before = lab.received()
        for _ in range(max(turns - 4, 1)):
            client.round(wl, tallies["steady"])
        served = [b - a for a, b in zip(before, lab.received(), strict=True)]
        tallies["steady"].spread = max(served) * len(served) / max(sum(served), 1)
        for i in reversed(range(replicas)):
            if router is not None:
                lab.drain(i)
            client.down.add(i)
            lab.stop_pod(i)  # preStop: flush queued disk writes; the pod's device and host pools are gone
            client.round(wl, tallies["during rollout"])
            lab.start_pod(i)
            if router is not None:
                lab.undrain(i)
            client.down.discard(i)
        client.round(wl, tallies["after rollout"])
        if router is not None:
            lab.restart_router()
        client.round(wl, tallies["after router restart"])
    finally:
        lab.stop()
    return tallies


def configs(load_factors: list[float]) -> dict[str, dict | None]:
    extra = {f"router prefix_hash load factor {lf:g}": {"policy": "prefix_hash", "loadFactor": lf}
             for lf in load_factors}  # fmt: skip
    return {**CONFIGS, **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[4])
    ap.add_argument("--in-flight", type=int, nargs="+", default=[8, 32, 64], help="conversations in flight")
    ap.add_argument("--conversations", type=int, default=0, help="conversations (default: as many as in flight)")
    ap.add_argument("--load-factors", type=float, nargs="*", default=[2.0, 100.0],
                    help="prefix_hash load factors to compare with the default's")
    ap.add_argument("--request-ms", type=int, default=REQUEST_MS, help="time each engine request takes")
    ap.add_argument("--turns", type=int, default=7, help="turns per conversation before the rollout")
    ap.add_argument("--disk-cap-kib", type=int, default=0, help="per-replica disk cap (0: none)")
    ap.add_argument("--system-chars", type=int, default=SYSTEM_CHARS, help="length of each shared system prompt")
    ap.add_argument("--user-chars", type=int, default=USER_CHARS, help="length of each user turn")
    ap.add_argument("--only", nargs="*", default=None, help="configuration labels to run (substring match)")
    ap.add_argument("--smoke", action="store_true", help="tiny run (N=2, 4 in flight) for the test suite")
    args = ap.parse_args()
    if args.smoke:
        args.replicas, args.in_flight, args.turns, args.load_factors = [2], [4], 5, []
    if not unshare_available():
        print("routing benchmark needs root and `unshare -m` (the cluster-DNS stand-in)", file=sys.stderr)
        return 2
    results: dict[tuple[int, int, str], dict[str, Tally]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qhc-routing-") as tmp:
        for n in args.replicas:
            for k in args.in_flight:
                for j, (label, router) in enumerate(configs(args.load_factors).items()):
                    if args.only and label != ORACLE and not any(o in label for o in args.only):
                        continue
                    t = time.monotonic()
                    results[n, k, label] = run_config(
                        Path(tmp) / f"n{n}-k{k}-{j}", n, label, router, args.conversations or max(k, 2 * n),
                        args.turns, args.disk_cap_kib * 1024, (args.system_chars, args.user_chars), k,
                        args.request_ms)  # fmt: skip
                    print(f"  N={n} in flight {k} {label}: {time.monotonic() - t:.0f} s", file=sys.stderr)
    print_table(results, args)
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


def print_table(results: dict[tuple[int, int, str], dict[str, Tally]], args: argparse.Namespace) -> None:
    print(f"routing: {SYSTEM_PROMPTS} system prompts of {args.system_chars} characters, "
          f"{args.user_chars}-character user turns, {args.turns} turns before the rollout, engine requests "
          f"{args.request_ms} ms, disk cap {args.disk_cap_kib or 'none'} KiB; cached ratio (disk share) per phase")
    head = (f"{'N':>2} {'K':>3}  {'configuration':40}" + "".join(f"  {p:>22}" for p in PHASES)
            + "    all  /oracle  min/oracle  spread  errors")
    print(head)
    print("-" * len(head))
    for (n, k, label), t in results.items():
        oracle = results.get((n, k, ORACLE))
        cells = "".join(f"  {t[p].ratio:>13.3f} ({t[p].disk:.3f})" for p in PHASES)
        total = _overall(t)
        vs = total / _overall(oracle) if oracle and _overall(oracle) else float("nan")
        worst = min((t[p].ratio / oracle[p].ratio for p in PHASES if oracle[p].ratio), default=float("nan")) \
            if oracle else float("nan")
        errors = sum(x.errors for x in t.values())
        print(f"{n:>2} {k:>3}  {label:40}{cells}  {total:.3f}  {vs:6.2f}x  {worst:9.2f}x  {t['steady'].spread:5.2f}  "
              f"{errors:>6}")
    for n, k in sorted({(n, k) for n, k, _ in results}):
        if (n, k, ORACLE) in results and (n, k, CHOSEN) in results:
            ratio = _overall(results[n, k, CHOSEN]) / max(_overall(results[n, k, ORACLE]), 1e-9)
            print(f"N={n} in flight {k}: chosen / oracle = {ratio:.2f}x (goal at 32 in flight: >= 0.90x)")
        if (n, k, "plain Service") in results and (n, k, CHOSEN) in results:
            base = results[n, k, "plain Service"]["steady"].ratio
            print(f"N={n} in flight {k}: chosen / plain Service = "
                  f"{results[n, k, CHOSEN]['steady'].ratio / base if base else float('inf'):.2f}x (steady)")


def _overall(t: dict[str, Tally]) -> float:
    """Cached ratio over every phase of the run (each phase's prompt tokens weigh in)."""
    prompt = sum(x.prompt for x in t.values())
    return sum(x.cached for x in t.values()) / prompt if prompt else 0.0


if __name__ == "__main__":
    sys.exit(main())
