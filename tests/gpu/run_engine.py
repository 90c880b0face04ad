"""The real engine on a GPU: the patched SGLang 0.5.23 server on the tiny qwen4_exp checkpoint, launched as the
operator renders it, a full restart that must come back warm from disk, judged by the operator's own code; and two
such servers behind the real `smg` router, rolled in the rollout's order.

    python3 tests/gpu/run_engine.py --site SITE --out DIR [--pieces DIR] [--parts engine,router] [--tp 2]

With --pieces, the run first installs the runtime there (tests/gpu/engine_wheels.py install, then
runtime_patches/verify.py --apply, as Dockerfile.hicache does). Nothing here writes a command line: the server's
argv, env, preStop hook and cache-guard init script are read from the StatefulSet `qwen-hicache render` prints for
tests/gpu/data/tiny-qhc.yaml (tests/gpu/engine_pod.py), the cache directory is the operator's fingerprint, and the
warm check is the rollout's own state machine (engine_pod.rolling_restart). The router part: engine_router.py.

Every step has its own time budget (an alarm) and its own try/except; the report (DIR/engine-tpN.json) and the
log are written after each step, so a step that fails or runs out of time costs only what needs it, and the whole
run ends before --deadline seconds. Sequence and report: tests/gpu/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_pod as ep  # noqa: E402
from engine_pod import HERE, REPO, SHIM, log  # noqa: E402


# ---- time budgets ----------------------------------------------------------------------------------------------
class OverBudget(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: float):
    """Raise OverBudget in this (the main) thread after `seconds`: blocking socket reads are interrupted too."""

    def fire(signum, frame):
        raise OverBudget(f"over its {seconds:.0f} s budget")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Run:
    """The report and the steps: each with a budget and its own try/except; the report saved after each."""

    def __init__(self, args, report: dict) -> None:
        self.args, self.report = args, report
        self.deadline = ep.T0 + args.deadline
        self.base = ("install",) if args.pieces else ()
        report.setdefault("steps", {})

    def save(self) -> None:
        out = self.args.out
        (out / f"engine-tp{self.args.tp}.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (out / "engine.log").write_text("\n".join(ep.LOG_LINES) + "\n")

    def step(self, name: str, budget: float, fn, needs: tuple[str, ...] = ()) -> bool:
        steps = self.report["steps"]
        missing = [n for n in needs if steps.get(n, {}).get("status") != "ok"]
        left = self.deadline - time.time() - 5
        if missing or left < 15:
            why = f"needs {', '.join(missing)}" if missing else f"{left:.0f} s left before the run's deadline"
            steps[name] = {"status": "skipped", "why": why}
            log(f"step {name}: skipped ({why})")
            self.save()
            return False
        b = min(budget, left)
        log(f"step {name}: budget {b:.0f} s")
        t = time.time()
        try:
            with alarm(b):
                fn()
            st = {"status": "ok"}
        except OverBudget as err:
            st = {"status": "timeout", "why": str(err)}
        except Exception as err:  # every failure is recorded; the next step still runs
            st = {"status": "error", "why": f"{type(err).__name__}: {err}"[:2000],
                  "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        st.update(seconds=round(time.time() - t, 1), budget_s=round(b))
        if st["status"] != "ok":
            ep.stop_all()
        steps[name] = st
        log(f"step {name}: {st['status']} in {st['seconds']} s" + (f" ({st['why'][:300]})" if "why" in st else ""))
        self.save()
        return st["status"] == "ok"


# ---- install, as Dockerfile.hicache does -----------------------------------------------------------------------
def install(args, report: dict) -> None:
    t = time.time()
    r = subprocess.run([sys.executable, str(HERE / "engine_wheels.py"), "install", "--pieces", str(args.pieces),
                        "--site", str(args.site)], capture_output=True, text=True)  # fmt: skip
    report["install"] = {"rc": r.returncode, "seconds": round(time.time() - t, 1),
                         "output": (r.stdout + r.stderr)[-1500:]}  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"install failed: {(r.stdout + r.stderr)[-800:]}")
    t = time.time()
    r = subprocess.run([sys.executable, str(REPO / "runtime_patches" / "verify.py"), "--tree", str(args.site),
                        "--apply"], capture_output=True, text=True)  # fmt: skip
    report["patches"] = {"rc": r.returncode, "seconds": round(time.time() - t, 1),
                         "output": (r.stdout + r.stderr)[-1500:]}  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"verify.py --apply failed: {(r.stdout + r.stderr)[-800:]}")
    probe = ("import torch, sgl_kernel, sglang, triton, transformers; "
             "print(torch.__version__, torch.cuda.is_available(), triton.__version__, transformers.__version__)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(args.site)})  # fmt: skip
    report["versions"] = (r.stdout + r.stderr).strip()[-500:]
    log(f"installed in {report['install']['seconds']} s, patched in {report['patches']['seconds']} s: "
        f"{report['versions']}")  # fmt: skip


def link_machine_headers(site: Path, machine: list[Path] | None = None) -> dict:
    """STAND-IN for header wheels of the lock that the run does not carry (nvidia-cublas: 423 MB for six headers, one
    of which, cublasLt.h, flashinfer's norm module includes): every entry of the machine's own nvidia/cu13/include
    (torch's CUDA wheels, the `nvidia` namespace package's directory other than the site's) that the site's lacks is
    symlinked into the site's, so cuda-home.sh finds them. They are the machine's versions, not the lock's."""
    inc = site / "nvidia" / "cu13" / "include"
    if machine is None:
        spec = importlib.util.find_spec("nvidia")
        machine = [Path(d) for d in (spec.submodule_search_locations or [])] if spec else []
    sources = [m / "cu13" / "include" for m in machine]
    sources = [d for d in sources if d.is_dir() and inc.is_dir() and d.resolve() != inc.resolve()]
    linked = []
    for src in sources:
        for e in sorted(src.iterdir()):
            if not os.path.lexists(inc / e.name):
                (inc / e.name).symlink_to(e)
                linked.append(e.name)
    cublaslt = inc / "cublasLt.h"
    return {"linked_machine_headers": len(linked), "machine_include": [str(d) for d in sources],
            "cublasLt_from_machine": cublaslt.is_symlink() and not cublaslt.resolve().is_relative_to(site.resolve())}


def cuda_home(args, report: dict) -> None:
    """CUDA_HOME for every server and benchmark of the run: by default the image's (cuda-home.sh over the lock's
    toolchain wheels in the site, as Dockerfile.hicache's runtime stage makes /opt/cuda), with the machine's headers
    that the site lacks linked in first (link_machine_headers: a stand-in; cuda-home.sh refuses a site without
    cublasLt.h)."""
    home = args.cuda_home
    if not home or ep.ENGINE_CMD:  # as the machine has it; the CPU test's stand-in compiles nothing
        return
    linked = {}
    if home == "lock":
        linked = link_machine_headers(args.site)
        home = str(args.site.parent / "cuda-lock")
        r = subprocess.run(["sh", str(REPO / "images" / "runtime" / "cuda-home.sh"), str(args.site), home],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode:
            report["cuda_home"] = {"error": (r.stdout + r.stderr)[-500:], **linked}
            return
    os.environ["CUDA_HOME"] = home
    try:
        nvcc = subprocess.run([f"{home}/bin/nvcc", "--version"], capture_output=True, text=True)
        version = (nvcc.stdout + nvcc.stderr).strip().splitlines()[-1:]
    except OSError as err:
        version = [str(err)]
    report["cuda_home"] = {"path": home, "nvcc": version, **linked}


# ---- files on the cache volume ---------------------------------------------------------------------------------
POOLS = ("draft_indexer", "draft", "indexer", "mamba")  # file-name tags (hicache_storage.PoolName); else KV
COPY_BUDGET = 300  # the copy benchmark; the runtime's JIT kernels it measures compile first (35 s on the H200)


def page_files(d: Path) -> dict[str, int]:
    try:
        return {e.name: e.stat().st_size for e in os.scandir(d) if e.name.endswith(".bin")}
    except FileNotFoundError:
        return {}


def pool_of(name: str) -> str:
    return next((p for p in POOLS if f".{p}_" in name), "kv")


def wait_files_stable(d: Path, quiet: float = 1.5, timeout: float = 60) -> dict[str, int]:
    t, last, since = time.time(), None, time.time()
    while time.time() - t < timeout:
        now = page_files(d)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            break
        time.sleep(0.25)
    return last or {}


def per_rank(files: dict[str, int], tp: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in files:
        m = re.search(rf"_(\d+)_{tp}\.bin$", name)
        rank = m.group(1) if m else "?"
        pool = pool_of(name)
        out.setdefault(rank, {}).setdefault(pool, 0)
        out[rank][pool] += 1
    return out


def drop_page_cache(d: Path) -> None:
    """posix_fadvise(DONTNEED) on every page file: the next read comes from the disk, not RAM (no global knob)."""
    for e in os.scandir(d):
        try:
            fd = os.open(e.path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError:
            pass


def disk_read_gbps(d: Path) -> dict:
    """The volume's own read speed for these files: every page file read once, cold, one thread, 4 MiB reads."""
    drop_page_cache(d)
    total, t = 0, time.time()
    for e in sorted(os.scandir(d), key=lambda e: e.name):
        if e.name.endswith(".bin"):
            with open(e.path, "rb", buffering=0) as f:
                while chunk := f.read(4 << 20):
                    total += len(chunk)
    dt = time.time() - t
    drop_page_cache(d)
    return {"bytes": total, "seconds": round(dt, 4), "gbps": round(total / dt / 1e9, 3) if dt else None}


def tree_digest(d: Path) -> str:
    h = hashlib.sha256()
    for e in sorted(os.scandir(d), key=lambda e: e.name):
        st = e.stat()
        h.update(f"{e.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


# ---- requests and their comparison -----------------------------------------------------------------------------
def run_prompts(server: ep.Server, convs: list[list[str]], max_new: int, label: str, first: int = 0):
    out = []
    for ci, prompts in enumerate(convs, first):
        row = []
        for ti, text in enumerate(prompts):
            r = ep.generate(server.host, server.port, text, max_new)
            log(f"{label} conv {ci} turn {ti}: prompt {r['prompt_tokens']} tok, ttft {r['ttft_s'] * 1e3:.1f} ms, "
                f"cached {r['cached']}")  # fmt: skip
            row.append(r)
        out.append(row)
    return out


def compare(ref: list[list[dict]], got: list[list[dict]]) -> dict:
    """Greedy tokens, the first token's top-20 log-probs (inf where the sets differ) and its log-probs of the fixed
    probe ids (ep.PROBE_IDS: always the same tokens, so a finite difference even where the top-20 sets differ)."""
    same, total, worst, probe, split = 0, 0, 0.0, None, []
    for rr, gr in zip(ref, got, strict=False):
        for a, b in zip(rr, gr, strict=False):
            total += 1
            split.append(lp_split(a, b))
            same += a["ids"] == b["ids"]
            diff = _max_abs_diff(a.get("first_probe") or {}, b.get("first_probe") or {})
            if diff is not None:
                probe = max(probe or 0.0, diff)
            worst = max(worst, _max_abs_diff(a["first_top"], b["first_top"]) or 0.0)
            if set(a["first_top"]) != set(b["first_top"]):
                worst = max(worst, float("inf"))
    return {"prompts": total, "tokens_identical": same, "all_identical": same == total,
            "logits_max_abs_diff": worst, "logprob_ids_max_abs_diff": probe, "lp_split_at": split}  # fmt: skip


def lp_split(a: dict, b: dict) -> int | None:
    """The first output position whose token or log-prob differs (None: none where both have one). Earlier than
    the first differing token where the numbers drift before a near-tie flips."""
    def rows(r: dict) -> list:
        lps = r.get("lps") or []
        return list(zip(r["ids"], lps, strict=True)) if len(lps) == len(r["ids"]) else list(r["ids"])

    return next((i for i, (x, y) in enumerate(zip(rows(a), rows(b), strict=False)) if x != y), None)


def _max_abs_diff(a: dict[int, float], b: dict[int, float]) -> float | None:
    """Largest log-prob difference over the token ids both have; None when they share none."""
    common = set(a) & set(b)
    return max(abs(a[k] - b[k]) for k in common) if common else None


def storage_hits(res: list[list[dict]]) -> int:
    return sum(int(r["cached"].get("storage") or 0) for row in res for r in row)


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def first_ttfts(res: list[list[dict]], disk_only: bool = False) -> list[float]:
    """First turns' times to first token; disk_only: of those the disk served (a refused prefetch is a recompute)."""
    return [row[0]["ttft_s"] for row in res if not disk_only or row[0]["cached"].get("storage")]


def ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def strip(res: list[list[dict]]) -> list[list[dict]]:
    keep = ("ttft_s", "prompt_tokens", "cached", "ids", "lps", "timing")
    return [[{k: r.get(k) for k in keep} for r in row] for row in res]


def damage(d: Path, files_by_conv: list[set[str]], tp: int) -> dict:
    """Zero one page file, flip one bit in another, truncate a third (each of another conversation); at TP > 1
    also delete one rank's shard of one page of a fourth. KV page files are chosen."""
    done: dict[str, dict] = {}
    kinds = ["zeroed", "bitflip", "truncated"] + (["rank_shard_deleted"] if tp > 1 else [])
    for kind, names in zip(kinds, files_by_conv, strict=False):
        cand = sorted(n for n in names if pool_of(n) == "kv")
        if tp > 1:
            cand = [n for n in cand if re.search(rf"_1_{tp}\.bin$", n)] or cand
        if not cand:
            done[kind] = {"file": None, "conversation": None}
            continue
        name = cand[len(cand) // 2]
        path = d / name
        size = path.stat().st_size
        if kind == "zeroed":
            path.write_bytes(b"\0" * size)
        elif kind == "bitflip":
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x10
            path.write_bytes(bytes(data))
        elif kind == "truncated":
            with open(path, "r+b") as f:
                f.truncate(size // 2)
        else:
            path.unlink()
        done[kind] = {"file": name, "size": size, "conversation": files_by_conv.index(names)}
    drop_page_cache(d)
    return done


def damage_verdict(c: int | None, alive: bool, dmg: list, warm: list | None, ref: list | None, got: list) -> str:
    """Whether a damaged page was served, judged by the storage hit: the runtime serves a prefix of pages from disk,
    so a conversation whose damaged page is caught hits fewer tokens than the undamaged restart did, and one whose
    damaged page is served hits as many. Tokens are compared with that restart (the same pages reused), not with the
    cold run, whose recompute this random-weight model does not repeat exactly (bench/gpu_engine.md)."""
    if c is None:
        return "not run: no file"
    if not alive:
        return "server crashed"
    if ref is None:
        return f"no undamaged disk-warm reference ({got[c]} storage tokens)"
    if got[c] >= ref[c]:
        return f"SERVED AS A HIT ({got[c]} storage tokens, as undamaged: {ref[c]})"
    same = dmg[c][0]["ids"] == warm[c][0]["ids"]
    return f"miss ({got[c]} of {ref[c]} storage tokens; tokens {'as' if same else 'unlike'} the undamaged restart)"


def copy_bench(site: Path) -> dict:
    """Host->GPU copy through the io backend the operator renders (kernel: sgl_kernel.kvcacheio, page_first),
    against one 1 GiB contiguous pinned copy, measured in a separate interpreter."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    # CUDA_HOME as the server has it: the runtime resolves its JIT toolchain itself (CUDA_HOME, else nvcc on PATH)
    r = subprocess.run([sys.executable, str(HERE / "engine_copy_bench.py")], env=env, capture_output=True,
                       text=True, timeout=COPY_BUDGET - 20)  # fmt: skip
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ran": False, "why": (r.stdout + r.stderr)[-800:]}


def metrics_excerpt(text: str, limit: int = 200) -> list[str]:
    """The cache's own counters and timings from a /metrics page (storage, prefetch, host pool, TTFT)."""
    pattern = r"sglang:\S*(cached_tokens|prefetch|hicache|load_back|storage|backup|prefill_effective|time_to_first)"
    return [ln for ln in text.splitlines() if re.match(pattern, ln)][:limit]


def restore_figures(warm: list[list[dict]], p: dict) -> dict:
    """Restore throughput: bytes of the storage-hit pages over the disk-warm requests' time to first token
    (an upper bound on the restore time, so a lower bound on its throughput)."""
    s = p["sizing"]
    per_token = s.get("kvBytesPerToken", 0) + s.get("indexBytesPerPage", 0) / max(1, s.get("pageSize", 64))
    hits = [(int(row[0]["cached"].get("storage") or 0), row[0]["ttft_s"]) for row in warm]
    tokens = sum(h for h, _ in hits)
    secs = sum(t for h, t in hits if h)
    mamba = sum(1 for h, _ in hits if h) * s.get("mambaBytesPerSlot", 0)
    total = tokens * per_token * s.get("tensorParallelSize", 1) + mamba * s.get("tensorParallelSize", 1)
    return {"restore": {"bytes": int(total), "seconds": round(secs, 4), "storage_tokens": tokens,
                        "how": "storage-hit tokens x operator bytes/token (KV + QSA index) + one Mamba slot per "
                               "request, all ranks, over the disk-warm requests' TTFT"},
            "restore_gbps": round(total / secs / 1e9, 3) if secs else None}  # fmt: skip


# ---- the engine sequence (one pod) -----------------------------------------------------------------------------
def step_model(args, st, report: dict) -> None:
    """The tiny checkpoint (built here unless --model-dir names one); the runtime's load_weights check beside."""
    model_dir = args.model_dir or args.work / "model" / "tiny-qwen4-exp"
    env = {**os.environ, "PYTHONPATH": str(args.site)}
    if args.model_dir is None and not (model_dir / "model.safetensors").exists():
        t = time.time()
        r = subprocess.run([sys.executable, str(HERE / "tiny_model.py"), "--sglang-site", str(args.site),
                            str(model_dir)], capture_output=True, text=True, env=env)  # fmt: skip
        log(f"tiny model built rc={r.returncode} in {time.time() - t:.1f}s: {(r.stdout + r.stderr).strip()[-400:]}")
        if r.returncode:
            raise RuntimeError(f"tiny model build failed: {(r.stdout + r.stderr)[-800:]}")
    st.model_dir = model_dir
    if (model_dir / "manifest.json").exists():
        report["model_manifest"] = json.loads((model_dir / "manifest.json").read_text())
    if args.check_weights:  # every target and draft parameter written by the runtime's own load_weights
        st.check_log = args.work / "logs" / "weights-check.log"
        st.check = subprocess.Popen([sys.executable, str(HERE / "tiny_model.py"), "--sglang-site", str(args.site),
                                     "--check-only", "cuda", str(model_dir)], env=env,
                                    stdout=open(st.check_log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115


def collect_check(st, report: dict) -> None:
    proc = getattr(st, "check", None)
    if proc is None:
        return
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
    text = st.check_log.read_text(errors="replace")
    found = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and '"missing"' in ln]
    report["weights_check"] = {"rc": proc.returncode, **(found[-1] if found else {"output": text[-1500:]})}


def step_cold(args, st, report: dict) -> None:
    tp = args.tp
    st.p = ep.plan(args.site, ep.spec_file(args.work, tp), st.model_dir, args.work / "hicache", 30000, args.host)
    p = st.p
    report["launch"] = {k: p[k] for k in ("argv", "fingerprint", "cache_dir", "grace", "rendered_model_path")}
    report["launch"]["env"] = {k: v for k, v in p["env"].items() if k != "QWEN_HICACHE_ADMIN_API_KEY"}
    log("launch: " + " ".join(p["argv"]))
    st.cdir = Path(p["cache_dir"])
    n_conv = 2 if args.smoke else 4 + (1 if tp > 1 else 0)
    st.convs = ep.conversations(n_conv, 2, args.prompt_chars)
    report["stand_ins"] = [f"flash_attn: {SHIM / 'flash_attn'} (QSA paged decode/verify rows through "
                           "sglang-kernel's FA3, else the runtime's own sparse_gqa_packed_decode_triton)"]
    if "--disable-cuda-graph" in p["argv"]:
        report["stand_ins"].append("CUDA graphs off (--disable-cuda-graph through runtime.extraArgs)")
    if report.get("versions"):
        report["stand_ins"].append(f"torch, triton, transformers on the machine: {report['versions']} "
                                   "(the lock pins triton 3.8.0)")
    if ep.ENGINE_CMD:
        report["stand_ins"].append("engine: " + " ".join(ep.ENGINE_CMD))
    h = report.get("cuda_home", {})
    if h.get("linked_machine_headers") or h.get("cublasLt_from_machine"):
        report["stand_ins"].append(f"CUDA_HOME: the machine's {h['machine_include']} linked into the site's "
                                   f"nvidia/cu13/include where it lacked them ({h['linked_machine_headers']} this run"
                                   + ("; cublasLt.h from there: nvidia-cublas not carried)"
                                      if h["cublasLt_from_machine"] else ")"))  # fmt: skip
    if ep.EXTRA_ARGS:
        report["stand_ins"].append("runtime.extraArgs += " + " ".join(ep.EXTRA_ARGS))
    report["stand_ins"] += args.note
    st.s1 = ep.Server(p, args.site, st.logs, "cold", tp)
    report["start_cold_s"] = st.s1.start()
    st.cold, st.files_by_conv, seen = [], [], set()
    for i, prompts in enumerate(st.convs):
        st.cold += run_prompts(st.s1, [prompts], args.max_new, "cold", i)
        now = set(wait_files_stable(st.cdir))
        st.files_by_conv.append(now - seen)
        seen |= now
    report["ttft_cold_s"] = median([row[0]["ttft_s"] for row in st.cold])
    report["ttft_device_s"] = median([row[1]["ttft_s"] for row in st.cold])
    m1 = ep.metrics(st.s1.host, st.s1.port)
    report["host_pool"] = {
        "kv_tokens_per_rank": ep.metric_by_rank(m1, "sglang:hicache_host_total_tokens"),
        "mamba_states_per_rank": ep.metric_by_rank(m1, "sglang:hicache_host_mamba_total_states"),
        "operator_kv_tokens_per_rank": p["sizing"].get("hostKVTokensPerRank"),
        "operator_mamba_slots_per_rank": p["sizing"].get("hostMambaSlotsPerRank"),
    }  # fmt: skip
    # Host-RAM hits: churn the device's Mamba slots with short distinct prompts, then ask the first turns again.
    filler = [[f"<|im_start|>user\nfiller {i}: " + ep.documents(1, 3000, 500 + i)[0][:2500] + "<|im_end|>\n"]
              for i in range(0 if args.smoke else args.fillers)]  # fmt: skip
    if filler:
        run_prompts(st.s1, filler, 1, "filler")
    st.host = run_prompts(st.s1, [[c[0]] for c in st.convs], args.max_new, "host-warm")
    report["host_rerun_cached"] = [r[0]["cached"] for r in st.host]
    report["ttft_host_s"] = median([r[0]["ttft_s"] for r in st.host if (r[0]["cached"].get("host") or 0) > 0])
    report["per_request"] = {"cold": strip(st.cold), "host": strip(st.host)}
    st.files_before_stop = wait_files_stable(st.cdir)


def step_restart(args, st, report: dict) -> None:
    """The operator's rollout over the one pod; then the same prompts, judged against the cold run."""
    tp, p = args.tp, st.p

    def on_down(slot) -> None:
        files = page_files(st.cdir)
        report["files_after_flush"] = per_rank(files, tp)
        report["files_after_flush_total"] = len(files)
        report["disk_read"] = disk_read_gbps(st.cdir)

    slot = ep.Slot(f"{p['name']}-0", 0, st.s1, lambda: ep.Server(p, args.site, st.logs, "warm", tp))
    ro = ep.rolling_restart(args.site, Path(p["spec_path"]), [slot], on_down=on_down)
    report["rollout"] = ro
    report["files_written_before_stop"] = len(st.files_before_stop)
    s2 = st.s2 = slot.server
    warm = run_prompts(s2, st.convs, args.max_new, "disk-warm")
    st.warm = warm
    m2 = ep.metrics(s2.host, s2.port)
    report["restarts"] = [{"warm": ro["warm"].get(slot.name, False), "storage_hit_tokens": storage_hits(warm),
                           **compare(st.cold, warm),
                           "storage_counter": ep.metric_by_rank(m2, "sglang:cached_tokens_total")}]  # fmt: skip
    report["ttft_disk_s"] = median([row[0]["ttft_s"] for row in warm])
    report["per_request"]["disk_warm"] = strip(warm)
    report["metrics_warm_excerpt"] = metrics_excerpt(m2)
    log_text = s2.tail(100000).splitlines()
    report["host_pool"]["allocation_log"] = [ln[-200:] for ln in log_text
                                             if "Allocating" in ln and "host memory" in ln][:8]  # fmt: skip
    report["flash_attn_stand_in"] = [ln[-160:] for ln in log_text if "flash_attn stand-in" in ln][:2]
    report["memory"] = {"limit_bytes": p["memory_limit"], "shm_limit_bytes": p["shm_limit"],
                        "peak_cold": st.s1.peak, "peak_warm": dict(s2.peak),
                        "held": max(st.s1.peak["rss_bytes"], s2.peak["rss_bytes"]) <= p["memory_limit"]
                        and max(st.s1.peak["shm_used_bytes"], s2.peak["shm_used_bytes"]) <= p["shm_limit"]}  # fmt: skip
    report.update(restore_figures(warm, p))
    report["stop_warm"] = s2.stop_as_pod()


def step_fingerprint_and_damage(args, st, report: dict) -> None:
    """Two pods at once on their own ports: a changed fingerprint input (KV dtype: a new, empty namespace; the old
    one's listing unchanged) and the old namespace with three damaged page files (misses, never wrong output)."""
    tp = args.tp
    report["damage_files"] = damage(st.cdir, st.files_by_conv, tp)  # every server of this namespace is stopped
    p4 = ep.plan(args.site, Path(st.p["spec_path"]), st.model_dir, args.work / "hicache", 30002, args.host)
    s4 = ep.Server(p4, args.site, st.logs, "damaged", tp)
    # `--skip fingerprint`: the damage alone (a new fingerprint's first start compiles every kernel)
    s3 = None if "fingerprint" in args.skip.split(",") else new_fingerprint_server(args, st)
    report["start_fingerprint_damaged_s"] = ep.start_together([s for s in (s3, s4) if s])
    if s3:
        fingerprint_change(args, st, report, s3)
    dmg = run_prompts(s4, st.convs, args.max_new, "damaged")
    cmp_dmg = compare(st.cold, dmg)
    per_conv = [int(r[0]["cached"].get("storage") or 0) for r in dmg]
    warm = getattr(st, "warm", None)
    ref_conv = [int(r[0]["cached"].get("storage") or 0) for r in warm] if warm else None
    verdict = {kind: damage_verdict(info.get("conversation"), s4.alive(), dmg, warm, ref_conv, per_conv)
               for kind, info in report["damage_files"].items()}  # fmt: skip
    damaged = {v.get("conversation") for v in report["damage_files"].values()}
    others = [i for i in range(len(st.convs)) if i not in damaged]
    report["damage"] = {kind: v.split(" (")[0] for kind, v in verdict.items()}  # the record's words
    report["damage_detail"] = {"verdicts": verdict, "storage_per_conversation": per_conv,
                               "undamaged_reference": ref_conv,
                               "others_still_hit": all(per_conv[i] > 0 for i in others), **cmp_dmg,
                               "discards_log": discards(s4.tail(4000))}  # fmt: skip
    report.setdefault("restarts", []).append({"warm": any(per_conv), "storage_hit_tokens": storage_hits(dmg),
                                              **cmp_dmg, "note": "after damaging pages"})  # fmt: skip
    report["stop_damaged"] = s4.stop_as_pod()


DISCARD_LINE = re.compile(r"treating it as a miss|prefetch discarded")
"""The runtime's own words for a page it will not serve (hicache_storage.py, unified_radix_cache.py)."""


def discards(log: str) -> list[str]:
    """The runtime's lines about pages it would not serve, the last 20."""
    return [ln for ln in log.splitlines() if DISCARD_LINE.search(ln)][-20:]


def new_fingerprint_server(args, st) -> ep.Server:
    """A pod whose spec changes one fingerprint input (KV dtype) on the same volume."""
    p3 = ep.plan(args.site, ep.spec_file(args.work, args.tp, kvCacheDtype="bfloat16"), st.model_dir,
                 args.work / "hicache", 30001, args.host)  # fmt: skip
    return ep.Server(p3, args.site, st.logs, "new-fingerprint", args.tp)


def fingerprint_change(args, st, report: dict, s3: ep.Server) -> None:
    """The changed fingerprint's pod, started beside the damaged one: a new, empty namespace; the old one's listing
    unchanged."""
    p3 = s3.p
    digest = tree_digest(st.cdir)  # after both init containers ran (the guard touches its namespace's marker)
    fresh = run_prompts(s3, st.convs, args.max_new, "new-fingerprint")
    report["fingerprint_change"] = {
        "old": st.p["fingerprint"], "new": p3["fingerprint"], "storage_hit_tokens": storage_hits(fresh),
        "new_dir_files": len(page_files(Path(p3["cache_dir"]))), "old_dir_unchanged": tree_digest(st.cdir) == digest,
        "dirs": sorted(e.name for e in os.scandir(args.work / "hicache") if e.is_dir()),
    }  # fmt: skip
    report["stop_new_fingerprint"] = s3.stop_as_pod()


def step_wide(args, st, report: dict) -> None:
    """TTFT where prefill costs real compute: the architecture at Flash-Next's own widths (tiny_model.WIDE, 8
    layers; `--wide-scale deep`: and its 48 layers), its geometry derived by the operator, cold first turns, a stop
    as a pod stops, the volume's read speed, a fresh process, the same first turns from disk (page cache dropped
    first), judged against the cold tokens."""
    sys.path[:0] = [str(REPO / "operator"), str(args.site)]  # the operator's geometry needs the site's pydantic
    import tiny_model
    from qwen_hicache.geometry import from_hf_config

    scale = args.wide_scale
    flat = ["--flat-router"] if args.flat_router else []
    model_dir = args.work / "model" / (f"{scale}-qwen4-exp" + ("-flat-router" if args.flat_router else ""))
    env = {**os.environ, "PYTHONPATH": str(args.site)}
    t = time.time()
    if not (model_dir / "model.safetensors").exists() and not ep.ENGINE_CMD:
        r = subprocess.run([sys.executable, str(HERE / "tiny_model.py"), "--sglang-site", str(args.site), "--scale",
                            scale, "--values-device", "cuda", *flat, str(model_dir)], capture_output=True, text=True,
                           env=env)  # fmt: skip
        if r.returncode:
            raise RuntimeError(f"{scale} model build failed: {(r.stdout + r.stderr)[-800:]}")
    elif ep.ENGINE_CMD:  # the CPU test's stand-in needs no weights
        subprocess.run([sys.executable, str(HERE / "tiny_model.py"), "--no-weights", "--scale", scale,
                        str(model_dir)], check=True, capture_output=True)  # fmt: skip
    weights = (model_dir / "model.safetensors").stat().st_size if (model_dir / "model.safetensors").exists() else 0
    wide = report["wide"] = {"scale": scale, "dims": tiny_model.SCALES[scale], "weight_bytes": weights,
                             "flat_router": args.flat_router, "build_s": round(time.time() - t, 1)}  # fmt: skip
    geometry = from_hf_config(tiny_model.config(scale)).model_dump(by_alias=True, exclude_none=True)
    geometry["gpuWeightBytes"] = max(weights, 1)
    revision = model_dir.name + "-seed0"
    hicache = {"hostMemoryPerRankGB": args.wide_host_gb} if args.wide_host_gb else None
    runtime = {"speculative": None} if args.no_speculative else {}  # a diagnostic: the draft's part in the tokens
    runtime |= {k: json_or_text(v) for k, v in (kv.split("=", 1) for kv in args.wide_runtime)}
    spec = ep.spec_file(args.work, args.tp, model={"geometry": geometry, "revision": revision}, hicache=hicache,
                        **runtime)  # fmt: skip
    # the cold process must start on an empty volume: a wide step earlier on the same warm machine wrote the same
    # documents under the same fingerprint, and its files would serve this "cold" process from disk
    shutil.rmtree(args.work / "hicache-wide", ignore_errors=True)
    p = ep.plan(args.site, spec, model_dir, args.work / "hicache-wide", 30003, args.host)
    cache = Path(p["cache_dir"])
    wide["fingerprint"] = p["fingerprint"]
    rendered_runtime = ep.yaml_doc(spec)["spec"]["runtime"]
    wide["extra_args"], wide["speculative"] = rendered_runtime.get("extraArgs", []), rendered_runtime.get("speculative")
    wide["runtime_overrides"] = {k: rendered_runtime.get(k) for k in runtime if k != "speculative"} or None
    wide["ordered_hc_mix"] = args.ordered_hc_mix  # a diagnostic, not the image's runtime
    wide["host_kv_tokens"], wide["device_kv_tokens"] = (p["sizing"]["hostKVTokensPerRank"],
                                                        p["sizing"]["deviceKVTokensPerRank"])  # fmt: skip
    shim, window = server_hooks(args)
    first = [[c[0]] for c in st.convs]
    # as many other documents of the same size: asked after the first turns, when each process has compiled and
    # autotuned its kernels for these shapes, they give the steady cold prefill and the steady restore
    fresh = [[c[0]] for c in ep.conversations(len(st.convs), 1, args.prompt_chars, first=len(st.convs) + 20)]
    # one unrelated prompt of the same size first in each process: its first prefill at these shapes JIT-compiles
    # and autotunes (29 s on 2026-12-05), which no later request pays; each process gets its own, so the warm one's
    # is not a disk hit
    spare = [[c[0]] for c in ep.conversations(3, 1, args.prompt_chars, first=len(st.convs) + 10)]
    s1 = ep.Server(p, args.site, st.logs, "wide-cold", args.tp, extra_path=shim)
    wide["start_cold_s"] = s1.start()
    wide["warmup_ttft_s"] = [warm_up(s1, spare[:1], args.max_new, "wide-warmup-cold", p)]
    with window("cold"):
        cold = run_prompts(s1, first, args.max_new, "wide-cold")
    with window("cold-steady"):
        steady = run_prompts(s1, fresh, args.max_new, "wide-cold-steady")
    # the first turns again in the process that computed them, three times: on the H100 (2026-12-05 17:38) the
    # first repeat found nothing cached (a full recompute: the engine's own repeatability), the second found device
    # hits of the disk hits' length (the saved state extended by the same compute as the restart's disk hits)
    with window("reuse"):
        reuse = [run_prompts(s1, first, args.max_new, f"wide-reuse-{k}") for k in (1, 2, 3)]
    # kept now: a step that runs out of time in the second process still reports the first one's figures
    wide.update(ttft_cold_s=median(first_ttfts(cold)), ttft_cold_steady_s=median(first_ttfts(steady)),
                per_request={"cold": strip(cold), "cold_steady": strip(steady), "reuse": [strip(r) for r in reuse]})
    wait_files_stable(cache)
    wide["stop"] = s1.stop_as_pod()
    wide["disk_read"] = disk_read_gbps(cache)  # drops the page cache before and after
    s2 = ep.Server(p, args.site, st.logs, "wide-warm", args.tp, extra_path=shim)
    wide["start_warm_s"] = s2.start()
    wide["warmup_ttft_s"].append(warm_up(s2, spare[1:2], args.max_new, "wide-warmup-warm", p))
    with window("disk-warm"):
        warm = run_prompts(s2, first, args.max_new, "wide-disk-warm")
    with window("disk-steady"):
        warm_steady = run_prompts(s2, fresh, args.max_new, "wide-disk-steady")
    wide["metrics"] = metrics_excerpt(ep.metrics(s2.host, s2.port))
    wide["sampled"] = ep.sample(s2.host, s2.port, "The cache came back from disk and", args.max_new)
    # disk TTFTs over the requests that did hit the disk (a refused prefetch is a recompute: counted apart)
    wide.update(ttft_disk_s=median(first_ttfts(warm, disk_only=True)),
                ttft_disk_steady_s=median(first_ttfts(warm_steady, disk_only=True)))
    wide["disk_misses"] = len(warm + warm_steady) - len(first_ttfts(warm + warm_steady, disk_only=True))
    wide.update(compare(cold, warm), storage_hit_tokens=storage_hits(warm),
                storage_hit_tokens_steady=storage_hits(warm_steady),
                **reuse_figures(cold, reuse, warm),
                per_request=wide["per_request"] | {"disk_warm": strip(warm), "disk_steady": strip(warm_steady)})
    wide.update(restore_figures(warm, p), disk_read_gbps=wide["disk_read"]["gbps"],
                restore_steady_gbps=restore_figures(warm_steady, p)["restore_gbps"])
    wide.update(disk_vs_cold=ratio(wide["ttft_disk_s"], wide["ttft_cold_s"]),
                disk_vs_cold_steady=ratio(wide["ttft_disk_steady_s"], wide["ttft_cold_steady_s"]),
                restore_vs_disk=ratio(wide["restore_gbps"], wide["disk_read_gbps"]))  # fmt: skip
    s2.stop_as_pod()
    if args.profile:
        import stack_sampler

        wide["profile"] = stack_sampler.summary(str(args.out / "profile"))
    if args.switch_interval or args.third_env:
        wide["third"] = third_run(args, st, p, spare[2:], first + fresh, wide)


def warm_up(server: ep.Server, prompts: list[list[str]], max_new: int, label: str, p: dict) -> float:
    """A process's first request (it compiles and autotunes for these shapes), then its write-back waited out: on
    2026-12-06 14:21 an 8k-token warm-up's pages (about 180 MB) were still being written through the first disk hit
    (the fresh process's backup thread busy in 55 of 334 samples), whose prefetch shared the disk and the GIL with
    them and waited 0.20-0.31 s against 0.13-0.20. Its TTFT."""
    ttft = run_prompts(server, prompts, max_new, label)[0][0]["ttft_s"]
    wait_files_stable(Path(p["cache_dir"]))
    return ttft


def server_hooks(args) -> tuple[tuple[str, ...], object]:
    """The servers' `sitecustomize`: with `--profile` it starts tests/gpu/stack_sampler.py in every server process,
    and `window(name)` samples while its block runs (stacks under OUT/profile); with `--ordered-hc-mix` it installs
    tests/gpu/ordered_hc_mix.py. Otherwise nothing."""
    flag = args.work / "profile-window"
    flag.unlink(missing_ok=True)

    @contextlib.contextmanager
    def window(name: str):
        if args.profile:
            flag.write_text(name)
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    hooks = (["import stack_sampler", "stack_sampler.start()"] if args.profile else []) + (
        ["import ordered_hc_mix", "ordered_hc_mix.install()"] if args.ordered_hc_mix else [])  # fmt: skip
    if not hooks:
        return (), window
    shim, out = args.work / "site-hooks", args.out / "profile"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text("\n".join([f"import sys\nsys.path.insert(0, {str(HERE)!r})", *hooks, ""]))
    if args.profile:
        out.mkdir(parents=True, exist_ok=True)
        os.environ.update(QHC_PROFILE_FLAG=str(flag), QHC_PROFILE_DIR=str(out))
    return (str(shim),), window


def reuse_figures(cold: list, reuse: list[list], warm: list) -> dict:
    """The disk-warm answers against the first repeat pass served from device hits in every prompt (`vs_reuse`),
    that pass against the next such pass (`reuse_repeat`), and the cold answers against the first pass that found
    nothing cached (`recompute_repeat`: the same full prefill twice in one process)."""
    hit = [r for r in reuse if all(cached_tokens(row[0]) for row in r)]
    miss = [r for r in reuse if not any(cached_tokens(row[0]) for row in r)]
    out: dict = {"vs_reuse": None, "reuse_repeat": None, "recompute_repeat": compare(cold, miss[0]) if miss else None}
    if hit:
        out["vs_reuse"] = {**compare(hit[0], warm), "same_cached_identical": reuse_identical(hit[0], warm)}
    if len(hit) > 1:
        out["reuse_repeat"] = compare(hit[0], hit[1])
    return out


def third_run(args, st, p: dict, spare: list, prompts: list, wide: dict) -> dict:
    """The same disk-warm requests in a third process, started as the second but for `--third-env KEY=VALUE` in its
    environment (SGLANG_HICACHE_PREFETCH_POLL_INTERVAL=0: patch 0010 undone, a baseline in the same run) and
    `--switch-interval S` (its interpreters switch threads every S seconds, Python's default 0.005: a
    sitecustomize)."""
    env = dict(kv.split("=", 1) for kv in args.third_env)
    extra: tuple[str, ...] = ()
    if args.switch_interval:
        shim = args.work / "switch-interval"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({args.switch_interval})\n")
        extra = (str(shim),)
    drop_page_cache(Path(p["cache_dir"]))
    s3 = ep.Server({**p, "env": {**p["env"], **env}}, args.site, st.logs, "wide-warm-third", args.tp, extra_path=extra)
    out = {"env": env, "switch_interval_s": args.switch_interval or None, "start_s": s3.start()}
    warm_up(s3, spare, args.max_new, "wide-warmup-third", p)
    res = run_prompts(s3, prompts, args.max_new, "wide-disk-third")
    s3.stop_as_pod()
    base = wide["per_request"]["disk_warm"] + wide["per_request"]["disk_steady"]
    out.update(storage_hit_tokens=storage_hits(res), ttft_disk_s=median(first_ttfts(res, disk_only=True)),
               ttft_disk_second_s=median(first_ttfts(base, disk_only=True)), **disk_hit_split(res))  # fmt: skip
    wide["per_request"]["disk_third"] = strip(res)
    return out


def step_copy(args, st, report: dict) -> None:
    report["copy"] = copy_bench(args.site)
    report["copy_gbps"] = report["copy"].get("kernel_gbps")
    report["copy_limit_gbps"] = report["copy"].get("limit_gbps")
    report["copy_jit"] = report["copy"].get("jit")  # the runtime's JIT kernels, where they build (CUDA_HOME or nvcc)


def engine_part(run: Run, args, st) -> None:
    r = run.report
    skip = set(args.skip.split(","))
    run.step("model", 120, lambda: step_model(args, st, r), needs=run.base)
    if "cold" in skip:  # the wide and copy steps only: the first turns' prompts without the tiny model's servers
        st.convs = ep.conversations(4 + (1 if args.tp > 1 else 0), 2, args.prompt_chars)
    else:
        run.step("cold", args.budget_cold, lambda: step_cold(args, st, r), needs=("model",))
        run.step("restart", args.budget_restart, lambda: step_restart(args, st, r), needs=("cold",))
    if not args.smoke and not skip & {"cold", "fingerprint_and_damage"}:
        run.step("fingerprint_and_damage", args.budget_damage, lambda: step_fingerprint_and_damage(args, st, r),
                 needs=("cold",))  # fmt: skip
    if not args.smoke and "copy" not in skip:
        run.step("copy", COPY_BUDGET, lambda: step_copy(args, st, r), needs=run.base)
    if args.wide:
        run.step("wide", args.budget_wide, lambda: step_wide(args, st, r), needs=run.base)
    collect_check(st, r)
    run.save()


# ---- the record ------------------------------------------------------------------------------------------------
def environment() -> dict:
    out = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        out["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError as err:
        out["gpu"] = f"nvidia-smi: {err}"
    return out


BENCH_JSON = REPO / "bench" / "gpu_engine.json"
RECORD_KEYS = ("date", "gpu", "model_type", "tp", "restarts", "ttft_cold_s", "ttft_host_s", "ttft_disk_s",
               "restore_gbps", "disk_read_gbps", "copy_gbps", "copy_limit_gbps", "copy_jit", "damage",
               "router", "wide", "stand_ins", "rollout_warm", "stop_exit_codes", "files_after_flush",
               "host_pool_per_rank", "fingerprint_change", "first_tokens_identical", "recompute_identical",
               "reuse_identical", "damage_storage_tokens", "server_startup")  # fmt: skip
WIDE_KEYS = ("scale", "flat_router", "weight_bytes", "host_kv_tokens", "device_kv_tokens", "warmup_ttft_s",
             "ttft_cold_s", "ttft_disk_s", "disk_vs_cold",
             "ttft_cold_steady_s", "ttft_disk_steady_s", "disk_vs_cold_steady", "vs_reuse", "reuse_repeat",
             "recompute_repeat", "disk_misses",
             "restore_steady_gbps", "third", "storage_hit_tokens_steady", "storage_hit_tokens",
             "tokens_identical", "prompts", "logits_max_abs_diff", "logprob_ids_max_abs_diff", "restore_gbps",
             "disk_read_gbps", "restore_vs_disk", "extra_args", "speculative", "ordered_hc_mix", "lp_split_at",
             "prefetch_wait_s", "ttft_after_prefetch_s", "sampled", "runtime_overrides", "start_cold_s",
             "start_warm_s")  # fmt: skip
ROUTER_KEYS = ("replicas", "policy", "conversations", "landed_before", "landed_after", "stayed", "warm",
               "storage_tokens_after", "deferred_deletes")  # fmt: skip


def cached_tokens(r: dict) -> int:
    """Tokens a request found cached in any tier (the report's `cached` also names the storage backend)."""
    return sum(v for k, v in (r.get("cached") or {}).items() if k != "storage_backend" and isinstance(v, int))


def reuse_identical(host: list[list[dict]], warm: list[list[dict]]) -> str | None:
    """First turns after the restart against the same first turns asked again in the process that wrote the pages,
    where that rerun reused as many cached tokens as the restart read from disk: the restored state against the
    state that was saved, each extended by the same compute (the cold run is a full prefill instead)."""
    pairs = [(a[0], b[0]) for a, b in zip(host, warm, strict=False)
             if a and b and cached_tokens(a[0]) == cached_tokens(b[0]) > 0]  # fmt: skip
    return f"{sum(a['ids'] == b['ids'] for a, b in pairs)}/{len(pairs)}" if pairs else None


def bench_record(report: dict) -> dict:
    """The run as bench/gpu_engine.json keeps it: the issue's fields, None where nothing was measured, and the
    router part's outcome under `router`."""
    out = {k: report.get(k) for k in RECORD_KEYS}
    out["disk_read_gbps"] = (report.get("disk_read") or {}).get("gbps")
    out["restarts"] = []
    for r in report.get("restarts") or []:
        row = {k: r.get(k) for k in ("warm", "storage_hit_tokens", "tokens_identical", "logits_max_abs_diff")}
        diff = row["logits_max_abs_diff"]
        if isinstance(diff, float) and not math.isfinite(diff):  # compare(): the top-20 token sets differ
            row["logits_max_abs_diff"] = None
            row["first_token_top20_sets_differ"] = True
        row["prompts"] = r.get("prompts")
        out["restarts"].append(row)
    # The operator's own verdict (the rollout's canary/verify), apart from the same prompts' storage hits above.
    out["rollout_warm"] = (report.get("rollout") or {}).get("warm")
    out["stop_exit_codes"] = {k: (report.get(k) or {}).get("exit_code") for k in (
        "stop_warm", "stop_new_fingerprint", "stop_damaged") if report.get(k)} or None  # fmt: skip
    pool = report.get("host_pool") or {}
    out["host_pool_per_rank"] = {k: pool.get(k) for k in ("kv_tokens_per_rank", "operator_kv_tokens_per_rank",
                                                           "mamba_states_per_rank", "operator_mamba_slots_per_rank")
                                 } if pool else None  # fmt: skip
    pr = report.get("per_request") or {}
    cold = pr.get("cold") or []

    def same(other: list, first_only: bool) -> str | None:
        pairs = [(a["ids"], b["ids"]) for ra, rb in zip(cold, other, strict=False)
                 for a, b in zip(ra, rb, strict=False)]  # fmt: skip
        if not pairs:
            return None
        return f"{sum((a[:1] == b[:1]) if first_only else (a == b) for a, b in pairs)}/{len(pairs)}"

    out["first_tokens_identical"] = same(pr.get("disk_warm") or [], True)
    # The first turns asked again in the cold process (after the fillers); with no cached prefix reported this is a
    # recompute of the same prompt: how deterministic the engine itself is, the bar the restart is held to.
    host = pr.get("host") or []
    recompute = [[r] for row in host for r in row if not cached_tokens(r)]
    out["recompute_identical"] = same(recompute, False) if recompute and len(recompute) == len(host) else None
    out["reuse_identical"] = reuse_identical(host, pr.get("disk_warm") or [])
    detail = report.get("damage_detail") or {}
    out["damage_storage_tokens"] = {"per_conversation": detail.get("storage_per_conversation"),
                                    "undamaged": detail.get("undamaged_reference")} if detail else None  # fmt: skip
    dmg = report.get("damage") or {}
    out["damage"] = {k: dmg.get(k, "not run") for k in ("zeroed", "bitflip", "truncated", *(
        ["rank_shard_deleted"] if report.get("tp", 1) > 1 else []))}  # fmt: skip
    rt = report.get("router") or {}
    rollout = rt.get("rollout") or {}
    out["router"] = {"replicas": len(rt.get("pods") or {}) or None, "policy": "prefix_hash" if rt else None,
                     "conversations": len(rt.get("landed_before") or []) or None,
                     "landed_before": rt.get("landed_before"), "landed_after": rt.get("landed_after"),
                     "stayed": rt.get("stayed"), "warm": rt.get("warm"),
                     "storage_tokens_after": rt.get("storage_tokens_after"),
                     "deferred_deletes": rollout.get("deferred_deletes")} if rt else None  # fmt: skip
    wide = report.get("wide")
    out["wide"] = {k: finite(wide.get(k)) for k in WIDE_KEYS} | hit_split(wide) if wide else None
    return out


def json_or_text(value: str):
    """A command-line field value: JSON where it parses (numbers, null, objects), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def hit_split(wide: dict) -> dict:
    """The restarted process's `disk_hit_split`, and its prefetch's read rate (`prefetch_rates`)."""
    phases = wide.get("per_request") or {}
    out = disk_hit_split([row for phase in ("disk_warm", "disk_steady") for row in phases.get(phase) or []])
    return out | prefetch_rates(wide)


def prefetch_rates(wide: dict) -> dict:
    """The prefetch's own read rate: the bytes `restore` counts for the first turns' disk hits over the sum of their
    prefetch waits (`meta_info`), against the volume's read in the same run; the same for a third process
    (`--third-env`), whose first four requests are the same documents, so the same bytes."""
    phases, total = wide.get("per_request") or {}, (wide.get("restore") or {}).get("bytes")
    disk = wide.get("disk_read_gbps")

    def rate(rows: list) -> dict:
        waits = [prefetch_wait(r[0]) for r in rows if r[0]["cached"].get("storage")]
        if not total or len(waits) != len(rows) or not rows or None in waits:
            return {"gbps": None, "vs_disk": None}
        gbps = round(total / sum(waits) / 1e9, 3)
        return {"gbps": gbps, "vs_disk": ratio(gbps, disk)}

    out = {"prefetch": rate(phases.get("disk_warm") or [])}
    if phases.get("disk_third"):
        out["prefetch_third"] = rate(phases["disk_third"][: len(phases.get("disk_warm") or [])])
    return out


def prefetch_wait(request: dict) -> float | None:
    """A request's storage prefetch wait, from its `meta_info` timings (None where the server gave none)."""
    return (request.get("timing") or {}).get("storage_prefetch_wait")


def disk_hit_split(rows: list) -> dict:
    """Medians over the disk hits among these rows' first turns: the prefetch wait (`meta_info`) and the rest of the
    TTFT, which is a device hit's cost when the restore is exact."""
    hits = [row[0] for row in rows if row[0]["cached"].get("storage")]
    waits = [prefetch_wait(r) or 0.0 for r in hits]
    return {"prefetch_wait_s": median(waits),
            "ttft_after_prefetch_s": median([r["ttft_s"] - w for r, w in zip(hits, waits, strict=True)])}


def finite(v):
    """JSON without Infinity: compare() gives inf where the top-20 sets differ; the record keeps None."""
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    return None if isinstance(v, float) and not math.isfinite(v) else v


def record(raw: list[Path], notes: list[str] | None = None) -> dict:
    """Merge the call(s) of one run (a router call may come separately) into one object of bench/gpu_engine.json:
    one per run (date and tp), so an earlier run's figures stay beside a later one's; `notes`: the run's conditions
    where its report does not hold them."""
    report: dict = {}
    startup: dict = {}
    for path in raw:
        part = json.loads(path.read_text())
        steps = {**report.get("steps", {}), **part.get("steps", {})}
        report.update({k: v for k, v in part.items() if v is not None})
        report["steps"] = steps
        startup.update(logs_startup(logs_archive(path.parent, part["tp"])))
    report["server_startup"] = {**(report.get("server_startup") or {}), **startup} or None
    rec = bench_record(report)
    if notes:
        rec["notes"] = notes
    runs = json.loads(BENCH_JSON.read_text()) if BENCH_JSON.exists() else []
    runs = [r for r in runs if (r.get("date"), r.get("tp")) != (rec["date"], rec["tp"])] + [rec]
    BENCH_JSON.write_text(json.dumps(sorted(runs, key=lambda r: (r["date"], r["tp"])), indent=1) + "\n")
    return rec


STARTUP_LINE = re.compile(r"Engine startup timings \(s\): (.*)$", re.M)
CAPTURE_LINE = re.compile(r"Capture (\w+ \w+) CUDA graph end\..*?elapsed=([\d.]+) s", re.M)
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", re.M)


def startup_phases(log: str) -> dict:
    """Where a server's start-up went, from its own log: the engine's summary line (present once the scheduler is
    up), each CUDA graph capture's seconds (logged as each ends, so a process killed before it was ready still says
    how far it got), and the seconds from its first to its last timestamped line. A start against the compile
    caches an earlier process left on the volume shows here as shorter captures (Triton and JIT kernels loaded, not
    built)."""
    out: dict = {"captures": {m[1].replace(" ", "_"): float(m[2]) for m in CAPTURE_LINE.finditer(log)}}
    summary = STARTUP_LINE.search(log)
    if summary:  # load_weight=2.41, ..., cuda_graph={prefill=101.14, ...}, tokenizer_e2e=182.91
        flat = re.sub(r"cuda_graph=\{[^}]*\},?\s*", "", summary[1])
        out["engine"] = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", flat)}
    stamps = [datetime.datetime.fromisoformat(t) for t in LOG_TIME.findall(log)]
    out["logged_s"] = (stamps[-1] - stamps[0]).total_seconds() if stamps else None
    return out


def logs_archive(folder: Path, tp: int) -> Path:
    """Where `pack_logs` puts a run's logs, beside its report."""
    return folder / f"logs-tp{tp}.tgz"


def processes(log: str) -> list[str]:
    """A pod's log cut into its server processes (`engine_pod.PROCESS_MARK` starts each; a log without a mark, as one
    written before the mark existed, is one process)."""
    parts = re.split(rf"^{re.escape(ep.PROCESS_MARK)}.*$\n?", log, flags=re.M)
    return parts[1:] if len(parts) > 1 and not parts[0].strip() else parts


def logs_startup(tgz: Path) -> dict:
    """`startup_phases` of every server process in a run's archive (`logs_archive`), by pod (`wide-cold`), and by pod
    and start where a pod restarted in the call (`server-0`, `server-0#2`)."""
    if not tgz.exists():
        return {}
    out = {}
    with tarfile.open(tgz) as tar:
        for m in tar.getmembers():
            if m.isfile() and Path(m.name).name.startswith("server-"):
                pod = Path(m.name).stem.removeprefix("server-")
                for i, part in enumerate(processes(tar.extractfile(m).read().decode(errors="replace"))):
                    out[pod if i == 0 else f"{pod}#{i + 1}"] = startup_phases(part)
    return out


def fresh_logs(work: Path) -> Path:
    """This call's log folder, emptied. The device machine keeps the work directory between calls and a pod's log is
    appended to, so a call's archive held every earlier call's processes too (2026-12-07 16:09-16:26: a summary line
    of the first call read as the fourth's)."""
    logs = work / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    return logs


def pack_logs(args) -> None:
    """Server, router and install logs in one archive under OUT (the device tool returns at most 8 files)."""
    with tarfile.open(logs_archive(args.out, args.tp), "w:gz") as tar:
        for d in (args.work / "logs", args.work / "router" / "logs"):
            if d.exists():
                tar.add(d, arcname=str(d.relative_to(args.work)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path)
    ap.add_argument("--record", type=Path, nargs="+", help="here, after a run: its engine-tpN.json file(s)")
    ap.add_argument("--pieces", type=Path, help="install the staged runtime from these pieces first")
    ap.add_argument("--parts", default="engine,router", help="engine, router or both")
    ap.add_argument("--work", type=Path, default=Path("/root/engine-work"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=560, help="seconds: every step ends before this")
    ap.add_argument("--budget-cold", type=float, default=200)
    ap.add_argument("--budget-restart", type=float, default=150)
    ap.add_argument("--budget-damage", type=float, default=150)
    ap.add_argument("--budget-wide", type=float, default=150)
    ap.add_argument("--wide", action="store_true", help="also TTFT cold vs disk-warm at Flash-Next's widths")
    ap.add_argument("--wide-scale", choices=("wide", "deep", "deep-full-index"), default="wide",
                    help="deep: and Flash-Next's 48 layers; deep-full-index: and every QSA block kept under 8,192 "
                         "tokens (tiny_model.DEEP_FULL_INDEX: token identity, --prompt-chars 27500)")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="wide step: a third process restores again with this sys.setswitchinterval (0: default)")
    ap.add_argument("--third-env", action="append", default=[], metavar="KEY=VALUE",
                    help="wide step: a third process restores again with this in its environment (repeatable)")
    ap.add_argument("--wide-host-gb", type=float, default=0.0,
                    help="wide step: hicache.hostMemoryPerRankGB (0: the spec's); above the device pool's tokens")
    ap.add_argument("--profile", action="store_true",
                    help="wide step: sample the servers' Python stacks per phase (tests/gpu/stack_sampler.py)")
    ap.add_argument("--flat-router", action="store_true", help="the wide model's MoE routers zero (tiny_model._values)")
    ap.add_argument("--cuda-home", default="lock",
                    help="the servers' CUDA_HOME: 'lock' (the image's: images/runtime/cuda-home.sh over the site), "
                         "a directory, or '' (as the machine has it)")  # fmt: skip
    ap.add_argument("--router-budget-start", type=float, default=150)
    ap.add_argument("--router-budget-rollout", type=float, default=240)
    ap.add_argument("--router-conversations", type=int, default=8)
    ap.add_argument("--router-prompt-chars", type=int, default=6000)
    ap.add_argument("--host", default="127.0.0.1", help="the one-pod sequence's address (ports 30000-30002)")
    ap.add_argument("--router-net", type=int, default=77, help="loopback 127.0.N.x for the router part's pods")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--skip", default="",
                    help="leave out: fingerprint_and_damage (or fingerprint: its first half), copy, cold")
    ap.add_argument("--smoke", action="store_true", help="two conversations, one restart, no damage/fingerprint")
    ap.add_argument("--prompt-chars", type=int, default=32000, help="document size (32000 chars: 8.5k-9.3k tokens)")
    ap.add_argument("--fillers", type=int, default=48)
    ap.add_argument("--model-dir", type=Path, help="use this model directory instead of building the tiny one")
    ap.add_argument("--check-weights", action="store_true", help="load_weights check beside the cold start")
    ap.add_argument("--keep-compile-caches", action="store_true",
                    help="keep the volumes' compiled kernels from an earlier call on this machine (model state goes)")
    ap.add_argument("--note", action="append", default=[],
                    help="a condition of this run, kept in stand_ins (with --record: the record's notes)")
    ap.add_argument("--extra-arg", action="append", default=[],
                    help="appended to the spec's runtime.extraArgs, e.g. --extra-arg=--enable-deterministic-inference")
    ap.add_argument("--ordered-hc-mix", action="store_true",
                    help="wide step: the decode's hyper-connection mix in a fixed order (tests/gpu/ordered_hc_mix.py)")
    ap.add_argument("--wide-runtime", action="append", default=[], metavar="FIELD=VALUE",
                    help="wide step: a spec runtime field (JSON, else text), e.g. kvCacheDtype=bfloat16")
    ap.add_argument("--no-speculative", action="store_true",
                    help="wide step: runtime.speculative null (no MTP draft): the draft's part in token repeats")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="CUDA graphs on: --disable-cuda-graph taken out of the spec's runtime.extraArgs")
    ap.add_argument("--engine-cmd", default="", help="CPU test only: run this, not the rendered command")
    ap.add_argument("--engine-path", default="", help="CPU test only: PYTHONPATH entries for --engine-cmd")
    args = ap.parse_args()
    if args.record:
        print(json.dumps(record(args.record, args.note), indent=1))
        return 0
    if not (args.site and args.out):
        ap.error("--site and --out are required for a run")
    ep.ENGINE_CMD[:] = args.engine_cmd.split()
    ep.EXTRA_ARGS[:] = args.extra_arg
    ep.DROP_ARGS[:] = ["--disable-cuda-graph"] if args.cuda_graph else []
    ep.ENGINE_PATH[:] = [p for p in args.engine_path.split(os.pathsep) if p]
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    if "engine" in parts:
        ep.empty_volume(args.work / "hicache", args.keep_compile_caches)
    if args.keep_compile_caches:
        args.note.append("compile caches kept on the volumes from an earlier call (the router's pods seeded from the "
                         "one-pod volume's): start-up times are a restarted pod's, not a new volume's")
    fresh_logs(args.work)
    report = {**environment(), "model_type": "qwen4_exp", "tp": args.tp, "smoke": args.smoke,
              "parts": sorted(parts), "deadline_s": args.deadline}  # fmt: skip
    run = Run(args, report)
    st = SimpleNamespace(logs=args.work / "logs")
    try:
        if args.pieces:
            run.step("install", 150, lambda: install(args, report))
        cuda_home(args, report)
        if "engine" in parts:
            engine_part(run, args, st)
        if "router" in parts:
            import engine_router

            if not hasattr(st, "model_dir"):
                run.step("model", 120, lambda: step_model(args, st, report), needs=run.base)
            engine_router.run(run, args, lambda: st.model_dir)
    finally:
        ep.stop_all()
        run.save()
        pack_logs(args)
    failed = [n for n, s in report["steps"].items() if s["status"] != "ok"]
    log(f"done: {len(report['steps']) - len(failed)} steps ok, not ok: {failed or 'none'}")
    run.save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
