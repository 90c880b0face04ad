"""The real engine on a GPU: the patched SGLang 0.5.23 server on the tiny qwen4_exp checkpoint, launched as the
operator renders it, a full restart that must come back warm from disk, judged by the operator's own code.

    python3 tests/gpu/run_engine.py --site SITE --out DIR [--tp 2] [--smoke]

SITE holds the runtime (tests/gpu/engine_wheels.py install, then runtime_patches/verify.py --apply, as
Dockerfile.hicache does). Nothing here writes a command line: the server's argv, env, preStop hook and cache-guard
init script are read from the StatefulSet `qwen-hicache render` prints for tests/gpu/data/tiny-qhc.yaml (only the
model path, the bind address, the port and the cache volume's path are replaced, as a pod's mounts would), the
cache directory is the operator's fingerprint, and the warm check is the rollout's own state machine
(rollout.plan_rollout -> canary / delete / baseline / verify, performed the way reconciler._run_rollout does,
with engine.generate / engine.cache_metrics against the real /metrics). Sequence and report: tests/gpu/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SPEC = HERE / "data" / "tiny-qhc.yaml"
CORPUS = HERE / "data" / "tiny_corpus.txt"
SHIM = HERE / "shim"  # flash_attn stand-in: the runtime's own Triton kernel (shim/flash_attn/__init__.py)
ENGINE_PATH: list[str] = []  # extra PYTHONPATH entries for --engine-cmd (the CPU test's engine stand-in)
ENGINE_CMD: list[str] = []  # replaces `python3 -m sglang.launch_server` (CPU test only)
LOG_LINES: list[str] = []
T0 = time.time()


def log(msg: str) -> None:
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG_LINES.append(line)


# ---- the operator's outputs -----------------------------------------------------------------------------------
def operator_cli(args: list[str], site: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(site)])}
    return subprocess.run([sys.executable, "-m", "qwen_hicache.cli", *args], check=True, capture_output=True,
                          text=True, env=env).stdout  # fmt: skip


def spec_file(work: Path, tp: int, **runtime) -> Path:
    import yaml

    doc = yaml.safe_load(SPEC.read_text())
    doc["spec"]["runtime"]["tensorParallelSize"] = tp
    doc["spec"]["runtime"].update(runtime)
    path = work / f"spec-tp{tp}-{hashlib.sha256(json.dumps(runtime, sort_keys=True).encode()).hexdigest()[:8]}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)  # fmt: skip


def plan(site: Path, path: Path, model_dir: Path, cache_root: Path, port: int) -> dict:
    """What a pod of this resource runs, from the rendered StatefulSet, with the pod's mounts mapped to paths."""
    import yaml

    docs = [d for d in yaml.safe_load_all(operator_cli(["render", str(path)], site)) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]
    server = next(c for c in pod["spec"]["containers"] if c["name"] == "sglang")
    guard = next(c for c in pod["spec"]["initContainers"] if c["name"] == "cache-guard")
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    model_mount, cache_mount = mounts["model"], mounts["hicache"]

    def env_of(container) -> dict[str, str]:
        out = {}
        for e in container.get("env", []):
            if "value" in e:
                out[e["name"]] = str(e["value"]).replace(cache_mount, str(cache_root))
        return out

    env = env_of(server)
    env["QWEN_HICACHE_ADMIN_API_KEY"] = hashlib.sha256(f"admin:{path.name}".encode()).hexdigest()[:32]
    argv = [expand(a, env) for a in server["command"] + server["args"]]
    rendered_cmd = list(server["command"])
    if ENGINE_CMD:
        argv = ENGINE_CMD + argv[len(server["command"]):]
    i = argv.index("--model-path")
    rendered_model = argv[i + 1]
    argv[i + 1] = str(model_dir)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    env["QWEN_HICACHE_PORT"] = str(port)
    sizing = json.loads(operator_cli(["size", str(path), "-o", "json"], site))
    return {
        "argv": argv, "env": env, "rendered_model_path": rendered_model, "model_mount": model_mount,
        "prestop": server["lifecycle"]["preStop"]["exec"]["command"], "guard": guard["command"],
        "guard_env": env_of(guard), "fingerprint": env["QWEN_HICACHE_FINGERPRINT"],
        "cache_dir": env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"],
        "grace": pod["spec"]["terminationGracePeriodSeconds"],
        "memory_limit": int(server["resources"]["limits"]["memory"]),
        "shm_limit": int(next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]),
        "sizing": sizing, "name": sts["metadata"]["name"], "spec_path": str(path), "rendered_command": rendered_cmd,
    }  # fmt: skip


# ---- a pod's life: init container, server, preStop + SIGTERM ---------------------------------------------------
class Server:
    def __init__(self, p: dict, site: Path, logdir: Path, tag: str, tp: int):
        self.p, self.site, self.tag, self.tp = p, site, tag, tp
        self.log_path = logdir / f"server-{tag}.log"
        self.port = int(p["env"]["QWEN_HICACHE_PORT"])
        self.proc: subprocess.Popen | None = None
        self.uid = hashlib.sha256(f"{tag}:{time.time()}".encode()).hexdigest()[:12]
        self.peak = {"rss_bytes": 0, "shm_used_bytes": 0}

    def _sample(self) -> None:
        """Peak memory of the server's process tree (what the pod's limit caps) and /dev/shm use, every 0.5 s."""
        import psutil

        while self.proc is not None and self.proc.poll() is None:
            try:
                root = psutil.Process(self.proc.pid)
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                shm = shutil.disk_usage("/dev/shm").used if os.path.isdir("/dev/shm") else 0
                self.peak["rss_bytes"] = max(self.peak["rss_bytes"], rss)
                self.peak["shm_used_bytes"] = max(self.peak["shm_used_bytes"], shm)
            except Exception:  # a process that just exited
                pass
            time.sleep(0.5)

    def run_guard(self) -> str:
        env = {**os.environ, **self.p["guard_env"]}
        r = subprocess.run(self.p["guard"], env=env, capture_output=True, text=True, timeout=120)
        out = (r.stdout + r.stderr).strip()
        log(f"cache-guard [{self.tag}] rc={r.returncode}: {out}")
        if r.returncode != 0:
            raise RuntimeError(f"cache-guard failed: {out}")
        return out

    def start(self, timeout: float = 540) -> float:
        self.run_guard()
        path = os.pathsep.join([str(self.site), str(SHIM), *ENGINE_PATH])
        env = {**os.environ, **self.p["env"], "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(self.tp)))
        t = time.time()
        self.fh = open(self.log_path, "ab")  # noqa: SIM115 - the server writes it until it exits
        self.proc = subprocess.Popen(self.p["argv"], env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        import threading

        threading.Thread(target=self._sample, daemon=True).start()
        while time.time() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.tag} exited rc={self.proc.returncode} during start-up:\n"
                                   + self.tail(60))  # fmt: skip
            if http_status(self.port, "/health") == 200 and http_status(self.port, "/ready") == 200:
                took = time.time() - t
                log(f"server {self.tag} ready in {took:.1f}s (pid {self.proc.pid})")
                return took
            time.sleep(1)
        raise RuntimeError(f"server {self.tag} not ready after {timeout}s:\n" + self.tail(60))

    def tail(self, n: int) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop_as_pod(self) -> dict:
        """preStop (the rendered hook, with the pod's env), then SIGTERM, bounded by the grace period."""
        t = time.time()
        env = {**os.environ, **self.p["env"]}
        r = subprocess.run(self.p["prestop"], env=env, capture_output=True, text=True, timeout=self.p["grace"])
        prestop_s = time.time() - t
        log(f"preStop [{self.tag}] rc={r.returncode} in {prestop_s:.1f}s: {(r.stdout + r.stderr).strip()[-300:]}")
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=max(1.0, self.p["grace"] - prestop_s))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
            log(f"server {self.tag}: SIGKILL after the grace period")
        self.kill_rest()
        total = time.time() - t
        log(f"server {self.tag} exited rc={rc}; stop took {total:.1f}s")
        return {"prestop_rc": r.returncode, "prestop_output": (r.stdout + r.stderr).strip()[-500:],
                "prestop_s": round(prestop_s, 2), "exit_code": rc, "stop_s": round(total, 2)}  # fmt: skip

    def kill_rest(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and http_status(self.port, "/health") == 200


def http_status(port: int, path: str) -> int | None:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path)
        return c.getresponse().status
    except OSError:
        return None


def generate(port: int, text: str, max_new: int, top: int = 20) -> dict:
    """One greedy streamed request: time to first token, output ids, the first token's top log-probs, cache report."""
    sampling = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    body = json.dumps({"text": text, "stream": True, "return_logprob": True, "top_logprobs_num": top,
                       "logprob_start_len": -1, "sampling_params": sampling})  # fmt: skip
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t = time.time()
    c.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"/generate {resp.status}: {resp.read()[:500]!r}")
    ttft, last = None, None
    if "event-stream" not in (resp.getheader("Content-Type") or ""):  # an engine that does not stream
        last, ttft = json.loads(resp.read()), time.time() - t
    toks: list = []
    tops: list = []
    for raw in resp if last is None else []:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        if ttft is None:
            ttft = time.time() - t
        last = json.loads(line[5:])
        m = last.get("meta_info") or {}
        toks = _accumulate(toks, m.get("output_token_logprobs") or [])
        tops = _accumulate(tops, m.get("output_top_logprobs") or [])
    if not toks:  # not streamed
        m = last.get("meta_info") or {}
        toks, tops = m.get("output_token_logprobs") or [], m.get("output_top_logprobs") or []
    meta = last["meta_info"]
    ids = last.get("output_ids") or meta.get("output_ids")
    if not ids or len(ids) != len(toks):
        ids = [x[1] for x in toks] or ids or list(last.get("text", "").encode())
    first = {int(tid): float(lp) for lp, tid, *_ in ((tops[0] if tops else None) or [])}
    return {"ttft_s": ttft, "total_s": time.time() - t, "ids": [int(i) for i in ids], "first_top": first,
            "prompt_tokens": meta.get("prompt_tokens"), "cached": meta.get("cached_tokens_details") or {},
            "cached_tokens": meta.get("cached_tokens")}  # fmt: skip


def _accumulate(have: list, chunk: list) -> list:
    """Streamed per-token lists arrive either whole so far (cumulative) or as the new tokens only."""
    if len(chunk) >= len(have) and chunk[: len(have)] == have:
        return list(chunk)
    return have + list(chunk)


def metrics(port: int) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def metric_by_rank(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in re.findall(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.eE+-]+)$", text, re.M):
        rank = re.search(r'tp_rank="(\d+)"', labels or "")
        key = rank.group(1) if rank else "0"
        out[key] = out.get(key, 0.0) + float(value)
    return out


# ---- prompts ---------------------------------------------------------------------------------------------------
def documents(n: int, chars: int) -> list[str]:
    """n distinct long documents made of the shipped corpus's paragraphs in a per-document order (seeded)."""
    paras = [p for p in CORPUS.read_text().split("\n\n") if p.strip()]
    docs = []
    for i in range(n):
        rng = random.Random(1000 + i)
        parts, size = [f"Document {i}: notes on running the operator, part {i}.\n"], 0
        while size < chars:
            p = rng.choice(paras)
            parts.append(p)
            size += len(p) + 2
        docs.append("\n\n".join(parts))
    return docs


def turn_text(doc: str, history: list[tuple[str, str]], question: str) -> str:
    s = f"<|im_start|>system\nAnswer from the document.\n{doc}<|im_end|>\n"
    for q, a in history:
        s += f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
    return s + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


QUESTIONS = ["What does the operator size?", "And what happens at a restart?", "Which volume keeps the cache?"]


def conversations(n: int, turns: int, chars: int) -> list[list[str]]:
    """Multi-turn prompts: turn k+1 extends turn k's prompt (fixed assistant replies), so prefixes are shared."""
    out = []
    for doc in documents(n, chars):
        history: list[tuple[str, str]] = []
        prompts = []
        for t in range(turns):
            prompts.append(turn_text(doc, history, QUESTIONS[t % len(QUESTIONS)]))
            history.append((QUESTIONS[t % len(QUESTIONS)], f"Reply {t}: see the document."))
        out.append(prompts)
    return out


# ---- files on the cache volume ---------------------------------------------------------------------------------
def page_files(d: Path) -> dict[str, int]:
    try:
        return {e.name: e.stat().st_size for e in os.scandir(d) if e.name.endswith(".bin")}
    except FileNotFoundError:
        return {}


def wait_files_stable(d: Path, quiet: float = 2.0, timeout: float = 60) -> dict[str, int]:
    t, last, since = time.time(), None, time.time()
    while time.time() - t < timeout:
        now = page_files(d)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            break
        time.sleep(0.5)
    return last or {}


def per_rank(files: dict[str, int], tp: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in files:
        m = re.search(rf"_(\d+)_{tp}\.bin$", name)
        rank = m.group(1) if m else "?"
        pool = "mamba" if ".mamba_" in name else "indexer" if ".indexer_" in name else "kv"
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


# ---- the rollout, as the reconciler drives it ------------------------------------------------------------------
def operator_modules(site: Path):
    sys.path[:0] = [str(REPO / "operator"), str(site)]
    import yaml
    from qwen_hicache import engine, rollout
    from qwen_hicache.spec import QwenHiCacheServerSpec

    return engine, rollout, QwenHiCacheServerSpec, yaml


def rolling_restart(site: Path, p: dict, old: Server, new: Server, report: dict, on_down=None) -> dict:
    """reconciler._run_rollout's loop over one pod: canary on the old pod, delete (preStop + SIGTERM), the
    successor starts, baseline from its /metrics, verify (the canary again + counters) -> warm or cold."""
    engine, rollout, SpecModel, yaml = operator_modules(site)
    doc = yaml.safe_load(Path(p["spec_path"]).read_text())
    spec = SpecModel.model_validate(doc["spec"])
    target_old = rollout.target_of(spec)
    spec_new = spec.model_copy(update={"restart": "engine-run"})
    target = rollout.target_of(spec_new)
    ro = spec.rollout
    require_warm = ro.require_warm_start and spec.hicache.disk.enabled
    policy = rollout.Policy(ro.max_unavailable, ro.pod_timeout_seconds, require_warm, p["fingerprint"])
    name = f"{p['name']}-0"
    prompt = rollout.canary_prompt(p["name"])
    state = {"server": old, "target": target_old}
    rs, steps, out = None, [], {}
    for _ in range(40):
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        s = state["server"]
        ready = s is not None and s.alive()
        views = [rollout.PodView(name=name, ordinal=0, uid=s.uid if s else "", ready=ready,
                                 ip="127.0.0.1" if ready else None, target=state["target"],
                                 fingerprint=p["fingerprint"])] if s else []  # fmt: skip
        rs, actions = rollout.plan_rollout(rs, views, target, 1, policy, now)
        for act in actions:
            steps.append(act.kind)
            log(f"rollout action {act.kind} on {act.pod}")
            if act.kind == "canary":
                res = engine.generate(act.ip, s.port, prompt)
                out["canary_before"] = res.__dict__
                rs = rollout.canary_sent(rs, act.pod, res.prompt_tokens, res.error)
            elif act.kind == "delete":
                out["stop"] = s.stop_as_pod()
                if on_down:
                    on_down()
                state["server"] = None
                rs = rollout.deleted(rs, act.pod, now)
            elif act.kind == "baseline":
                rs = rollout.baseline_read(rs, act.pod, act.uid, engine.cache_metrics(act.ip, s.port))
            elif act.kind == "verify":
                res = engine.generate(act.ip, s.port, prompt)
                m = engine.cache_metrics(act.ip, s.port) if res.storage_tokens is not None else {}
                out["canary_after"] = res.__dict__
                out["metrics_after"] = m
                rs = rollout.verified(rs, act.pod, res.storage_tokens, res.error, policy, now, m)
        if state["server"] is None and "stop" in out:
            out["start_s"] = new.start()
            state.update(server=new, target=target)
        if rs["phase"] in ("Complete", "Paused"):
            break
        if not actions:
            time.sleep(1)
    out.update(steps=steps, restart_status=rs, warm=bool(rs.get("results") and rs["results"][-1].get("warm")))
    log(f"rollout phase={rs['phase']} steps={steps} results={rs.get('results')}")
    return out


# ---- the sequence ----------------------------------------------------------------------------------------------
def run_prompts(port: int, convs: list[list[str]], max_new: int, label: str) -> list[list[dict]]:
    out = []
    for ci, prompts in enumerate(convs):
        row = []
        for ti, text in enumerate(prompts):
            r = generate(port, text, max_new)
            log(f"{label} conv {ci} turn {ti}: prompt {r['prompt_tokens']} tok, ttft {r['ttft_s'] * 1e3:.1f} ms, "
                f"cached {r['cached']}")  # fmt: skip
            row.append(r)
        out.append(row)
    return out


def compare(ref: list[list[dict]], got: list[list[dict]]) -> dict:
    same, total, worst = 0, 0, 0.0
    for rr, gr in zip(ref, got, strict=False):
        for a, b in zip(rr, gr, strict=False):
            total += 1
            same += a["ids"] == b["ids"]
            common = set(a["first_top"]) & set(b["first_top"])
            if common:
                worst = max(worst, max(abs(a["first_top"][k] - b["first_top"][k]) for k in common))
            if set(a["first_top"]) != set(b["first_top"]):
                worst = max(worst, float("inf"))
    return {"prompts": total, "tokens_identical": same, "all_identical": same == total,
            "logits_max_abs_diff": worst}  # fmt: skip


def storage_hits(res: list[list[dict]]) -> int:
    return sum(int(r["cached"].get("storage") or 0) for row in res for r in row)


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def damage(d: Path, files_by_conv: list[set[str]], tp: int) -> dict:
    """Zero one page file, flip one bit in another, truncate a third (each of another conversation); at TP > 1
    also delete one rank's shard of one page of a fourth. KV page files (no pool tag) are chosen."""
    kv = lambda names: sorted(n for n in names if ".mamba_" not in n and ".indexer_" not in n)  # noqa: E731
    done: dict[str, dict] = {}
    kinds = ["zeroed", "bitflip", "truncated"] + (["rank_shard_deleted"] if tp > 1 else [])
    for kind, names in zip(kinds, files_by_conv, strict=False):
        cand = kv(names)
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


def copy_bench(site: Path, tp: int) -> dict:
    """Host->GPU copy through the io backend the operator renders (kernel: sgl_kernel.kvcacheio, page_first),
    against one 1 GiB contiguous pinned copy, measured in a separate interpreter."""
    code = HERE / "engine_copy_bench.py"
    if not code.exists():
        return {"ran": False, "why": "engine_copy_bench.py absent"}
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, str(code)], env=env, capture_output=True, text=True, timeout=240)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ran": False, "why": (r.stdout + r.stderr)[-800:]}


def sequence(args, report: dict) -> None:
    site, work, tp = args.site, args.work, args.tp
    model_dir = work / "model" / "tiny-qwen4-exp"
    cache_root, logs = work / "hicache", work / "logs"
    for d in (cache_root, logs):
        d.mkdir(parents=True, exist_ok=True)
    if args.model_dir:
        model_dir = args.model_dir
    elif not (model_dir / "model.safetensors").exists():
        t = time.time()
        r = subprocess.run([sys.executable, str(HERE / "tiny_model.py"), "--sglang-site", str(site), "--check", "cuda",
                            str(model_dir)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})  # fmt: skip
        log(f"tiny model built rc={r.returncode} in {time.time() - t:.1f}s: {(r.stdout + r.stderr).strip()[-400:]}")
        if r.returncode:
            raise RuntimeError("tiny model build failed")
    if (model_dir / "manifest.json").exists():
        report["model_manifest"] = json.loads((model_dir / "manifest.json").read_text())
    port = 30000
    p = plan(site, spec_file(work, tp), model_dir, cache_root, port)
    report["launch"] = {k: p[k] for k in ("argv", "fingerprint", "cache_dir", "grace", "rendered_model_path")}
    report["launch"]["env"] = {k: v for k, v in p["env"].items() if k != "QWEN_HICACHE_ADMIN_API_KEY"}
    log("launch: " + " ".join(p["argv"]))
    cdir = Path(p["cache_dir"])
    n_conv = 2 if args.smoke else 4 + (1 if tp > 1 else 0)
    convs = conversations(n_conv, 2, args.prompt_chars)
    report["stand_ins"] = [f"flash_attn: {SHIM / 'flash_attn'} (QSA paged decode/verify rows through the runtime's "
                           "own sparse_gqa_packed_decode_triton)"]
    if ENGINE_CMD:
        report["stand_ins"].append("engine: " + " ".join(ENGINE_CMD))

    s1 = Server(p, site, logs, "cold", tp)
    report["start_cold_s"] = s1.start()
    cold, files_by_conv, seen = [], [], set()
    for prompts in convs:
        cold += run_prompts(port, [prompts], args.max_new, "cold")
        now = set(wait_files_stable(cdir))
        files_by_conv.append(now - seen)
        seen |= now
    m1 = metrics(port)
    report["host_pool"] = {
        "kv_tokens_per_rank": metric_by_rank(m1, "sglang:hicache_host_total_tokens"),
        "mamba_states_per_rank": metric_by_rank(m1, "sglang:hicache_host_mamba_total_states"),
        "operator_kv_tokens_per_rank": p["sizing"].get("hostKVTokensPerRank"),
        "operator_mamba_slots_per_rank": p["sizing"].get("hostMambaSlotsPerRank"),
    }  # fmt: skip
    # Host-RAM hits: churn the device's Mamba slots with short distinct prompts, then ask the first turns again.
    filler = [[t] for t in (f"<|im_start|>user\nfiller {i}: " + documents(1, 3000)[0][:2500] + f" {i}<|im_end|>\n"
                            for i in range(0 if args.smoke else args.fillers))]  # fmt: skip
    if filler:
        run_prompts(port, filler, 1, "filler")
    host = run_prompts(port, [[c[0]] for c in convs], args.max_new, "host-warm")
    report["host_rerun_cached"] = [r[0]["cached"] for r in host]
    files_cold = wait_files_stable(cdir)

    files_before_stop = dict(files_cold)

    def on_down():
        report["files_after_flush"] = per_rank(page_files(cdir), tp)
        report["files_after_flush_total"] = len(page_files(cdir))
        report["disk_read"] = disk_read_gbps(cdir)

    s2 = Server(p, site, logs, "warm", tp)
    ro = rolling_restart(site, p, s1, s2, report, on_down)
    report["rollout"] = {k: v for k, v in ro.items() if k != "restart_status"}
    report["rollout"]["restart_status"] = ro.get("restart_status")
    report["files_written_before_stop"] = len(files_before_stop)
    warm = run_prompts(port, convs, args.max_new, "disk-warm")
    cmp_warm = compare(cold, warm)
    m2 = metrics(port)
    report["restarts"] = [{
        "warm": ro["warm"], "storage_hit_tokens": storage_hits(warm), **cmp_warm,
        "storage_counter": metric_by_rank(m2, "sglang:cached_tokens_total"),
    }]  # fmt: skip
    report["ttft_cold_s"] = median([row[0]["ttft_s"] for row in cold])
    report["ttft_host_s"] = median([r[0]["ttft_s"] for r in host if (r[0]["cached"].get("host") or 0) > 0])
    report["ttft_disk_s"] = median([row[0]["ttft_s"] for row in warm])
    report["ttft_device_s"] = median([row[1]["ttft_s"] for row in cold])
    report["per_request"] = {"cold": strip(cold), "host": strip(host), "disk_warm": strip(warm)}
    report["metrics_warm_excerpt"] = [ln for ln in m2.splitlines() if re.match(
        r"sglang:(cached_tokens_total|prefetched_tokens_total|hicache_|load_back|storage_|backuped|prefill_effective)",
        ln)][:80]  # fmt: skip
    report["host_pool"]["allocation_log"] = [ln[-200:] for ln in s2.tail(100000).splitlines()
                                             if "Allocating" in ln and "host memory" in ln][:8]  # fmt: skip
    report["flash_attn_stand_in"] = [ln[-160:] for ln in s2.tail(100000).splitlines()
                                     if "flash_attn stand-in" in ln][:2]  # fmt: skip
    report["memory"] = {"limit_bytes": p["memory_limit"], "shm_limit_bytes": p["shm_limit"],
                        "peak_cold": s1.peak, "peak_warm": dict(s2.peak),
                        "held": max(s1.peak["rss_bytes"], s2.peak["rss_bytes"]) <= p["memory_limit"]
                        and max(s1.peak["shm_used_bytes"], s2.peak["shm_used_bytes"]) <= p["shm_limit"]}  # fmt: skip
    restore = restore_figures(m2, warm, p)
    report.update(restore)
    report["stop_warm"] = s2.stop_as_pod()
    if args.smoke:
        return

    # A changed fingerprint input (KV dtype): a new, empty namespace; the old one is left as it was.
    old_digest = tree_digest(cdir)
    p3 = plan(site, spec_file(work, tp, kvCacheDtype="bfloat16"), model_dir, cache_root, port)
    s3 = Server(p3, site, logs, "new-fingerprint", tp)
    s3.start()
    fresh = run_prompts(port, convs, args.max_new, "new-fingerprint")
    report["fingerprint_change"] = {
        "old": p["fingerprint"], "new": p3["fingerprint"], "storage_hit_tokens": storage_hits(fresh),
        "new_dir_files": len(page_files(Path(p3["cache_dir"]))), "old_dir_unchanged": tree_digest(cdir) == old_digest,
        "dirs": sorted(e.name for e in os.scandir(cache_root) if e.is_dir()),
    }  # fmt: skip
    s3.stop_as_pod()

    # Damage while stopped: those pages are misses, never wrong output; the rest still hit.
    report["damage_files"] = damage(cdir, files_by_conv, tp)
    s4 = Server(p, site, logs, "damaged", tp)
    s4.start()
    dmg = run_prompts(port, convs, args.max_new, "damaged")
    cmp_dmg = compare(cold, dmg)
    per_conv = [int(r[0]["cached"].get("storage") or 0) for r in dmg]
    ref_conv = [int(r[0]["cached"].get("storage") or 0) for r in warm]
    verdict = {}
    for kind, info in report["damage_files"].items():
        c = info.get("conversation")
        if c is None:
            verdict[kind] = "not run: no file"
        elif not s4.alive():
            verdict[kind] = "server crashed"
        elif dmg[c][0]["ids"] != cold[c][0]["ids"]:
            verdict[kind] = "WRONG OUTPUT"
        elif per_conv[c] < ref_conv[c]:
            verdict[kind] = "miss"
        else:
            verdict[kind] = f"hit ({per_conv[c]} storage tokens, as undamaged: {ref_conv[c]})"
    others = [i for i in range(len(convs)) if i not in {v.get("conversation") for v in report["damage_files"].values()}]
    report["damage"] = verdict
    report["damage_detail"] = {"storage_per_conversation": per_conv, "undamaged_reference": ref_conv,
                               "others_still_hit": all(per_conv[i] > 0 for i in others), **cmp_dmg,
                               "discards_log": [ln for ln in s4.tail(4000).splitlines()
                                                if re.search("discard|checksum", ln, re.I)][-20:]}  # fmt: skip
    report["restarts"].append({"warm": per_conv and any(per_conv), "storage_hit_tokens": storage_hits(dmg), **cmp_dmg,
                               "note": "after damaging pages"})  # fmt: skip
    report["stop_damaged"] = s4.stop_as_pod()
    report["copy"] = copy_bench(site, tp)
    report["copy_gbps"] = report["copy"].get("kernel_gbps")
    report["copy_limit_gbps"] = report["copy"].get("limit_gbps")


def restore_figures(m: str, warm: list[list[dict]], p: dict) -> dict:
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


def strip(res: list[list[dict]]) -> list[list[dict]]:
    return [[{k: r[k] for k in ("ttft_s", "prompt_tokens", "cached", "ids")} for r in row] for row in res]


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
               "restore_gbps", "disk_read_gbps", "copy_gbps", "copy_limit_gbps", "damage")  # fmt: skip


def bench_record(report: dict) -> dict:
    """The run as bench/gpu_engine.json keeps it: exactly the issue's fields, None where nothing was measured."""
    out = {k: report.get(k) for k in RECORD_KEYS}
    out["disk_read_gbps"] = (report.get("disk_read") or {}).get("gbps")
    out["restarts"] = [{k: r.get(k) for k in ("warm", "storage_hit_tokens", "tokens_identical", "logits_max_abs_diff")}
                       for r in report.get("restarts") or []]  # fmt: skip
    dmg = report.get("damage") or {}
    out["damage"] = {k: dmg.get(k, "not run") for k in ("zeroed", "bitflip", "truncated", *(
        ["rank_shard_deleted"] if report.get("tp", 1) > 1 else []))}  # fmt: skip
    return out


def record(raw: Path) -> dict:
    """Add (or replace, by tp) the run in bench/gpu_engine.json."""
    rec = bench_record(json.loads(raw.read_text()))
    runs = json.loads(BENCH_JSON.read_text()) if BENCH_JSON.exists() else []
    runs = [r for r in runs if r.get("tp") != rec["tp"]] + [rec]
    BENCH_JSON.write_text(json.dumps(sorted(runs, key=lambda r: r["tp"]), indent=1) + "\n")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path)
    ap.add_argument("--record", type=Path, help="here, after a run: add its engine-tpN.json to bench/gpu_engine.json")
    ap.add_argument("--work", type=Path, default=Path("/root/engine-work"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--smoke", action="store_true", help="two conversations, one restart, no damage/fingerprint")
    ap.add_argument("--prompt-chars", type=int, default=32000, help="document size (32000 chars: 8.5k-9.3k tokens)")
    ap.add_argument("--fillers", type=int, default=48)
    ap.add_argument("--model-dir", type=Path, help="use this model directory instead of building the tiny one")
    ap.add_argument("--engine-cmd", default="", help="CPU test only: run this, not the rendered command")
    ap.add_argument("--engine-path", default="", help="CPU test only: PYTHONPATH entries for --engine-cmd")
    args = ap.parse_args()
    if args.record:
        print(json.dumps(record(args.record), indent=1))
        return 0
    if not (args.site and args.out):
        ap.error("--site and --out are required for a run")
    ENGINE_CMD[:] = args.engine_cmd.split()
    ENGINE_PATH[:] = [p for p in args.engine_path.split(os.pathsep) if p]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.work.exists():
        shutil.rmtree(args.work / "hicache", ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    report = {**environment(), "model_type": "qwen4_exp", "tp": args.tp, "smoke": args.smoke}
    rc = 0
    try:
        sequence(args, report)
    except Exception as err:  # the report says what ran and where it stopped
        report["error"] = f"{type(err).__name__}: {err}"
        report["traceback"] = traceback.format_exc()[-4000:]
        log(f"STOPPED: {report['error']}")
        rc = 1
    finally:
        (args.out / f"engine-tp{args.tp}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (args.out / "engine.log").write_text("\n".join(LOG_LINES) + "\n")
        with tarfile.open(args.out / f"logs-tp{args.tp}.tgz", "w:gz") as tar:
            tar.add(args.work / "logs", arcname="logs")
    return rc


if __name__ == "__main__":
    sys.exit(main())
