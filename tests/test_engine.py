"""The operator's HTTP client for the runtime, against a loopback server speaking the runtime's contract."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from qwen_hicache.engine import (
    WRITE_SECONDS,
    WRITTEN_BYTES,
    cache_metrics,
    generate,
    read_usage,
    router_workers,
    write_rate,
)

METRICS = """# HELP sglang:cached_tokens_total x
sglang:cached_tokens_total{model_name="m",cache_source="storage"} 4032.0
sglang:cached_tokens_total{model_name="m",cache_source="device"} 64.0
sglang:prefetched_tokens_total{model_name="m"} 4032.0
"""


class _Runtime(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._send(METRICS.encode())

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["sampling_params"]["max_new_tokens"] == 1
        meta = {"prompt_tokens": len(body["text"]), "cached_tokens_details": {"device": 0, "host": 0, "storage": 4032}}
        self._send(json.dumps({"text": "x", "meta_info": meta}).encode())

    def _send(self, data: bytes) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_generate_and_metrics_read_the_storage_evidence() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = generate("127.0.0.1", server.server_port, "hello " * 100)
        assert (res.prompt_tokens, res.storage_tokens, res.error) == (600, 4032, None)
        m = cache_metrics("127.0.0.1", server.server_port)
        assert m["sglang:cached_tokens_total{storage}"] == 4032 and m["sglang:cached_tokens_total{device}"] == 64
        assert m["sglang:prefetched_tokens_total"] == 4032
    finally:
        server.shutdown()


def test_an_unreachable_pod_is_an_error_not_an_exception() -> None:
    res = generate("127.0.0.1", 1, "x", timeout=2)
    assert res.storage_tokens is None and res.error
    assert cache_metrics("127.0.0.1", 1, timeout=2) == {}


def _rank(name: str, rank: int, value: float) -> str:
    """One series as the runtime's StorageMetricsCollector labels it (tests/observability checks the names)."""
    labels = (f'storage_backend="file",tp_rank="{rank}",dp_rank="0",pp_rank="0",pp_size="1",attn_cp_rank="0",'
              'attn_cp_size="1"')
    return f"sglang:hicache_storage_{name}{{{labels}}} {value}"


def test_the_disk_write_rate_is_the_pods_every_rank_bytes_over_the_longest_ranks_commit_time() -> None:
    """Unlike the token counters (rank 0 stands for all), each rank writes its own shard to the pod's volume."""
    text = "\n".join([_rank("written_bytes_total", 0, 2.0e9), _rank("written_bytes_total", 1, 2.0e9),
                      _rank("write_seconds_total", 0, 8.0), _rank("write_seconds_total", 1, 10.0)])  # fmt: skip

    class Metrics(_Runtime):
        def do_GET(self) -> None:  # noqa: N802
            self._send(text.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        m = cache_metrics("127.0.0.1", server.server_port)
    finally:
        server.shutdown()
    assert (m[WRITTEN_BYTES], m[WRITE_SECONDS]) == (4.0e9, 10.0)
    assert write_rate(m) == (4_000_000_000, 10.0)
    assert write_rate({}) is None and write_rate({WRITTEN_BYTES: 0.0, WRITE_SECONDS: 0.0}) is None


def _serve(path_bodies: dict[str, str]) -> ThreadingHTTPServer:
    class Pod(_Runtime):
        def do_GET(self) -> None:  # noqa: N802
            self._send(path_bodies[self.path].encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_router_workers_and_disk_usage_come_through_the_same_client() -> None:
    workers = {"workers": [{"labels": {"smg.ai/discovery-id": "chat-0"}, "status": "ready", "is_healthy": True},
                           {"url": "http://10.0.0.2:30000", "status": "draining"}]}
    usage = ('# TYPE qwen_hicache_disk_used_bytes gauge\nqwen_hicache_disk_used_bytes{tp_rank="0"} 600.0\n'
             'qwen_hicache_disk_used_bytes{tp_rank="1"} 400.0\n'
             'qwen_hicache_disk_cap_bytes{tp_rank="0"} 1000.0\nqwen_hicache_disk_cap_bytes{tp_rank="1"} 1000.0\n'
             'qwen_hicache_cache_namespace_info{fingerprint="v1-abc"} 1.0\n')
    server = _serve({"/workers": json.dumps(workers), "/metrics": usage})
    try:
        assert router_workers("127.0.0.1", server.server_port) == {"chat-0": "ready",
                                                                    "http://10.0.0.2:30000": "draining"}
        u = read_usage("127.0.0.1", server.server_port)
    finally:
        server.shutdown()
    assert u is not None and (u.used_bytes, u.cap_bytes, u.used_ratio, u.fingerprint) == (1000, 2000, 0.5, "v1-abc")
    assert router_workers("127.0.0.1", 1, timeout=2) is None and read_usage("127.0.0.1", 1, timeout=2) is None


def test_text_that_is_not_prometheus_is_no_answer() -> None:
    server = _serve({"/metrics": "this is { not metrics\n"})
    try:
        assert read_usage("127.0.0.1", server.server_port) is None
        assert cache_metrics("127.0.0.1", server.server_port) == {}
    finally:
        server.shutdown()
