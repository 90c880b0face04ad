"""Routing benchmark: cached-prefix ratio of a multi-turn chat workload through (a) a plain Service, (b) the router's
cache-aware default, (c) the chosen configuration (prefix_hash on stable worker names), per phase.

    .venv/bin/python bench/routing.py [--replicas 2 4] [--conversations-per-replica 8] [--turns 6] [--smoke]

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
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from qwen_hicache.launch import MAX_SIZE_ENV  # noqa: E402

from harness.sim.nameshim import unshare_available  # noqa: E402
from harness.sim.routerlab import RouterLab  # noqa: E402

PHASES = ("steady", "during rollout", "after rollout", "after router restart")
CONFIGS = {
    "plain Service": None,
    "router cache_aware (smg default)": {"policy": "cache_aware", "balanceAbsThreshold": 64},
    "router prefix_hash (chosen)": {"policy": "prefix_hash"},
}
SYSTEM_PROMPTS = 4
SYSTEM_CHARS = 960  # below 4 x prefixTokens (1024 characters): the hashed head includes the conversation's opening
USER_CHARS = 160
ANSWER_TOKENS = 64
# Device and host pools per replica, in 64-token pages: the whole workload fits the fleet, not one replica.
ENGINE_ARGS = ["--sim-device-pages", "128", "--sim-host-pages", "256"]


@dataclass
class Tally:
    prompt: int = 0
    cached: int = 0
    storage: int = 0
    errors: int = 0

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
    """Sends one round (a turn of every conversation, in a shuffled order) through the config's path."""

    def __init__(self, lab: RouterLab, routed: bool, rng: random.Random) -> None:
        self.lab, self.routed, self.rng = lab, routed, rng
        self.down: set[int] = set()

    def send(self, text: str) -> dict:
        if self.routed:
            return _with_text(self.lab, text, None)
        ready = [i for i in range(len(self.lab.pods)) if i not in self.down]
        return _with_text(self.lab, text, self.rng.choice(ready))

    def round(self, wl: Workload, tally: Tally) -> None:
        order = list(wl.conversations)
        wl.rng.shuffle(order)
        for conv in order:
            try:
                meta, text = self.send(conv.next_prompt())
            except Exception:  # noqa: BLE001 - a failed request is counted, the conversation goes on
                tally.errors += 1
                conv.answered("")
                continue
            tally.add(meta)
            conv.answered(text)


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


def run_config(root: Path, replicas: int, router: dict | None, n_conv: int, turns: int,
               disk_cap: int | None = None, chars: tuple[int, int] = (SYSTEM_CHARS, USER_CHARS)) -> dict[str, Tally]:
    if disk_cap:  # the runtime's own cap: HiCacheFile's LRU evictor reads it (the operator sets it from capPerRank)
        os.environ[MAX_SIZE_ENV] = str(disk_cap)
    else:
        os.environ.pop(MAX_SIZE_ENV, None)
    lab = RouterLab(root, replicas, ENGINE_ARGS, **(router or {}))
    tallies = {p: Tally() for p in PHASES}
    try:
        lab.start(router=router is not None)
        client = Client(lab, router is not None, random.Random(11))
        wl = workload(n_conv, *chars)
        client.round(wl, Tally())  # warm-up: first turns
        for _ in range(max(turns - 4, 1)):
            client.round(wl, tallies["steady"])
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--conversations-per-replica", type=int, default=6)
    ap.add_argument("--turns", type=int, default=7, help="turns per conversation before the rollout")
    ap.add_argument("--disk-cap-kib", type=int, default=0, help="per-replica disk cap (0: none)")
    ap.add_argument("--system-chars", type=int, default=SYSTEM_CHARS, help="length of each shared system prompt")
    ap.add_argument("--user-chars", type=int, default=USER_CHARS, help="length of each user turn")
    ap.add_argument("--only", nargs="*", default=None, help="configuration labels to run (substring match)")
    ap.add_argument("--smoke", action="store_true", help="tiny run (N=2, few conversations) for the test suite")
    args = ap.parse_args()
    if args.smoke:
        args.replicas, args.conversations_per_replica, args.turns = [2], 2, 5
    if not unshare_available():
        print("routing benchmark needs root and `unshare -m` (the cluster-DNS stand-in)", file=sys.stderr)
        return 2
    results: dict[tuple[int, str], dict[str, Tally]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qhc-routing-") as tmp:
        for n in args.replicas:
            for k, (label, router) in enumerate(CONFIGS.items()):
                if args.only and not any(o in label for o in args.only):
                    continue
                results[n, label] = run_config(Path(tmp) / f"n{n}-{k}", n, router, n * args.conversations_per_replica,
                                               args.turns, args.disk_cap_kib * 1024,
                                               (args.system_chars, args.user_chars))
    print_table(results, args)
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


def print_table(results: dict[tuple[int, str], dict[str, Tally]], args: argparse.Namespace) -> None:
    print(f"routing: {SYSTEM_PROMPTS} system prompts of {args.system_chars} characters x "
          f"{args.conversations_per_replica} conversations per replica, {args.user_chars}-character user turns, "
          f"{args.turns} turns before the rollout, disk cap {args.disk_cap_kib or 'none'} KiB; "
          "cached ratio (disk share)")
    head = f"{'N':>2}  {'configuration':34}" + "".join(f"  {p:>22}" for p in PHASES) + "  last/steady  errors"
    print(head)
    print("-" * len(head))
    for (n, label), t in results.items():
        cells = "".join(f"  {t[p].ratio:>13.3f} ({t[p].disk:.3f})" for p in PHASES)
        steady, last = t["steady"].ratio, t["after router restart"].ratio
        errors = sum(x.errors for x in t.values())
        print(f"{n:>2}  {label:34}{cells}  {last / steady if steady else 0:>10.2f}x  {errors:>6}")
    for n in sorted({n for n, _ in results}):
        if (n, "plain Service") not in results or (n, "router prefix_hash (chosen)") not in results:
            continue
        plain = results[n, "plain Service"]
        chosen = results[n, "router prefix_hash (chosen)"]
        for phase in ("steady", "after router restart"):
            base = plain[phase].ratio
            print(f"N={n} {phase}: chosen / plain Service = "
                  f"{chosen[phase].ratio / base if base else float('inf'):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
