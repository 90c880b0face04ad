"""SIMULATION ONLY: the engine stand-in's multi-node group (``--nnodes N --node-rank K --dist-init-addr H:P``).

What it plays of SGLang 0.5.23 across nodes (no NCCL, no torch.distributed here):

- **Rendezvous.** Node 0 listens at ``--dist-init-addr`` (on its own address); every other node connects, names its
  rank and the group's shape, and is welcomed or refused. Node 0 turns ready only once all ``N - 1`` peers have
  joined. A group, once formed, takes nobody in: a node that comes back alone (a worker recreated without its
  group, LWS issue #998) waits to join forever and never turns ready, as a rank joining a finished rendezvous
  does.
- **Collectives.** Node 0 asks every peer what its own ranks hold (the hit query, MIN-reduced over ranks as the
  runtime's ``_sync_prefetch_hit_query``), has each read back its shard of a hit, and hands each the pages to back
  up, so every node writes only its own ranks' files on its own volume.
- **Failure.** A peer's connection dropping breaks the group: node 0 exits non-zero (its scheduler's next
  collective fails), and a worker whose node 0 went away exits non-zero too, so LeaderWorkerSet's
  ``RecreateGroupOnPodRestart`` sees it, as it sees NCCL failures. Shutdown is node 0's broadcast: each peer drains
  its own backup queue and exits 0.

The wire is one JSON object per line over TCP: a worker's ``join``, node 0's ``welcome``/``refused``; then node 0's
requests ``{"id", "op", ...}`` answered by ``{"id", "result"}`` (``error`` when a request failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

CALL_TIMEOUT_S = 60.0
RETRY_S = 0.5


class PeerLost(RuntimeError):
    """A node of the group went away (its connection closed or it stopped answering)."""


def node_ranks(tp_size: int, nnodes: int, node_rank: int) -> range:
    """The TP ranks node ``node_rank`` holds: ``[k*tp/n, (k+1)*tp/n)``, as ``Engine._calculate_rank_ranges``."""
    per_node = tp_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr {addr!r} is not HOST:PORT")
    return host, int(port)


def _send(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


class Peer:
    """Node 0's side of one worker's connection: requests out, replies matched by id by a reader thread."""

    def __init__(self, node_rank: int, sock: socket.socket, reader: Any, on_lost: Callable[[Peer], None]) -> None:
        self.node_rank, self.sock, self.reader = node_rank, sock, reader
        self._on_lost, self._lock, self._next = on_lost, threading.Lock(), 0
        self._waiting: dict[int, Future] = {}
        self.lost = False
        threading.Thread(target=self._read, name=f"peer-{node_rank}", daemon=True).start()

    def _read(self) -> None:
        for line in self.reader:
            msg = json.loads(line)
            future = self._waiting.pop(msg.get("id"), None)
            if future is not None:
                future.set_result(msg)
        self.lost = True
        for future in list(self._waiting.values()):
            future.set_exception(PeerLost(f"node {self.node_rank} went away"))
        self._waiting.clear()
        self._on_lost(self)

    def call(self, op: str, **args: Any) -> Any:
        """One request; its result, or PeerLost / RuntimeError (the peer's own error)."""
        if self.lost:
            raise PeerLost(f"node {self.node_rank} went away")
        future: Future = Future()
        with self._lock:
            self._next += 1
            self._waiting[self._next] = future
            try:
                _send(self.sock, {"id": self._next, "op": op, **args})
            except OSError as exc:
                raise PeerLost(f"node {self.node_rank}: {exc}") from None
        try:
            reply = future.result(timeout=CALL_TIMEOUT_S)
        except TimeoutError:
            raise PeerLost(f"node {self.node_rank} did not answer {op} in {CALL_TIMEOUT_S:.0f}s") from None
        if "error" in reply:
            raise RuntimeError(f"node {self.node_rank}: {op} failed: {reply['error']}")
        return reply.get("result")

    def tell(self, op: str, **args: Any) -> None:
        """A request that wants no answer (shutdown)."""
        with contextlib.suppress(OSError):
            _send(self.sock, {"op": op, **args})


class Leader:
    """Node 0: the rendezvous server, then the peers' proxies."""

    def __init__(self, host: str, port: int, nnodes: int, shape: dict[str, Any]) -> None:
        self.nnodes, self.shape = nnodes, shape
        self.peers: dict[int, Peer] = {}
        self.formed = threading.Event()
        self.closing = False
        self._lock = threading.Lock()
        self._server = socket.create_server((host, port), reuse_port=False)
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(sock,), daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        reader = sock.makefile("r")
        try:
            msg = json.loads(reader.readline() or "{}")
        except (OSError, ValueError):
            sock.close()
            return
        with self._lock:
            reason = self._refusal(msg)
            if reason is None:
                rank = int(msg["node_rank"])
                self.peers[rank] = Peer(rank, sock, reader, self._lost)
                if len(self.peers) == self.nnodes - 1:
                    self.formed.set()
        if reason is not None:
            with contextlib.suppress(OSError):
                _send(sock, {"op": "refused", "reason": reason})
            sock.close()
            return
        with contextlib.suppress(OSError):
            _send(sock, {"op": "welcome"})

    def _refusal(self, msg: dict) -> str | None:
        if msg.get("op") != "join":
            return "not a join"
        if self.formed.is_set():
            return "the group is already formed"
        for key, value in self.shape.items():
            if msg.get(key) != value:
                return f"{key} {msg.get(key)!r} differs from node 0's {value!r}"
        rank = msg.get("node_rank")
        if not isinstance(rank, int) or not 0 < rank < self.nnodes:
            return f"node rank {rank!r} is not in 1..{self.nnodes - 1}"
        if rank in self.peers:
            return f"node rank {rank} has already joined"
        return None

    def _lost(self, peer: Peer) -> None:
        if self.closing:
            return
        print(f"node {peer.node_rank} left the group: the TP group is broken; exiting", file=sys.stderr, flush=True)
        os._exit(1)

    def wait_formed(self) -> None:
        self.formed.wait()

    def ordered(self) -> list[Peer]:
        return [self.peers[k] for k in sorted(self.peers)]

    def shutdown(self) -> None:
        """The ShutdownReq broadcast: every peer drains and exits; node 0 does not wait for them."""
        self.closing = True
        for peer in self.ordered():
            peer.tell("shutdown")
        with contextlib.suppress(OSError):
            self._server.close()


def join(addr: str, hello: dict[str, Any], log_line: Callable[[str], None]) -> tuple[socket.socket, Any]:
    """A worker's side of the rendezvous: retry until node 0 welcomes it (forever, as a rank waits to join)."""
    host, port = parse_addr(addr)
    said: str | None = None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            sock.settimeout(None)
            reader = sock.makefile("r")
            _send(sock, {"op": "join", **hello})
            answer = json.loads(reader.readline() or "{}")
            if answer.get("op") == "welcome":
                return sock, reader
            reason = answer.get("reason", "connection closed")
            sock.close()
        except (OSError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason != said:
            log_line(f"waiting to join the group at {addr}: {reason}")
            said = reason
        time.sleep(RETRY_S)
