"""A real Prometheus scraping the stand-ins: engines, their cache-usage sidecars and the operator's metrics.

Used by tests/observability (every dashboard query and rule returns data) and by `harness.prometheus.picture`
(the dashboard picture in docs/). Everything listens on loopback and is stopped by `close()` (the engine and
sidecar children also die with this process).

Real: Prometheus (scrape, TSDB, rule evaluation), the rules file of the chart, the dashboard's PromQL, the
cache-usage script, the operator's metric functions, the engines' disk tier (the wheel's HiCacheFile with
its LRU evictor at the configured cap). Simulated: the engines (harness.sim.engine), and the operator's
rollout, whose `status.restart` values are written here in the order the operator writes them and fed to
the same `metrics.observe_restart_status` the reconciler calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.prometheus import build

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts/qwen-hicache-operator/files/prometheus-rules.yaml"
ENGINE_PORT = 30000
NAMESPACE, SERVER, FINGERPRINT = "inference", "qwen", "fp-6c1d0e2a9b7f"
ADMIN_KEY = "stand-key"


def _engine_args(ip: str, tp: int) -> list[str]:
    return ["--served-model-name", "Qwen/Qwen3.8-Flash-Next", "--page-size", "64", "--tp-size", str(tp),
            "--enable-hierarchical-cache", "--hicache-storage-backend", "file", "--enable-metrics",
            "--enable-cache-report", "--admin-api-key", ADMIN_KEY, "--host", ip, "--port", str(ENGINE_PORT),
            "--sim-device-pages", "48", "--sim-host-pages", "160"]  # fmt: skip


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class Pod:
    name: str
    ip: str
    root: Path
    cap: int
    engine: subprocess.Popen | None = None
    usage: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{ENGINE_PORT}"

    def call(self, path: str, body: dict | None = None, key: str | None = None) -> dict | str:
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.startswith("{") else text


@dataclass
class Stand:
    """Pods of one server, a Prometheus on 127.0.0.1 and the operator's metrics endpoint."""

    workdir: Path
    replicas: int = 2
    tp: int = 2
    caps: tuple[int, ...] = (4 << 20, 900 << 10)
    pods: list[Pod] = field(default_factory=list)
    prometheus: subprocess.Popen | None = None
    prom_url: str = ""
    restart_status: object = None  # the typed status.restart the metrics last saw

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Stand:
        from qwen_hicache import metrics

        from harness.devcluster import free_ports
        from harness.sim.cluster import IpPool
        from harness.sim.sglang_tree import TREE_ENV, patched_sglang_tree

        self._tree_env = {TREE_ENV: str(patched_sglang_tree())}
        pool = IpPool()
        for i in range(self.replicas):
            ip = pool.take(ENGINE_PORT)
            pod = Pod(f"{SERVER}-{i}", ip, self.workdir / f"{SERVER}-{i}", self.caps[i % len(self.caps)])
            (pod.root / FINGERPRINT).mkdir(parents=True)
            (pod.root / FINGERPRINT / ".qwen-hicache-fingerprint").write_text(FINGERPRINT + "\n")
            self.pods.append(pod)
            self._start_engine(pod)
            self._start_usage(pod)
        self.operator_port, prom_port = free_ports(2)
        metrics.start_metrics_server(self.operator_port, addr="127.0.0.1")
        self._start_prometheus(prom_port)
        for pod in self.pods:
            self._wait_ready(pod)
        return self

    def _start_engine(self, pod: Pod) -> None:
        env = {**os.environ, **self._tree_env, "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(pod.root / FINGERPRINT),
               "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(pod.cap)}
        pod.engine = subprocess.Popen([sys.executable, "-m", "harness.sim.engine", *_engine_args(pod.ip, self.tp)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)

    def _start_usage(self, pod: Pod) -> None:
        from qwen_hicache import diskusage

        env = {**os.environ, "QWEN_HICACHE_CACHE_ROOT": str(pod.root), "QWEN_HICACHE_FINGERPRINT": FINGERPRINT,
               "QWEN_HICACHE_TP_SIZE": str(self.tp), "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": str(pod.cap),
               "QWEN_HICACHE_USAGE_HOST": pod.ip, "QWEN_HICACHE_USAGE_INTERVAL": "1"}
        pod.usage = subprocess.Popen([sys.executable, "-c", diskusage.SCRIPT], env=env, stdout=subprocess.DEVNULL)

    def _wait_ready(self, pod: Pod, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(pod.url + "/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
            if pod.engine and pod.engine.poll() is not None:
                raise RuntimeError(f"engine {pod.name} exited {pod.engine.returncode}")
            time.sleep(0.1)
        raise TimeoutError(f"{pod.name} not ready")

    def _config(self, rules: Path) -> dict:
        def job(name: str, port: int) -> dict:
            targets = [{"targets": [f"{p.ip}:{port}"],
                        "labels": {"namespace": NAMESPACE, "pod": p.name, "server": SERVER}} for p in self.pods]
            return {"job_name": name, "static_configs": targets}

        operator = {"job_name": "qwen-hicache-operator", "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{self.operator_port}"]}]}
        from qwen_hicache import diskusage

        return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [job("sglang", ENGINE_PORT), job("cache-usage", diskusage.PORT), operator]}

    def _start_prometheus(self, port: int) -> None:
        groups = yaml.safe_load(RULES.read_text())
        for g in groups["groups"]:
            g["interval"] = "1s"  # the chart's 30 s, sped up for a test of seconds
        rules = self.workdir / "rules.yaml"
        rules.write_text(yaml.safe_dump(groups, sort_keys=False))
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config(rules), sort_keys=False))
        binary = build.ensure()["prometheus"]
        self.prom_url = f"http://127.0.0.1:{port}"
        self._log = open(self.workdir / "prometheus.log", "w")  # noqa: SIM115 - closed in close()
        self.prometheus = subprocess.Popen(
            [str(binary), f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=2h", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=self._log)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(self.prom_url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready: " + (self.workdir / "prometheus.log").read_text()[-2000:])

    def close(self) -> None:
        """Stop Prometheus and every pod process (SIGTERM, then SIGKILL after 10 s)."""
        procs = [self.prometheus, *(p.engine for p in self.pods), *(p.usage for p in self.pods)]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> Stand:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what happens ---------------------------------------------------------------------------
    def traffic(self, seconds: float, prefixes: int = 24, seed: int = 7) -> None:
        """Requests sharing long system prompts (device, then host, then disk as the tiers overflow)."""
        rnd = random.Random(seed)
        heads = [(f"[system {k}] You answer questions about cache tiers. " * 40)[: 64 * 18] for k in range(prefixes)]
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            for pod in self.pods:
                k = min(int(rnd.expovariate(1 / 6)), prefixes - 1)
                pod.call("/generate", {"text": heads[k] + f" question {n}", "sampling_params": {"max_new_tokens": 8}})
            n += 1
            time.sleep(0.02)

    def restart(self, pod: Pod, cold: bool = False) -> int:
        """The preStop hook, SIGTERM, a new engine on the same volume; the canary's disk tokens."""
        canary = ("[system 0] You answer questions about cache tiers. " * 40)[: 64 * 18] + " canary"
        pod.call("/generate", {"text": canary, "sampling_params": {"max_new_tokens": 1}})
        self._prestop(pod)
        pod.engine.send_signal(signal.SIGTERM)
        pod.engine.wait(timeout=20)
        if cold:  # the pages are gone (a replaced volume, a wiped node disk): same namespace, nothing in it
            for page in (pod.root / FINGERPRINT).glob("*.bin"):
                page.unlink()
        self._start_engine(pod)
        self._wait_ready(pod)
        meta = pod.call("/generate", {"text": canary, "sampling_params": {"max_new_tokens": 1}})["meta_info"]
        return int(meta["cached_tokens_details"]["storage"])

    def _prestop(self, pod: Pod) -> None:
        """The pod's own preStop script (wait, flush, its record on the volume for the sidecar); raises when the
        flush failed, as the direct call it stands for did."""
        from qwen_hicache import podlifecycle

        env = {**os.environ, "QWEN_HICACHE_POD_HOST": pod.ip, "QWEN_HICACHE_PORT": str(ENGINE_PORT),
               "QWEN_HICACHE_ADMIN_API_KEY": ADMIN_KEY, "QWEN_HICACHE_DRAIN_SECONDS": "10",
               "QWEN_HICACHE_FLUSH_SECONDS": "30", "QWEN_HICACHE_POD_NAME": pod.name,
               "QWEN_HICACHE_POD_UID": f"{pod.name}-{pod.engine.pid}",
               "QWEN_HICACHE_PRESTOP_RECORD": str(pod.root / podlifecycle.PRESTOP_RECORD)}  # fmt: skip
        subprocess.run([sys.executable, "-c", podlifecycle.PRESTOP_SCRIPT], env=env, check=True, timeout=60,
                       stdout=subprocess.DEVNULL)  # fmt: skip

    def rollout(self, rid: str, cold_pods: tuple[str, ...] = (), only: tuple[str, ...] = (),
                pause_on_cold: bool = True) -> None:
        """A rolling restart, highest ordinal first, with status.restart as the operator records it."""
        pods = [p for p in reversed(self.pods) if not only or p.name in only]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rs: dict = {"id": rid, "phase": "Rolling", "pending": [p.name for p in pods], "done": [],
                    "inFlight": [], "results": [], "started": now}
        self._observe(rs)
        for pod in pods:
            t0 = time.monotonic()
            tokens = self.restart(pod, cold=pod.name in cold_pods)
            rs = json.loads(json.dumps(rs))
            rs["pending"].remove(pod.name)
            rs["results"].append({"pod": pod.name, "warm": tokens > 0, "storageTokens": tokens,
                                  "timeToReadySeconds": int(time.monotonic() - t0)})
            if tokens == 0 and pause_on_cold:
                rs = {**rs, "phase": "Paused", "reason": "ColdStart", "message": f"pod {pod.name} came back cold"}
                self._observe(rs)
                return
            rs["done"].append(pod.name)
            self._observe(rs)
        rs = {**rs, "phase": "Complete", "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._observe(rs)

    def _observe(self, rs: dict) -> None:
        from qwen_hicache import metrics
        from qwen_hicache.status_model import Restart

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        typed = Restart.model_validate(rs)  # the reconciler hands the metrics the typed status.restart
        metrics.observe_restart_status(NAMESPACE, SERVER, self.restart_status, typed, now)
        self.restart_status = typed

    def reconciles(self, n: int, errors: int = 0) -> None:
        """Reconciles through the operator's own metrics wrapper; `errors` of them raise."""
        from qwen_hicache import metrics

        for i in range(n):
            with contextlib.suppress(RuntimeError), metrics.track_reconcile(NAMESPACE, SERVER):
                time.sleep(0.002)
                if i < errors:
                    raise RuntimeError("simulated API failure")

    # -- queries --------------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = _get(url)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        url = f"{self.prom_url}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": start, "end": end, "step": step})
        body = _get(url, timeout=30)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def rules(self) -> list[dict]:
        return [r for g in _get(self.prom_url + "/api/v1/rules")["data"]["groups"] for r in g["rules"]]

    def targets_up(self) -> dict[str, str]:
        active = _get(self.prom_url + "/api/v1/targets")["data"]["activeTargets"]
        return {t["scrapeUrl"]: t["health"] for t in active}


def grafana_expr(expr: str, rate_interval: str = "15s", range_: str = "5m") -> str:
    """A dashboard query with Grafana's variables as Grafana would substitute them (all namespaces/servers)."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
            .replace("$namespace", ".*").replace("$server", ".*"))
