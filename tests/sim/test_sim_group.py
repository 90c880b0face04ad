"""The engine stand-in across nodes (harness.sim.group): a rendezvous at node 0, each node's own ranks on its own
disk, hits MIN-reduced over nodes, node 0 alone serving the API, node 0's shutdown ending the group."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from harness.sim.engine import parse_args
from harness.sim.group import node_ranks

PORT = 5000
PROMPT = "You are a helpful assistant. " * 24  # 720 bytes: 11 full pages of 64, 10 matchable
PAGES = (len(PROMPT) - 1) // 64


def group_args(leader_ip: str, rank: int) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"{leader_ip}:{PORT}"]


def start_group(start_engine, root: Path, *, worker_dir: bool = True, **worker_env: str):
    """Node 0 on `root/n0`, node 1 on `root/n1` (created first unless `worker_dir` is False, as cache-guard does)."""
    (root / "n0").mkdir(parents=True, exist_ok=True)
    if worker_dir:
        (root / "n1").mkdir(parents=True, exist_ok=True)
    ip = start_engine.take_ip()
    leader = start_engine(root / "n0", *group_args(ip, 0), ip=ip, wait=None)
    worker = start_engine(root / "n1", *group_args(ip, 1), wait="/health", **worker_env)
    return leader.wait_ready(), worker


def _status(engine, path: str) -> int | None:
    try:
        return engine.call("GET", path)[0]
    except OSError:
        return None


def bins(directory: Path) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.endswith(".bin")) if directory.exists() else []


def test_node_ranks_follow_the_runtimes_layout() -> None:
    assert [list(node_ranks(8, 2, k)) for k in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(node_ranks(4, 4, 3)) == [3]


def test_a_tp_size_the_nodes_cannot_split_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", "a:1"])
    assert "tp_size must be divisible by number of nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--tp-size", "2", "--nnodes", "2"])


def test_node_0_serves_once_formed_nodes_keep_own_shards_hits_are_min_over_nodes(start_engine, tmp_path: Path) -> None:
    (tmp_path / "n0").mkdir()
    (tmp_path / "n1").mkdir()
    ip = start_engine.take_ip()
    leader = start_engine(tmp_path / "n0", *group_args(ip, 0), ip=ip, wait=None)
    deadline = time.monotonic() + 20
    while _status(leader, "/ready") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # its disk is open by now
    assert leader.proc.poll() is None
    assert _status(leader, "/ready") == 503  # waiting for node 1
    worker = start_engine(tmp_path / "n1", *group_args(ip, 1), wait="/health")
    leader.wait_ready()
    for path in ("/health", "/health_generate", "/ping"):
        assert worker.call("GET", path)[0] == 200
    for method, path in (("GET", "/ready"), ("GET", "/metrics"), ("POST", "/generate"), ("POST", "/flush_cache")):
        assert worker.call(method, path)[0] == 404, path  # no tokenizer, no API on nodes > 0

    assert leader.generate(PROMPT)["cached_tokens"] == 0
    assert leader.flush()[0] == 200  # waits for both nodes' backups
    n0, n1 = bins(tmp_path / "n0"), bins(tmp_path / "n1")
    assert n0 and n1
    assert all(re.search(r"_0_2\.bin$", f) for f in n0), n0[:3]
    assert all(re.search(r"_1_2\.bin$", f) for f in n1), n1[:3]
    assert leader.info()["peers"][0]["ranks"] == [1]

    worker.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.proc.poll() is None  # nodes > 0 ignore SIGTERM
    assert leader.stop(signal.SIGTERM) == 0
    assert worker.proc.wait(timeout=15) == 0  # node 0's shutdown ends the group

    leader, worker = start_group(start_engine, tmp_path)
    assert leader.generate(PROMPT)["cached_tokens_details"]["storage"] == PAGES * 64
    assert worker.info()["read_prefixes"] >= 1  # node 1 read its own shards back
    assert leader.stop() == 0
    assert worker.proc.wait(timeout=15) == 0

    leader, _ = start_group(start_engine, tmp_path, QWEN_HICACHE_SIM_COLD="1")
    assert leader.generate(PROMPT)["cached_tokens_details"]["storage"] == 0  # one cold node: the group misses


def test_a_worker_without_its_directory_is_cold_and_a_lost_node_breaks_the_group(start_engine, tmp_path: Path) -> None:
    """Only tp_rank 0 creates the cache directory: on a node without rank 0 nothing is written unless something
    else (the operator's cache-guard) creates it, and by the MIN over ranks the whole group misses."""
    leader, worker = start_group(start_engine, tmp_path, worker_dir=False)
    leader.generate(PROMPT)
    assert leader.flush()[0] == 200
    assert bins(tmp_path / "n0") and not bins(tmp_path / "n1")
    assert leader.stop() == 0
    assert worker.proc.wait(timeout=15) == 0
    leader, worker = start_group(start_engine, tmp_path, worker_dir=False)
    assert leader.generate(PROMPT)["cached_tokens_details"]["storage"] == 0

    # A formed group takes nobody in (a worker recreated alone, LWS #998, waits forever); a lost node breaks it.
    late = start_engine(tmp_path / "late", *group_args(leader.ip, 1), wait=None)
    time.sleep(1.5)
    assert late.proc.poll() is None
    assert _status(late, "/health") is None  # still waiting to join: its health server is not up
    late.proc.kill()
    worker.proc.kill()
    assert leader.proc.wait(timeout=15) != 0  # its TP group is broken


