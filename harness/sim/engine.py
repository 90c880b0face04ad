"""SIMULATION ONLY: a GPU-free stand-in for ``python3 -m sglang.launch_server``.

    python -m harness.sim.engine <the runtime container's args> [--sim-* options]

It takes the runtime's argv (unknown flags are ignored) and serves the part of SGLang 0.5.23's HTTP
contract the operator uses: ``GET /health`` and ``GET /ready`` (503 while starting or after
SIGTERM), ``GET /metrics`` (the runtime's metric names; labelled counters appear after their first
increment), ``POST /flush_cache?timeout=N`` (admin key when ``--admin-api-key``; deferred until
no request runs and no disk backup is in flight, then clears device and host; 400 on timeout),
``POST /generate`` (byte-level tokens, deterministic text, ``meta_info.cached_tokens_details`` with
``--enable-cache-report``) and ``POST /hicache/storage-backend/clear``. ``GET /sim/info`` is the harness's own window.

Multi-node (``--nnodes N --node-rank K --dist-init-addr HOST:PORT``, harness.sim.group): node 0 serves all of the
above once every node joined; node K holds TP ranks ``[K*tp/N, (K+1)*tp/N)`` on its own disk (only rank 0 creates the
cache directory, as the runtime's ``HiCacheFile``), serves only ``/health``, ``/health_generate`` and ``/ping`` (the
runtime's dummy health server, up only once it joined), ignores SIGTERM and exits when node 0 shuts the group down.
A disk hit is the MIN over every node's ranks.

What is real: the disk tier (``HiCacheFile`` from the pinned, patched wheel: file names, write,
read, discard and prefix-existence code), the page-key chain, the 256-token prefetch threshold, and,
compiled from the tree the stand-in reads (``harness.sim.runtime_code``; parent or patched alike):
the storage-backup controller (``write_storage``, ``backup_queue``, ``backup_thread_func``, one per TP
rank), SIGTERM's graceful release (``UnifiedRadixCache.release_host_resources``: the parent leaves
queued writes to die with the process; patch 0003 runs ``drain_storage_backup`` first, bounded by
``SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT``, default 8 s) and the flush's deferral
(``SchedulerFlushWrapper`` over ``Scheduler.is_fully_idle``: no request running, no storage backup unacked).
What is restated: the controller's and scheduler's attributes those methods read, the ack step.
What is simulated: the model (no weights, output is a hash), device/host pools (LRU sets sized by
``--sim-device-pages``/``--sim-host-pages``; the host pages' bytes derive from the keys), timings
(``--sim-write-delay`` per page backed up), device<->host moves (instantaneous, never in flight).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

COLD_ENV = "QWEN_HICACHE_SIM_COLD"
DEFAULT_PREFETCH_THRESHOLD = 256


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The runtime flags the stand-in honours, plus ``--sim-*`` knobs; everything else is ignored."""
    p = argparse.ArgumentParser(prog="harness.sim.engine", allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--model-path", default="sim-model")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", default=None)
    p.add_argument("--admin-api-key", default=None)
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--hicache-write-policy", default="write_through")
    p.add_argument("--hicache-storage-backend", default=None)
    p.add_argument("--hicache-storage-prefetch-policy", default="timeout")
    p.add_argument("--hicache-storage-backend-extra-config", default=None)
    p.add_argument("--sim-startup-seconds", type=float, default=0.0, help="delay before /ready turns 200")
    p.add_argument("--sim-cold", action="store_true", help="never read the disk tier (a cold start)")
    p.add_argument("--sim-write-delay", type=float, default=0.0, help="seconds per page backed up to disk")
    p.add_argument("--sim-request-seconds", type=float, default=0.0, help="time each /generate takes")
    p.add_argument("--sim-device-pages", type=int, default=4096)
    p.add_argument("--sim-host-pages", type=int, default=16384)
    p.add_argument("--hicache-size", type=float, default=0.0)
    p.add_argument("--sim-allocate-host-pool", action="store_true",
                   help="hold the host pools' memory for real (--hicache-size GB per TP rank, every page touched, as "
                        "pinned pools are): the pod's memory limit then applies to it")
    p.add_argument("--sim-host-mamba-slots", type=int, default=None, help="host Mamba states (default: pages / 4)")
    args, _ = p.parse_known_args(argv)
    args.served_model_name = args.served_model_name or args.model_path
    args.sim_cold = args.sim_cold or os.environ.get(COLD_ENV, "") not in ("", "0")
    extra = json.loads(args.hicache_storage_backend_extra_config or "{}")
    args.prefetch_threshold = int(extra.get("prefetch_threshold", DEFAULT_PREFETCH_THRESHOLD))
    if args.nnodes < 1 or args.tp_size % args.nnodes:
        p.error("tp_size must be divisible by number of nodes")  # the runtime's validation_hook
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}")
    if args.nnodes > 1 and not args.dist_init_addr:
        p.error("--dist-init-addr is required with --nnodes > 1")
    return args


def shape(args: argparse.Namespace) -> dict[str, Any]:
    """What every node of a group must agree on to join it."""
    return {"nnodes": args.nnodes, "tp_size": args.tp_size, "model": args.served_model_name, "page": args.page_size}


def open_disk(args: argparse.Namespace, tree_info: dict) -> Any:
    """This node's ranks of the file tier (the real HiCacheFile of the tree); fills ``tree_info``."""
    from harness.sim import group, sglang_tree, tiers

    tree = os.environ.get(sglang_tree.TREE_ENV) or sglang_tree.patched_sglang_tree()
    tree_info.update({"path": str(tree), **sglang_tree.tree_info(tree)})
    hs = sglang_tree.import_hicache_storage(tree)
    directory = os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR") or "/tmp/hicache"
    ranks = group.node_ranks(args.tp_size, args.nnodes, args.node_rank)
    return tiers.DiskTier(hs, directory, args.served_model_name, args.tp_size, args.page_size, args.sim_write_delay,
                          tree, ranks=ranks)  # fmt: skip


class RemoteDisk:
    """Another node's disk tier, seen from node 0: the calls the group's collectives make (harness.sim.group)."""

    def __init__(self, peer: Any) -> None:
        self.peer = peer

    def restorable(self, keys: list[str]) -> list[int]:
        return self.peer.call("restorable", keys=keys)

    def verify(self, keys: list[str], n: int, good: int = 0) -> tuple[int, bool]:
        verified, ok = self.peer.call("verify", keys=keys, n=n, good=good)
        return verified, ok

    def enqueue(self, keys: list[str]) -> None:
        self.peer.call("backup", keys=keys)

    def pending(self) -> int:
        return self.peer.call("pending")

    def clear(self) -> None:
        self.peer.call("clear")

    def info(self) -> dict:
        return self.peer.call("info")


class Engine:
    """Cache bookkeeping and lifecycle state of one stand-in server (thread-safe)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from harness.sim import tiers

        self.args, self.tiers = args, tiers
        self.state = "starting"
        self.lock = threading.Lock()
        self.running = 0
        self.received = 0  # every /generate that reached this process, refused or not (routing tests count them)
        self.counters: dict[str, int] = {}
        self.device = tiers.LruTier(args.sim_device_pages)
        self.host = tiers.LruTier(args.sim_host_pages if args.enable_hierarchical_cache else 0)
        # SIMULATED host Mamba pool: one state slot per stored prefix end (its last page key), LRU.
        mamba_slots = args.sim_host_mamba_slots if args.sim_host_mamba_slots is not None else args.sim_host_pages // 4
        self.host_mamba = tiers.LruTier(mamba_slots if args.enable_hierarchical_cache else 0)
        self.disk: Any = None
        self.host_pool: bytearray | None = None
        self.tree: dict = {}
        self._flush_lock = threading.Lock()
        self._flush_machinery: tuple[Any, Any] | None = None
        self._flush_replies: list[Any] = []
        self.group: Any = None  # node 0 of a multi-node group: harness.sim.group.Leader
        if args.nnodes > 1:
            from harness.sim import group

            host, port = group.parse_addr(args.dist_init_addr)
            self.group = group.Leader(args.host, port, args.nnodes, shape(args))

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Open the disk tier (the wheel's HiCacheFile sweeps stale .tmp files), then turn ready.

        A startup failure exits the process non-zero, as the runtime's does (the pod then shows it).
        """
        time.sleep(self.args.sim_startup_seconds)
        if self.args.sim_allocate_host_pool and self.args.enable_hierarchical_cache:
            size = int(self.args.hicache_size * 1e9) * self.args.tp_size  # the runtime sizes host pools in 1e9 bytes
            self.host_pool = bytearray(size)
            self.host_pool[:: 4096] = b"\1" * len(range(0, size, 4096))  # resident, as pinned memory is
        try:
            if self.args.hicache_storage_backend == "file":
                self.disk = open_disk(self.args, self.tree)
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        if self.group is not None:
            self.group.wait_formed()  # the schedulers block in the distributed init until every rank joined
        self.state = "ready"

    def drain(self) -> None:
        """SIGTERM: /ready and /health turn 503, running requests finish; then the scheduler's graceful exit, the
        tree's own ``release_host_resources`` on every rank: the parent leaves queued disk writes to die with the
        process, patch 0003 drains them first (``SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT``, default 8 s)."""
        self.state = "stopping"
        while self.running:
            time.sleep(0.01)
        if self.group is not None:
            self.group.shutdown()  # the ShutdownReq broadcast: every node drains its own queue
        if self.disk is not None:
            self.disk.release_host_resources()

    # -- requests -----------------------------------------------------------------------------
    def _count(self, name: str, value: int) -> None:
        if value > 0:
            self.counters[name] = self.counters.get(name, 0) + value

    def generate(self, body: dict) -> dict:
        with self.lock:
            self.running += 1
        try:
            time.sleep(self.args.sim_request_seconds)
            tokens = body.get("input_ids") or list(str(body.get("text", "")).encode())
            with self.lock:
                details = self._match_and_insert(tokens)
            return self._response(tokens, body.get("sampling_params") or {}, details)
        finally:
            with self.lock:
                self.running -= 1

    def _match_and_insert(self, tokens: list[int]) -> dict[str, int]:
        """Device, then host, then disk (only >= prefetch_threshold tokens); then cache the prompt."""
        page = self.args.page_size
        keys = self.tiers.page_keys(tokens, page)
        matchable = keys[: max(len(tokens) - 1, 0) // page]  # one token is always computed
        d = self.device.prefix_hits(matchable)
        h = self.host.prefix_hits(matchable[d:])
        s = 0
        if self.disk is not None and not self.args.sim_cold and matchable[d + h :]:
            min_pages = -(-self.args.prefetch_threshold // page)
            s = self.disk.load(keys[: len(matchable)], d + h + min_pages, self.peers()) - d - h
            s = max(s, 0)
        self._insert(keys)
        details = {"device": d * page, "host": h * page, "storage": s * page}
        for source, n in details.items():
            self._count(f"cached_tokens_total/{source}", n)
        self._count("prompt_tokens_total/false", len(tokens))  # is_streaming="false"
        self._count("num_requests_total/false", 1)
        return details

    def _insert(self, keys: list[str]) -> None:
        evicted = self.device.add(keys)
        self.host.add(keys if self.args.hicache_write_policy != "write_back" else evicted)
        if keys and self.args.hicache_write_policy != "write_back":
            self.host_mamba.add(keys[-1:])
        if self.disk is not None and keys:
            backup = keys if self.args.hicache_write_policy != "write_back" else evicted
            self.disk.enqueue(backup)
            for peer in self.peers():  # every rank backs up its own shard of the same pages
                peer.enqueue(backup)

    def peers(self) -> list[Any]:
        """The group's other nodes, as disk tiers (harness.sim.group's RemoteDisk); none on a single node."""
        return [] if self.group is None else [RemoteDisk(p) for p in self.group.ordered()]

    def pending(self) -> int:
        """Backups not yet acked by every rank of the group (the runtime's ack consensus is a MIN over ranks)."""
        local = self.disk.pending() if self.disk is not None else 0
        return max([local, *(peer.pending() for peer in self.peers())])

    def _response(self, tokens: list[int], sampling: dict, details: dict[str, int]) -> dict:
        n_out = int(sampling.get("max_new_tokens", 16))
        digest = hashlib.sha256(bytes(str(tokens), "ascii")).hexdigest()
        text = (digest * (n_out // 64 + 1))[:n_out]
        meta: dict[str, Any] = {
            "id": digest[:32],
            "prompt_tokens": len(tokens),
            "completion_tokens": n_out,
            "cached_tokens": sum(details.values()),
            "finish_reason": {"type": "length", "length": n_out},
        }
        if self.args.enable_cache_report:
            meta["cached_tokens_details"] = details
        return {"text": text, "meta_info": meta}

    def flush(self, timeout: float) -> tuple[bool, str]:
        """``/flush_cache?timeout=N``: the runtime's deferred flush over its own idle check, then clear device and host.

        With a disk tier, the tree's ``SchedulerFlushWrapper`` and ``Scheduler.is_fully_idle`` decide: a flush
        waits (up to ``timeout``; 0 = now or never) until no request runs and no storage backup is in flight
        (``ongoing_backup``: not yet acked by every rank's backup thread).
        """
        if self.disk is None:
            return self._flush_without_storage(timeout)
        wrapper, request = self._flusher()
        with self._flush_lock:
            reply = wrapper.handle(request(timeout_s=timeout))
        while reply is None:  # deferred: the scheduler loop checks it each iteration
            time.sleep(0.01)
            with self._flush_lock:
                wrapper.check_pending()
                reply = self._flush_replies.pop() if self._flush_replies else None
        if reply.success:
            return True, "Cache flushed.\n"
        if "already in progress" in (reply.message or ""):
            return False, f"Flush cache failed: {reply.message}\n"
        if self.pending():
            return False, "Flush cache failed: the storage backup did not finish in time.\n"
        return False, "Flush cache failed: requests are still running.\n"

    def _flusher(self) -> tuple[Any, Any]:
        """The tree's ``SchedulerFlushWrapper`` on a scheduler whose only state is this engine's, compiled once.

        Simulated: the scheduler object (no waiting queue, no overlap or PD queues; device/host moves are
        instantaneous, so no write-through or load-back is ever in flight); ``flush_cache`` keeps the
        scheduler's own guard (idle or refuse) and clears the LRU tiers instead of the pools.
        """
        if self._flush_machinery is not None:
            return self._flush_machinery
        import enum
        from types import SimpleNamespace

        from harness.sim import runtime_code

        tree, disk, engine = self.tree["path"], self.disk, self
        mode = enum.Enum("DisaggregationMode", "NULL PREFILL DECODE")
        memory = SimpleNamespace(hicache_host_memory_mode="full")
        is_fully_idle = runtime_code.is_fully_idle(tree, {"DisaggregationMode": mode, "get_memory": lambda: memory})

        class TreeCache:
            enable_storage = True
            ongoing_write_through: dict = {}
            ongoing_load_back: dict = {}
            ongoing_prefetch: dict = {}

            @property
            def ongoing_backup(self) -> dict:
                disk.pending()  # the scheduler takes the acks each iteration before it checks
                if not disk.ongoing_backup[0] and engine.pending():
                    return {-1: -1}  # another node's ranks have not acked: the consensus is still waiting
                return disk.ongoing_backup[0]

        scheduler = SimpleNamespace(
            running_batch=SimpleNamespace(is_empty=lambda: self.running == 0, reqs=[]), chunked_req=None,
            dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False), last_batch=None, enable_overlap=False,
            result_queue=[], _pp_microbatches_drained=lambda: True, waiting_queue=[], disaggregation_mode=mode.NULL,
            grammar_manager=SimpleNamespace(grammar_queue=[]), enable_hisparse=False, enable_hierarchical_cache=True,
            tree_cache=TreeCache(), enable_lmcache=False, _engine_paused=False, disagg_decode_prealloc_queue=None,
        )  # fmt: skip

        def flush_cache() -> bool:
            with self.lock:
                if not is_fully_idle(scheduler):
                    return False
                self.device.clear()
                self.host.clear()
                self.host_mamba.clear()
            return True

        wrapper_class, request = runtime_code.flush_wrapper_class(tree)
        wrapper = wrapper_class(
            flush_cache=flush_cache,
            is_fully_idle=lambda: is_fully_idle(scheduler),
            send_output=lambda output, _req: self._flush_replies.append(output),
        )
        self._flush_machinery = (wrapper, request)
        return self._flush_machinery

    def _flush_without_storage(self, timeout: float) -> tuple[bool, str]:
        """No disk tier, so no backup to wait for: wait (up to ``timeout``) until no request runs, then clear."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.lock:
            if self.running:
                return False, "Flush cache failed: requests are still running.\n"
            self.device.clear()
            self.host.clear()
            self.host_mamba.clear()
        return True, "Cache flushed.\n"

    # -- observability ------------------------------------------------------------------------
    def metrics(self) -> str:
        from harness.sim.metrics import render

        if self.disk is not None:
            stats, page = self.disk.stats, self.args.page_size
            self.counters["prefetched_tokens_total"] = stats.prefetched_pages * page
            self.counters["backuped_tokens_total"] = stats.backuped_pages * page
            self.counters["qwen_hicache_sim:corrupt_pages_total"] = self.disk.corrupt_pages
            self.counters.update(self.disk.storage_counters())
        gauges = {"num_running_reqs": self.running}
        if self.args.enable_hierarchical_cache:  # the scheduler declares these only then
            gauges["hicache_host_used_tokens"] = len(self.host.pages) * self.args.page_size
            gauges["hicache_host_total_tokens"] = self.host.capacity * self.args.page_size
            if self.host_mamba.capacity:  # the runtime skips these for models without a host Mamba pool
                gauges["hicache_host_mamba_used_states"] = len(self.host_mamba.pages)
                gauges["hicache_host_mamba_total_states"] = self.host_mamba.capacity
        return render(self.args.served_model_name, self.counters, gauges, self.args.tp_size, self.disk is not None)

    def identity(self, path: str) -> dict:
        """What a router reads to register the worker: the runtime's /v1/models, /model_info, /server_info.

        Field subsets of SGLang 0.5.23's http_server.py answers (ModelList, model_info(), server_info())."""
        a = self.args
        if path == "/v1/models":
            card = {"id": a.served_model_name, "object": "model", "created": 0, "owned_by": "sglang",
                    "root": a.served_model_name, "max_model_len": None}
            return {"object": "list", "data": [card]}
        if path in ("/model_info", "/get_model_info"):
            return {"model_path": a.model_path, "served_model_name": a.served_model_name,
                    "tokenizer_path": a.model_path, "is_generation": True}
        return {"model_path": a.model_path, "served_model_name": a.served_model_name, "tp_size": a.tp_size,
                "page_size": a.page_size, "version": "0.5.23", "frontend": "python",
                "internal_states": [{"num_running_reqs": self.running}]}

    def info(self) -> dict:
        disk = self.disk
        return {
            "state": self.state,
            "running": self.running,
            "received": self.received,
            "device_pages": len(self.device.pages),
            "host_pages": len(self.host.pages),
            "disk_dir": disk.directory if disk else None,
            "disk_files": disk.file_count() if disk else 0,
            "pending_writes": self.pending(),
            "corrupt_pages": disk.corrupt_pages if disk else 0,
            "wrong_bytes_served": disk.stats.wrong_bytes_served if disk else 0,
            "read_errors": disk.stats.read_errors[-5:] if disk else [],
            "cold": self.args.sim_cold,
            "tree": self.tree,
            "pid": os.getpid(),
            "node_rank": 0,
            "nnodes": self.args.nnodes,
            "ranks": disk.ranks if disk else [],
            "read_prefixes": disk.stats.read_prefixes if disk else 0,
            "peers": [peer.info() for peer in self.peers()],
        }


class Handler(BaseHTTPRequestHandler):
    """Routes the runtime's endpoints to the ``Engine`` on ``server.engine``."""

    server: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, status: int, body: str | dict, content_type: str = "text/plain; charset=utf-8") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        if isinstance(body, dict):
            content_type = "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _admin_ok(self) -> bool:
        key = self.server.engine.args.admin_api_key
        if key and self.headers.get("Authorization", "") != f"Bearer {key}":
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        engine, path = self.server.engine, urlparse(self.path).path
        if path in ("/health", "/ready", "/health_generate"):
            ok = engine.state == "ready"
            self._send(200 if ok else 503, "" if ok else f"{engine.state}\n")
        elif path == "/metrics" and engine.args.enable_metrics:  # no route without --enable-metrics
            self._send(200, engine.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/sim/info":
            self._send(200, engine.info())
        elif path in ("/v1/models", "/model_info", "/get_model_info", "/server_info", "/get_server_info"):
            self._send(200, engine.identity(path))
        elif path == "/flush_cache":
            self._flush()
        else:
            self._send(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        path = urlparse(self.path).path
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path == "/generate":
            self._generate(body)
        elif path == "/flush_cache":
            self._flush()
        elif path == "/hicache/storage-backend/clear":
            self._clear_storage()
        else:
            self._send(404, {"error": f"no route {path}"})

    def _clear_storage(self) -> None:
        engine = self.server.engine
        disk = engine.disk
        if self._admin_ok():
            if disk is not None:
                disk.clear()
                for peer in engine.peers():  # a control request reaches every rank
                    peer.clear()
            self._send(200 if disk is not None else 400, {"success": disk is not None})

    def _generate(self, body: bytes) -> None:
        engine = self.server.engine
        with engine.lock:
            engine.received += 1
        if engine.state != "ready":
            self._send(503, {"error": f"server is {engine.state}"})
            return
        try:
            request = json.loads(body or b"{}")
        except json.JSONDecodeError as exc:
            self._send(400, {"error": str(exc)})
            return
        self._send(200, engine.generate(request))

    def _flush(self) -> None:
        if not self._admin_ok():
            return
        query = parse_qs(urlparse(self.path).query)
        ok, message = self.server.engine.flush(float(query.get("timeout", ["0"])[0]))
        self._send(200 if ok else 400, message)


def serve(args: argparse.Namespace) -> int:
    """Bind first (so /health answers 503 while starting), start, serve until SIGTERM/SIGINT."""
    if args.node_rank > 0:
        return serve_worker(args)
    engine = Engine(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.engine = engine  # type: ignore[attr-defined]

    def stop(signum: int, _frame: object) -> None:
        def run() -> None:
            engine.drain()
            server.shutdown()

        threading.Thread(target=run, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=engine.start, name="startup", daemon=True).start()
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    sys.stdout.flush()
    os._exit(0)  # the backup thread dies with its queue, as the runtime drops queued writes


class Worker:
    """Node K > 0 of a group: its ranks' disk tier, answering node 0's collectives (harness.sim.group)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.tree, self.disk = args, {}, None
        self.joined = False

    def handle(self, msg: dict) -> Any:
        disk, op = self.disk, msg["op"]
        if op == "restorable":  # a cold node (QWEN_HICACHE_SIM_COLD) finds nothing, so the group misses
            return [] if disk is None or self.args.sim_cold else disk.restorable(msg["keys"])
        if op == "verify":
            return list(disk.verify(msg["keys"], msg["n"], msg["good"])) if disk is not None else [0, False]
        if op == "backup":
            if disk is not None:
                disk.enqueue(msg["keys"])
            return None
        if op == "pending":
            return disk.pending() if disk is not None else 0
        if op == "clear":
            if disk is not None:
                disk.clear()
            return None
        if op == "info":
            return self.info()
        raise ValueError(f"unknown request {op!r}")

    def info(self) -> dict:
        out = {"node_rank": self.args.node_rank, "joined": self.joined, "cold": self.args.sim_cold, "pid": os.getpid(),
               "ranks": [], "disk_dir": None, "disk_files": 0}  # fmt: skip
        if (disk := self.disk) is not None:
            out.update(ranks=disk.ranks, disk_dir=disk.directory, disk_files=disk.file_count(),
                       pending_writes=disk.pending(), read_prefixes=disk.stats.read_prefixes,
                       backuped_pages=disk.stats.backuped_pages, corrupt_pages=disk.corrupt_pages)  # fmt: skip
        return out


class WorkerHandler(Handler):
    """The runtime's dummy health server on nodes > 0: /health, /health_generate and /ping only."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlparse(self.path).path
        if path in ("/health", "/health_generate", "/ping"):
            self._send(200, "")
        elif path == "/sim/info":
            self._send(200, self.server.worker.info())
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._send(404, {"detail": "Not Found"})


def serve_worker(args: argparse.Namespace) -> int:
    """Node K > 0: open its ranks' disk, join node 0, then serve the dummy health server and node 0's requests
    until node 0 shuts the group down (drain, exit 0) or goes away (exit 1). SIGTERM is ignored, as the runtime's
    non-zero ranks do: only node 0's shutdown or the kubelet's SIGKILL ends them."""
    from harness.sim import group

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = Worker(args)
    time.sleep(args.sim_startup_seconds)
    try:
        if args.hicache_storage_backend == "file":
            worker.disk = open_disk(args, worker.tree)
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    sock, reader = group.join(args.dist_init_addr, {"node_rank": args.node_rank, **shape(args)}, say)
    worker.joined = True
    server = ThreadingHTTPServer((args.host, args.port), WorkerHandler)
    server.daemon_threads = True
    server.worker = worker  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    say(f"node {args.node_rank} joined the group at {args.dist_init_addr} (ranks {worker.info()['ranks']})")
    for line in reader:
        msg = json.loads(line)
        if msg["op"] == "shutdown":
            if worker.disk is not None:
                worker.disk.release_host_resources()  # patch 0003's drain on this node's ranks
            sys.stdout.flush()
            os._exit(0)
        try:
            reply = {"id": msg.get("id"), "result": worker.handle(msg)}
        except Exception as exc:  # noqa: BLE001 - answered, as a rank's failed request
            reply = {"id": msg.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        sock.sendall(json.dumps(reply).encode() + b"\n")
    say("node 0 went away: the TP group is broken; exiting")
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
