"""A pod of the engine run, as the operator renders it: the command line, env, cache-guard and preStop read from the
StatefulSet `qwen-hicache render` prints, the server started and stopped as a kubelet would, and the operator's
own rollout state machine driven over such pods the way execute.run_rollout drives it.

Only the model path, the bind address, the port and the cache volume's path are replaced, as a pod's mounts
and network would; the pod's own address (its loopback inside the pod) is `QWEN_HICACHE_POD_HOST` for the
preStop hook, which reads it for exactly that.
"""

from __future__ import annotations

import contextlib
import copy
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SPEC = HERE / "data" / "tiny-qhc.yaml"
CORPUS = HERE / "data" / "tiny_corpus.txt"
SHIM = HERE / "shim"  # flash_attn stand-in (shim/flash_attn/__init__.py)
PROCESS_MARK = "==== qhc-engine-run: process start "  # then the pod's tag and the time; one per server process
ENGINE_PATH: list[str] = []  # extra PYTHONPATH entries for --engine-cmd (the CPU test's engine stand-in)
ENGINE_CMD: list[str] = []  # replaces `python3 -m sglang.launch_server` (CPU test only)
EXTRA_ARGS: list[str] = []  # appended to the spec's runtime.extraArgs (a run's condition, e.g. deterministic mode)
DROP_ARGS: list[str] = []  # removed from the spec's runtime.extraArgs (e.g. --disable-cuda-graph: graphs on)
LOG_LINES: list[str] = []
JIT_DIR = ".jit"  # qwen_hicache.constants.JIT_CACHE_DIR: the compile caches' folder on the cache volume
SERVERS: list[Server] = []  # every server started, so a failed step can stop whatever it left running
T0 = time.time()


def log(msg: str) -> None:
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG_LINES.append(line)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def empty_volume(volume: Path, keep_compiled: bool = False, seed: Path | None = None) -> None:
    """An empty cache volume for a cold start. With `keep_compiled` its compile caches (`JIT_DIR`: kernels, no model
    state) stay, or `seed`'s are copied in where it has none: a pod's volume keeps them across restarts, and a cold
    start that compiles everything again costs a device call 150-300 s before any request is served."""
    for entry in volume.iterdir() if volume.is_dir() else ():
        if not (keep_compiled and entry.name == JIT_DIR):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    volume.mkdir(parents=True, exist_ok=True)
    if keep_compiled and seed is not None and seed.is_dir() and not (volume / JIT_DIR).exists():
        shutil.copytree(seed, volume / JIT_DIR, symlinks=True)


# ---- the operator's outputs -----------------------------------------------------------------------------------
def operator_cli(args: list[str], site: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(site)])}
    return subprocess.run([sys.executable, "-m", "qwen_hicache.cli", *args], check=True, capture_output=True,
                          text=True, env=env).stdout  # fmt: skip


def yaml_doc(path: Path) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def spec_file(
    work: Path, tp: int, replicas: int = 1, model: dict | None = None, hicache: dict | None = None, **runtime
) -> Path:
    """tests/gpu/data/tiny-qhc.yaml at this TP size and replica count, with these model, hicache and runtime fields
    changed."""
    import yaml

    doc = yaml_doc(SPEC)
    doc["spec"]["replicas"] = replicas
    doc["spec"]["model"].update(model or {})
    doc["spec"]["runtime"]["tensorParallelSize"] = tp
    doc["spec"]["runtime"].update(runtime)
    doc["spec"]["hicache"].update(hicache or {})
    kept = [a for a in doc["spec"]["runtime"].get("extraArgs", []) if a not in DROP_ARGS]
    doc["spec"]["runtime"]["extraArgs"] = kept + EXTRA_ARGS
    key = json.dumps([replicas, model, hicache, runtime, EXTRA_ARGS, DROP_ARGS], sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:8]
    path = work / f"spec-tp{tp}-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)  # fmt: skip


def rendered(site: Path, path: Path) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all(operator_cli(["render", str(path)], site)) if d]


def plan(site: Path, path: Path, model_dir: Path, cache_root: Path, port: int, host: str = "127.0.0.1") -> dict:
    """What a pod of this resource runs, from the rendered StatefulSet, with the pod's mounts mapped to paths."""
    docs = rendered(site, path)
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
    argv[argv.index("--host") + 1] = host
    argv[argv.index("--port") + 1] = str(port)
    env["QWEN_HICACHE_PORT"] = str(port)
    env["QWEN_HICACHE_POD_HOST"] = host  # the preStop hook's "localhost" (a pod's own loopback)
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
        "host": host,
    }  # fmt: skip


def with_host(p: dict, host: str) -> dict:
    """The same pod on another address (a restarted pod's new IP)."""
    q = copy.deepcopy(p)
    q["argv"][q["argv"].index("--host") + 1] = host
    q["env"]["QWEN_HICACHE_POD_HOST"] = q["host"] = host
    return q


# ---- a pod's life: init container, server, preStop + SIGTERM ---------------------------------------------------
class Server:
    def __init__(self, p: dict, site: Path, logdir: Path, tag: str, tp: int, extra_path: tuple[str, ...] = ()):
        self.p, self.site, self.tag, self.tp, self.extra_path = p, site, tag, tp, extra_path
        self.log_path = logdir / f"server-{tag}.log"
        self.host, self.port = p["host"], int(p["env"]["QWEN_HICACHE_PORT"])
        self.proc: subprocess.Popen | None = None
        self.uid = hashlib.sha256(f"{tag}:{time.time()}".encode()).hexdigest()[:12]
        self.peak = {"rss_bytes": 0, "shm_used_bytes": 0}
        self.launched = 0.0

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

    def launch(self) -> None:
        """The init container, then the server process (as the kubelet starts the pod's containers)."""
        if http_status(self.host, self.port, "/health") is not None:
            raise RuntimeError(f"{self.host}:{self.port} already answers: another server holds the pod's address")
        self.run_guard()
        path = os.pathsep.join([*self.extra_path, str(self.site), str(SHIM), *ENGINE_PATH])
        # the site's modules and, as pip puts them on the image's PATH, its scripts (flashinfer's JIT runs `ninja`)
        bins = os.pathsep.join([str(self.site / "bin"), os.environ.get("PATH", "")])
        env = {**os.environ, **self.p["env"], "PYTHONPATH": path, "PATH": bins, "PYTHONUNBUFFERED": "1"}
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(self.tp)))
        self.launched = time.time()
        self.fh = open(self.log_path, "ab")  # noqa: SIM115 - the server writes it until it exits
        self.fh.write(f"{PROCESS_MARK}{self.tag} {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self.fh.flush()  # a pod restarted in one call appends to its log: this line starts each process's part
        self.proc = subprocess.Popen(self.p["argv"], env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        SERVERS.append(self)
        threading.Thread(target=self._sample, daemon=True).start()

    def wait_ready(self, timeout: float = 540) -> float:
        while time.time() - self.launched < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.tag} exited rc={self.proc.returncode} during start-up:\n"
                                   + self.tail(60))  # fmt: skip
            if all(http_status(self.host, self.port, path) == 200 for path in ("/health", "/ready")):
                took = time.time() - self.launched
                log(f"server {self.tag} ready in {took:.1f}s (pid {self.proc.pid}, {self.host}:{self.port})")
                return took
            time.sleep(0.5)
        raise RuntimeError(f"server {self.tag} not ready after {timeout}s:\n" + self.tail(60))

    def start(self, timeout: float = 540) -> float:
        self.launch()
        return self.wait_ready(timeout)

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
        # The kubelet's runtime signals the container's PID 1 (the server's main process) only, never its children:
        # a SIGTERM to the whole group (as the 2026-12-04 lease did) reaches the detokenizer and scheduler too, and
        # the server takes its child-crashed path (SIGQUIT, kill_process_tree, rc -9) instead of patch 0003's drain.
        os.kill(self.proc.pid, signal.SIGTERM)
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
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)

    def alive(self) -> bool:
        running = self.proc is not None and self.proc.poll() is None
        return running and http_status(self.host, self.port, "/health") == 200


def stop_all() -> None:
    """Kill every server still running (a failed step's leftovers): the next step starts its own."""
    for s in SERVERS:
        if s.proc is not None and s.proc.poll() is None:
            log(f"killing server {s.tag} (left running)")
            s.kill_rest()


def start_together(servers: list[Server], timeout: float = 540) -> list[float]:
    """Start the servers one after the other, each ready before the next launches. On one GPU two servers that
    size their pools from its free memory race: one allocating between the other's baseline and its profile
    leaves that one "no GPU memory for the KV cache" (the 2026-12-04 lease lost a router pod and a TP 1 start
    to it); pods of a StatefulSet would each have their own GPU."""
    return [s.start(timeout) for s in servers]


# ---- HTTP ------------------------------------------------------------------------------------------------------
def http_status(host: str, port: int, path: str) -> int | None:
    try:
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", path)
        return c.getresponse().status
    except OSError:
        return None


# Log-probs asked of every output token for these ids (every 16th past the special tokens; all < the models' 4096
# vocab): the same tokens in every run, where the top-20 sets of two runs of a random-weight model differ.
PROBE_IDS = list(range(7, 4096, 16))


def generate(host: str, port: int, text: str, max_new: int, top: int = 20, timeout: float = 120) -> dict:
    """One greedy streamed request: time to first token, output ids, each output token's log-prob (`lps`), the
    first token's top log-probs and its log-probs of PROBE_IDS, cache report."""
    sampling = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    body = json.dumps({"text": text, "stream": True, "return_logprob": True, "top_logprobs_num": top,
                       "token_ids_logprob": PROBE_IDS, "logprob_start_len": -1,
                       "sampling_params": sampling})  # fmt: skip
    c = http.client.HTTPConnection(host, port, timeout=timeout)
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
    probes: list = []
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
        probes = _accumulate(probes, m.get("output_token_ids_logprobs") or [])
    if not toks:  # not streamed
        m = last.get("meta_info") or {}
        toks, tops = m.get("output_token_logprobs") or [], m.get("output_top_logprobs") or []
        probes = m.get("output_token_ids_logprobs") or []
    meta = last["meta_info"]
    ids = last.get("output_ids") or meta.get("output_ids")
    if not ids or len(ids) != len(toks):
        ids = [x[1] for x in toks] or ids or list(last.get("text", "").encode())
    timing = {k: v for k, v in meta.items() if isinstance(v, int | float) and not k.endswith("tokens")
              and any(w in k for w in ("wait", "queue", "latency", "_ts"))}  # fmt: skip
    return {"ttft_s": ttft, "total_s": time.time() - t, "ids": [int(i) for i in ids], "timing": timing,
            "first_top": _first_logprobs(tops), "first_probe": _first_logprobs(probes),
            "lps": [float(row[0]) for row in toks if row and row[0] is not None],
            "prompt_tokens": meta.get("prompt_tokens"), "cached": meta.get("cached_tokens_details") or {},
            "cached_tokens": meta.get("cached_tokens")}  # fmt: skip


def sample(host: str, port: int, text: str, max_new: int = 8, timeout: float = 300) -> dict:
    """One request with top-k and top-p, as clients send them: where flashinfer imports it is the runtime's default
    sampling backend, and the first such request JIT-builds its sampling module in the scheduler (a failed build
    ends the server). Whether it answered, and in how long (that build included)."""
    sampling = {"max_new_tokens": max_new, "temperature": 0.7, "top_p": 0.9, "top_k": 20}
    body = json.dumps({"text": text, "sampling_params": sampling})
    t = time.time()
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        data = resp.read()
    except OSError as e:
        return {"ok": False, "seconds": round(time.time() - t, 2), "error": repr(e)}
    out = {"ok": resp.status == 200, "seconds": round(time.time() - t, 2), "status": resp.status}
    if resp.status != 200:
        out["error"] = data[:500].decode(errors="replace")
    return out


def _first_logprobs(rows: list) -> dict[int, float]:
    """{token id: log-prob} of the first output token, from per-token lists of (logprob, id, text) rows."""
    return {int(tid): float(lp) for lp, tid, *_ in ((rows[0] if rows else None) or [])}


def _accumulate(have: list, chunk: list) -> list:
    """Streamed per-token lists arrive either whole so far (cumulative) or as the new tokens only."""
    if len(chunk) >= len(have) and chunk[: len(have)] == have:
        return list(chunk)
    return have + list(chunk)


def metrics(host: str, port: int) -> str:
    c = http.client.HTTPConnection(host, port, timeout=10)
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
def documents(n: int, chars: int, first: int = 0) -> list[str]:
    """n distinct long documents made of the shipped corpus's paragraphs in a per-document order (seeded)."""
    paras = [p for p in CORPUS.read_text().split("\n\n") if p.strip()]
    docs = []
    for i in range(first, first + n):
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


def conversations(n: int, turns: int, chars: int, first: int = 0) -> list[list[str]]:
    """Multi-turn prompts: turn k+1 extends turn k's prompt (fixed assistant replies), so prefixes are shared."""
    out = []
    for doc in documents(n, chars, first):
        history: list[tuple[str, str]] = []
        prompts = []
        for t in range(turns):
            prompts.append(turn_text(doc, history, QUESTIONS[t % len(QUESTIONS)]))
            history.append((QUESTIONS[t % len(QUESTIONS)], f"Reply {t}: see the document."))
        out.append(prompts)
    return out


# ---- the rollout, as the reconciler drives it ------------------------------------------------------------------
def operator_modules(site: Path):
    for p in (str(site), str(REPO / "operator")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import yaml
    from qwen_hicache import engine, rollout
    from qwen_hicache import plan as planner

    return engine, rollout, planner, yaml


@dataclass
class Slot:
    """One StatefulSet ordinal: the pod running now (None while deleted) and how its successor is made."""

    name: str
    ordinal: int
    server: Server | None
    successor: Callable[[], Server]
    target: str = ""
    incarnations: list[str] = field(default_factory=list)


def rolling_restart(site: Path, spec_path: Path, slots: list[Slot], seam=None,
                    on_down: Callable[[Slot], None] | None = None, restart_id: str = "engine-run") -> dict:
    """execute.run_rollout over these pods: the operator's plan of the resource (target, policy), then
    rollout.plan_rollout pass after pass: canary on the old pod; delete = the router seam's "before delete"
    (`seam.ready_to_delete`, as execute.run_rollout asks router.ready_to_delete) then preStop + SIGTERM, and the
    successor starts (the StatefulSet controller's part); baseline from its /metrics; verify (the canary again
    + counters) -> warm or cold; after each pass the seam's `sync` (router.sync: re-list verified pods)."""
    engine, rollout, planner, yaml = operator_modules(site)
    doc = yaml.safe_load(Path(spec_path).read_text())
    meta = {"name": doc["metadata"]["name"], "namespace": doc["metadata"].get("namespace", "default"),
            "uid": "engine-run"}
    old_plan = planner.plan(meta, doc["spec"])
    new_spec = copy.deepcopy(doc["spec"])
    new_spec["restart"] = restart_id
    new_plan = planner.plan(meta, new_spec)
    if old_plan.derived is None or new_plan.derived is None:
        raise RuntimeError(f"the operator refuses the spec: {[*old_plan.problems, *new_plan.problems]}")
    target, policy, replicas = new_plan.derived.target, new_plan.derived.policy, new_plan.spec.replicas
    fingerprint = new_plan.derived.layout.fingerprint
    for slot in slots:
        slot.target = slot.target or old_plan.derived.target
    by_name = {s.name: s for s in slots}
    prompt = rollout.canary_prompt(meta["name"])
    rs, steps, out = None, [], {"pods": {s.name: {} for s in slots}, "router": []}
    deadline = time.time() + policy.timeout_seconds
    while time.time() < deadline:
        now = utc_now()
        views = []
        for s in slots:
            if s.server is None:
                continue
            ready = s.server.alive()
            views.append(rollout.PodView(name=s.name, ordinal=s.ordinal, uid=s.server.uid, ready=ready,
                                         ip=s.server.host if ready else None, target=s.target,
                                         fingerprint=fingerprint))  # fmt: skip
        rs, actions = rollout.plan_rollout(rs, views, target, replicas, policy, now)
        waited = not actions
        for act in actions:
            slot, pod_out = by_name[act.pod], out["pods"][act.pod]
            s = slot.server
            steps.append(f"{act.kind} {act.pod}")
            log(f"rollout action {act.kind} on {act.pod}")
            if act.kind == "canary":
                res = engine.generate(act.ip, s.port, prompt)
                pod_out["canary_before"] = res.__dict__
                rs = rollout.canary_sent(rs, act.pod, res.prompt_tokens, res.error)
            elif act.kind == "delete":
                if seam is not None and not seam.ready_to_delete(rs, act.pod):
                    steps[-1] += " (deferred: the router still routes to it)"
                    waited = True
                    continue
                pod_out["stop"] = s.stop_as_pod()
                if seam is not None:
                    seam.pod_gone(slot)
                if on_down:
                    on_down(slot)
                slot.server = None
                rs = rollout.deleted(rs, act.pod, now)
                slot.server = slot.successor()  # the StatefulSet controller's part: same name, same volume
                slot.target = target
                slot.incarnations.append(slot.server.tag)
                slot.server.launch()
                if seam is not None:
                    seam.pod_up(slot)
                pod_out["start_s"] = slot.server.wait_ready()
            elif act.kind == "baseline":
                rs = rollout.baseline_read(rs, act.pod, act.uid, engine.cache_metrics(act.ip, s.port))
            elif act.kind == "verify":
                res = engine.generate(act.ip, s.port, prompt)
                m = engine.cache_metrics(act.ip, s.port) if res.storage_tokens is not None else {}
                pod_out["canary_after"] = res.__dict__
                pod_out["metrics_after"] = m
                rs = rollout.verified(rs, act.pod, res.storage_tokens, res.error, policy, now, m)
        if seam is not None:
            out["router"].append({"after": steps[-1] if steps else None, **seam.sync(rs)})
        if rs.phase in ("Complete", "Paused"):
            break
        if waited:
            time.sleep(1)
    results = {r.pod: r for r in rs.results}
    out.update(steps=steps, phase=rs.phase, restart_status=rs.model_dump(mode="json", by_alias=True,
                                                                          exclude_none=True),
               warm={name: bool(results.get(name) and results[name].warm) for name in by_name})  # fmt: skip
    log(f"rollout phase={rs.phase} steps={steps} warm={out['warm']}")
    return out
