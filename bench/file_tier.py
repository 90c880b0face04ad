"""File-tier benchmark: the backup thread's real write patterns, parent + the same syncs vs patched, and reads.

Each tree (the pinned ``sglang==0.5.23`` parent and the same wheel patched by ``runtime_patches``, both built
once per machine by harness.sim.sglang_tree) runs in its own interpreters against the same directory's disk;
bench/file_tier_worker.py drives the tree's own backup thread (``HiCacheController`` /
``HybridCacheController.backup_thread_func``) over the tree's own host pools and ``HiCacheFile``. Patterns,
as the runtime makes them (sglang 0.5.23 ``cache_controller.py`` ``_page_backup``: 128-page chunks;
``hybrid_cache_controller.py`` ``_page_backup_with_stable_layout``: one ``batch_set_v2`` per sidecar chain
group, then the KV chunks):

- ``kv chunks``: KV only, two operations of 256 pages (two 128-page chunks each), 1 MiB pages; a turn each;
- ``hybrid``: two operations of 192 pages with the QSA indexer sidecar on every page and a Mamba state on the
  last (KV chunks of 128 + 64 after one sidecar group); a turn each;
- ``small``: 96 hybrid operations of 4 pages (multi-turn chat: each turn backs up a few new pages), 12 a turn;
- ``4 ranks``: four processes (tp_rank 0-3 of a TP4 pod, a quarter page each: 256 KiB) backing up the same
  hybrid operations (two of 64 pages, eight of 4: a burst, one a turn; eight bursts) at the same time into one
  directory.

Baseline: the parent never syncs (its acknowledged pages are not durable), so it runs with one ``syncfs`` at
the end of every backup operation: the sync patch 0006's group commit makes ("the parent plus the same
syncs"). Write rate: KV payload over the summed time of the tree's turns, each from the first operation queued to
the last acknowledged. Read rate: KV payload over the summed time of the tree's 8 read turns (after one unmeasured
read per tree: WARMUP_READS), each reading every KV page of the pattern back, dropped from the page cache before, by
the controller's prefetch path (``_generic_page_get``, 128-page batches; the patched tree verifies each page).
Startup: the ``HiCacheFile`` constructor over ``--startup-files`` page files plus 1% stale temporaries, size cap on
(first run).

    python bench/file_tier.py [--repeat 3] [--startup-files 100000] [--dir /var/tmp] [--json] [--turns]
    python bench/file_tier.py --smoke     # tiny pages, one run: checks the bench runs

A run starts both trees' processes (one per rank) at once; they build their patterns and wait. Then the trees
take turns at each pattern, A B B A A B ..., seconds apart on the same disk, the waiting tree idle (see run()).
Per pattern: the parent's and the patched tree's rates, min/median/max over the runs, the paired ratio (patched /
parent of the same run; which tree is A alternates across patterns and runs), and the write's CPU seconds per GB
(user + system, all ranks); ``--turns`` prints each turn's MB/s too (``--json``: each turn's seconds and bytes).
Targets: write >= 0.90x and read >= 0.95x in every run. Exits 1 when one is missed (never in ``--smoke``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness.sim.sglang_tree import patched_sglang_tree, tree_info  # noqa: E402

WORKER = Path(__file__).resolve().parent / "file_tier_worker.py"
TARGETS = {"write": 0.90, "read": 0.95}  # patched / parent + the same syncs, every run
STARTUP_LIMIT_S = 2.0
# One rank of a TP1 pod: 64 tokens x K+V x 8 heads x 128 dim x bf16 x 4 layers = 1 MiB pages; Mamba state
# 8 layers x 8 heads x 64 x 64 fp32 (1 MiB a slot); QSA index 4 layers x 16 rows x 128 B per page.
GEOMETRY = {"layers": 4, "heads": 8, "dim": 128, "mamba_layers": 8, "mamba_heads": 8, "mamba_dim": 64,
            "index_layers": 4, "index_width": 128}  # fmt: skip
RANK_GEOMETRY = {**GEOMETRY, "heads": 2, "mamba_heads": 2}  # a TP4 shard of the same model
# Each pattern's operations (page counts) in turns; the trees take turns A B B A A B ... (see run).
PATTERNS = {
    "kv chunks": {"turns": [[256], [256]], "hybrid": False},
    "hybrid": {"turns": [[192], [192]], "hybrid": True},
    "small": {"turns": [[4] * 12] * 8, "hybrid": True},
}
# A burst: two operations of 64 pages and eight of 4; eight bursts, a turn each (4 x 40 MiB a burst: 0.2-0.6 s).
RANKS = ("4 ranks", 4, {"turns": [[64, 64] + [4] * 8] * 8, "hybrid": True})
SMOKE_GEOMETRY = {"layers": 1, "heads": 1, "dim": 16, "mamba_layers": 1, "mamba_heads": 1, "mamba_dim": 8,
                  "index_layers": 1, "index_width": 16}  # fmt: skip
SMOKE_PATTERNS = {"kv chunks": {"turns": [[130]], "hybrid": False}, "hybrid": {"turns": [[130]], "hybrid": True},
                  "small": {"turns": [[4], [4, 4]], "hybrid": True}}  # fmt: skip
SMOKE_RANKS = ("2 ranks", 2, {"turns": [[4], [4]], "hybrid": True})
# Each tree's reads: this many turns, each reading every KV page of the pattern (128-page batches), page cache dropped
# before. Until 2026-12-06 the pages were split over 4 turns, read once: the small pattern's turns were ~60 ms, and one
# turn that met a spent burst budget decided a tree's sum.
READ_TURNS, SMOKE_READ_TURNS = 8, 2
# Before the measured reads, each tree reads its pages once, unmeasured (kept as `warmup_read_s`). In four full runs
# (2026-12-06/07) every read that missed its target was one turn of the first pair after the writes, either tree's,
# at 0.25-0.66x of its other turns, a 5 s pause before it changing nothing: the disk just after a pattern's writes,
# not the tree. A restarted pod's reads never follow its own writes; the trees are compared where the disk has left
# that state.
WARMUP_READS = 1
REPLY_SECONDS = 900  # a worker's import and pool set-up, or one turn, never takes this long
# A pause before every turn. This disk serves bursts from a budget: reads ran at about 1 GB/s for some 750 MB, and the
# next turn at 170-410 MB/s, whichever tree it was (2026-12-06); about a second idle refills what a turn spends. With
# the pause, every turn starts from the same rested disk, instead of the last turns paying for the first.
SETTLE_S = 1.0


def trees() -> dict[str, Path]:
    parent, patched = patched_sglang_tree(patched=False), patched_sglang_tree(patched=True)
    if not tree_info(patched)["patched"]:
        raise SystemExit(f"the series does not apply: {tree_info(patched)['why_unpatched']}")
    return {"parent": parent, "patched": patched}


class Worker:
    """One rank's process of one tree: JSON commands on its stdin, one JSON reply each from its stdout."""

    def __init__(self, tree: Path, work: Path, spec: dict, what: str) -> None:
        self.what, self.lines = what, queue.Queue()
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the process's stderr until stop)
        self.proc = subprocess.Popen([sys.executable, str(WORKER), str(tree), str(work), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        try:
            out = self.lines.get(timeout=REPLY_SECONDS)
        except queue.Empty:
            out = None
        if out is None:
            self.err.seek(0)
            raise SystemExit(f"{self.what}: worker failed or hung\n{self.err.read()[-3000:]}")
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.err.close()


def ask(workers: list[Worker], **command) -> list[dict]:
    """One command to every rank at once (a concurrent pattern's ranks start together), then every reply."""
    for w in workers:
        w.send(**command)
    return [w.reply() for w in workers]


def launch(tree_name: str, tree: Path, work: Path, smoke: bool) -> list[Worker]:
    """A tree's ranks: rank 0 holds every single-process pattern and rank 0 of the concurrent one."""
    *single, (label, pattern, n, geometry) = jobs(smoke)
    reads = {"read_turns": read_turns(smoke)}
    ranks = [[{"name": label, "rank": r, "ranks": n, "geometry": geometry, **pattern, **reads}] for r in range(n)]
    ranks[0] = [{"name": name, "geometry": g, **p, **reads} for name, p, _, g in single] + ranks[0]
    return [Worker(tree, work, {"parent_sync": True, "patterns": patterns}, f"{tree_name} rank {r}")
            for r, patterns in enumerate(ranks)]  # fmt: skip


def jobs(smoke: bool) -> list[tuple[str, dict, int, dict]]:
    """(pattern, its spec, ranks, geometry) in the order a run measures them."""
    patterns, (label, n, pattern) = (SMOKE_PATTERNS, SMOKE_RANKS) if smoke else (PATTERNS, RANKS)
    geometry, rank_geometry = (SMOKE_GEOMETRY, SMOKE_GEOMETRY) if smoke else (GEOMETRY, RANK_GEOMETRY)
    return [(name, p, 1, geometry) for name, p in patterns.items()] + [(label, pattern, n, rank_geometry)]


def read_turns(smoke: bool) -> int:
    return SMOKE_READ_TURNS if smoke else READ_TURNS


def schedule(order: list[str], turns: int) -> list[tuple[int, str]]:
    """(turn, tree) in the order they run: A B, B A, A B, ... Each tree's turns sit right beside the other's, so a
    drift of the disk (it changes speed within seconds here) reaches both alike; the pairs' order cancels a linear
    one."""
    return [(t, name) for t in range(turns) for name in (order if t % 2 == 0 else order[::-1])]


def measure_pattern(workers: dict[str, list[Worker]], pattern: str, turns: int, reads: int, settle: float) -> dict:
    """Both trees' writes turn by turn, every page durable and dropped from the page cache, then one unmeasured read
    per tree (WARMUP_READS), then the reads turn by turn, each reading all of the pattern's pages after the reading
    tree's files are synced and dropped again: per tree, the KV payload over the turns' summed time (a turn: the first
    rank's first queued operation to the last rank's last ack; the slowest rank's reads), each turn's seconds and
    payload, and the CPU seconds its ranks spent per GB written. Every turn starts after `settle` seconds idle (after
    the drop, for a read turn)."""
    seconds = {name: {"write": [], "read": [], "cpu": 0.0, "bytes": [], "read_bytes": []} for name in workers}
    for t, name in schedule(list(workers), turns):
        time.sleep(settle)
        replies = ask(workers[name], do="write", pattern=pattern, args=[t])
        if any(r["written_pages"] != r["pages"] for r in replies):
            raise SystemExit(f"{name} {pattern} turn {t}: not every page was written: {replies}")
        seconds[name]["write"].append(max(r["end"] for r in replies) - min(r["start"] for r in replies))
        seconds[name]["cpu"] += sum(r["cpu_s"] for r in replies)
        seconds[name]["bytes"].append(sum(r["kv_bytes"] for r in replies))
    for ranks in workers.values():
        ask(ranks[:1], do="drop", pattern=pattern)  # the ranks share one directory: one sync and drop for all
    warmup = {name: [read_turn(workers[name], name, pattern, 0, settle)[0] for _ in range(WARMUP_READS)]
              for name in workers}  # fmt: skip
    for t, name in schedule(list(workers), reads):
        took, payload = read_turn(workers[name], name, pattern, t, settle)
        seconds[name]["read"].append(took)
        seconds[name]["read_bytes"].append(payload)
    return {name: {"write_Bps": sum(s["bytes"]) / sum(s["write"]), "read_Bps": sum(s["read_bytes"]) / sum(s["read"]),
                   "write_cpu_s_per_GB": s["cpu"] / sum(s["bytes"]) * 1e9,
                   "turns": {"write_s": s["write"], "write_bytes": s["bytes"], "read_s": s["read"],
                             "read_bytes": s["read_bytes"], "warmup_read_s": warmup[name]}}
            for name, s in seconds.items()}  # fmt: skip


def read_turn(ranks: list[Worker], name: str, pattern: str, turn: int, settle: float) -> tuple[float, int]:
    """One tree's read turn: its files synced and dropped from the page cache (the last turn read them), `settle` s
    idle, every page read back and checked; the slowest rank's seconds and the KV payload."""
    ask(ranks[:1], do="drop", pattern=pattern)
    time.sleep(settle)
    replies = ask(ranks, do="read", pattern=pattern, args=[turn])
    if not all(r["read_pages"] == r["pages"] and r["same"] for r in replies):
        raise SystemExit(f"{name} {pattern} turn {turn}: pages did not read back: {replies}")
    return max(r["read_s"] for r in replies), sum(r["kv_bytes"] for r in replies)


def measure_run(fleet: dict[str, list[Worker]], run_index: int, startup_files: int, smoke: bool) -> dict:
    """One run: every pattern on both trees; which tree is A alternates across patterns and runs."""
    names = list(fleet)
    for ranks in fleet.values():
        for w in ranks:
            w.reply()  # ready: its patterns built
    out: dict[str, dict] = {name: {} for name in names}
    for name in names if startup_files else []:
        out[name]["startup"] = ask(fleet[name][:1], do="startup", files=startup_files)[0]
    if startup_files and not smoke:  # the startup's 2 x 101,000 new files written back before the first pattern
        os.sync()
        time.sleep(SETTLE_S)
    for k, (pattern, spec, n, _) in enumerate(jobs(smoke)):
        order = names if (run_index + k) % 2 == 0 else names[::-1]
        settle = 0.0 if smoke else SETTLE_S
        figures = measure_pattern({name: fleet[name][:n] for name in order}, pattern, len(spec["turns"]),
                                  read_turns(smoke), settle)  # fmt: skip
        for name in names:
            out[name][pattern] = figures[name]
    for ranks in fleet.values():
        ask(ranks, do="end")
    return out


def run(directory: str | None, repeat: int, startup_files: int, smoke: bool) -> dict[str, list[dict]]:
    """``repeat`` runs, each with fresh processes of both trees (one per rank) alive at once, idle but for their
    turns: the trees take turns at each pattern, A B B A A B ..., on the same disk seconds apart. Before, each tree
    ran a pattern in processes of its own, A B B A over whole patterns; this disk's speed changed more between
    those halves (a virtual disk with ``discard``, whose rate fell from 1,350 to 750 MB/s within a minute of
    writing, and often doubled after a pause) than the trees differ."""
    sources = trees()
    runs: dict[str, list[dict]] = {name: [] for name in sources}
    for i in range(repeat):
        with tempfile.TemporaryDirectory(dir=directory, prefix="qhc-file-tier-") as tmp:
            fleet = {name: launch(name, tree, Path(tmp) / name, smoke) for name, tree in sources.items()}
            try:
                figures = measure_run(fleet, i, startup_files if i == 0 else 0, smoke)
            finally:
                for ranks in fleet.values():
                    for w in ranks:
                        w.stop()
        os.sync()  # the deletes' discards land here, not on the next run's writes
        for name in sources:
            runs[name].append(figures[name])
    return runs


def _spread(values: list[float], fmt: str) -> str:
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def report(runs: dict[str, list[dict]]) -> tuple[list[str], list[str]]:
    """Printable lines and the missed targets."""
    par, pat = runs["parent"], runs["patched"]
    names = [k for k in par[0] if k != "startup"]
    lines = [f"{len(par)} run(s); MB/s of KV payload, min/median/max; ratio = patched / (parent + the same "
             "syncs), paired by run; cpu: the ranks' CPU seconds per GB written (user + system)",
             f"{'pattern':12} {'op':5} {'parent + syncs':>20} {'patched':>20} {'ratio':>17} {'target':>9}"]  # fmt: skip
    missed = []
    for name in names:
        for op in ("write", "read"):
            key = f"{op}_Bps"
            a = [r[name][key] / 1e6 for r in par]
            b = [r[name][key] / 1e6 for r in pat]
            ratios = [y / x for x, y in zip(a, b, strict=True)]
            lines.append(f"{name:12} {op:5} {_spread(a, '.0f'):>20} {_spread(b, '.0f'):>20} "
                         f"{_spread(ratios, '.2f'):>17} {'>= ' + format(TARGETS[op], '.2f') + 'x':>9}")  # fmt: skip
            if min(ratios) < TARGETS[op]:
                missed.append(
                    f"{name} {op}: {sum(r < TARGETS[op] for r in ratios)} of {len(ratios)} runs below "
                    f"{TARGETS[op]:.2f}x (min {min(ratios):.2f}x)"
                )
        a, b = ([r[name]["write_cpu_s_per_GB"] for r in runs_] for runs_ in (par, pat))
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        lines.append(f"{name:12} {'cpu':5} {_spread(a, '.2f'):>20} {_spread(b, '.2f'):>20} "
                     f"{_spread(ratios, '.2f'):>17} {'s/GB':>9}")  # fmt: skip
    if "startup" in par[0]:
        a, b = par[0]["startup"], pat[0]["startup"]
        lines.append(f"{'startup s (cap on)':30} {a['startup_s']:9.3f} {b['startup_s']:9.3f}  (< {STARTUP_LIMIT_S} s)")
        lines.append(f"{'stale .tmp left after startup':30} {a['tmp_left']:9d} {b['tmp_left']:9d}")
        if b["startup_s"] >= STARTUP_LIMIT_S:
            missed.append(f"startup: {b['startup_s']:.2f} s >= {STARTUP_LIMIT_S} s")
        if b["tmp_left"]:
            missed.append(f"startup left {b['tmp_left']} stale temporaries")
    return lines, missed


def turn_lines(runs: dict[str, list[dict]]) -> list[str]:
    """Each turn's MB/s, per run, pattern and op: the parent's and the patched tree's turn t side by side (they ran
    next to each other), to tell a slow disk (both trees' turns slow) from a slower tree."""
    lines = ["per turn: MB/s parent + syncs | patched, turn by turn (turn t of each tree ran next to each other)"]
    for i, (par, pat) in enumerate(zip(runs["parent"], runs["patched"], strict=True)):
        for name in (k for k in par if k != "startup"):
            for op in ("write", "read"):
                a, b = (r[name]["turns"] for r in (par, pat))
                rates = [[n / t / 1e6 for n, t in zip(x[f"{op}_bytes"], x[f"{op}_s"], strict=True)] for x in (a, b)]
                lines.append(f"run {i + 1} {name:12} {op:5} " + "  ".join(
                    f"{x:5.0f}|{y:<5.0f}" for x, y in zip(*rates, strict=True)))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--startup-files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp)")
    ap.add_argument("--smoke", action="store_true", help="tiny pages, one run, workers in parallel")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    ap.add_argument("--turns", action="store_true", help="print each turn's MB/s too")
    args = ap.parse_args(argv)
    if args.smoke:
        args.startup_files, args.repeat = 200, 1
    runs = run(args.dir, args.repeat, args.startup_files, args.smoke)
    lines, missed = report(runs)
    print("\n".join(lines))
    if args.turns:
        print("\n".join(turn_lines(runs)))
    if args.json:
        print(json.dumps(runs, sort_keys=True))
    if args.smoke:
        return 0
    for m in missed:
        print(f"TARGET MISSED: {m}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
