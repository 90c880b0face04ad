"""SIMULATION ONLY: the engine stand-in's cache tiers (device, host, disk) without a GPU.

Device and host tiers are LRU sets of page keys. The disk tier is the real ``HiCacheFile`` from the
pinned (patched) wheel, one instance per TP rank, fed by a background write queue as the runtime's
write-through backup is: ``/flush_cache`` waits for it, SIGTERM drops what is still queued.

Pages are real tensors of a small fixed geometry per pool -- KV, ``.indexer`` (all pages) and
``.mamba`` (only at the last page of each stored prefix, as the hybrid model's trailing-state pool
keeps) -- whose bytes derive from the page key, i.e. from the token ids, so a read that returns
anything else is detected here (the runtime cannot; here it counts as a miss and a metric).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType

import torch

log = logging.getLogger("harness.sim.tiers")

KV, INDEXER, MAMBA = "kv", "indexer", "mamba"
MAMBA_SLOT_BYTES = 256
KV_BYTES_PER_TOKEN = 32
INDEXER_BYTES_PER_TOKEN = 4


def page_keys(token_ids: list[int], page_size: int, prior_hash: str | None = None) -> list[str]:
    """SHA-256 chain over each full page's token ids (uint32 little-endian), seeded by ``prior_hash``.

    The regular (non-bigram, 32-bit) path of sglang's ``cpp_utils/hash_binding.cpp``: the native
    module is JIT-built with g++ and OpenSSL at first use, too slow for a test stand-in.
    """
    prior = bytes.fromhex(prior_hash) if prior_hash else b""
    keys = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        page = token_ids[start : start + page_size]
        prior = hashlib.sha256(prior + struct.pack(f"<{len(page)}I", *page)).digest()
        keys.append(prior.hex())
    return keys


class LruTier:
    """A capacity-bounded LRU set of page keys; ``add`` returns what it evicted."""

    def __init__(self, capacity_pages: int) -> None:
        self.capacity = capacity_pages
        self.pages: OrderedDict[str, None] = OrderedDict()

    def prefix_hits(self, keys: list[str]) -> int:
        n = next((i for i, k in enumerate(keys) if k not in self.pages), len(keys))
        for k in keys[:n]:
            self.pages.move_to_end(k)
        return n

    def add(self, keys: Iterable[str]) -> list[str]:
        for k in keys:
            self.pages[k] = None
            self.pages.move_to_end(k)
        evicted = []
        while len(self.pages) > self.capacity:
            evicted.append(self.pages.popitem(last=False)[0])
        return evicted

    def clear(self) -> None:
        self.pages.clear()


@dataclass
class DiskStats:
    backuped_pages: int = 0
    prefetched_pages: int = 0
    wrong_bytes_served: int = 0
    """Pages the runtime's get() accepted whose bytes are not the ones written (the runtime would use them)."""
    read_errors: list[str] = field(default_factory=list)


class DiskTier:
    """The real HiCacheFile per TP rank, a write-through queue in front of it, verified reads."""

    def __init__(self, hs: ModuleType, directory: str, model: str, tp_size: int, page_size: int,
                 write_delay: float = 0.0) -> None:  # fmt: skip
        self.hs, self.page_size, self.write_delay = hs, page_size, write_delay
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = directory  # the runtime's highest-priority source
        configs = [self._config(model, rank, tp_size) for rank in range(tp_size)]
        self.stores = [hs.HiCacheFile(config, file_path=directory) for config in configs]
        self.directory = self.stores[0].file_path
        self.stats = DiskStats()
        self.queued: set[str] = set()
        self.queue: queue.Queue[tuple[str, bool]] = queue.Queue()
        threading.Thread(target=self._writer, name="hicache-backup", daemon=True).start()

    def _config(self, model: str, rank: int, tp_size: int):
        return self.hs.HiCacheStorageConfig(
            tp_rank=rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
        )  # fmt: skip

    def _nbytes(self, pool: str) -> int:
        per_token = {KV: KV_BYTES_PER_TOKEN, INDEXER: INDEXER_BYTES_PER_TOKEN}
        return MAMBA_SLOT_BYTES if pool == MAMBA else self.page_size * per_token[pool]

    def expected(self, key: str, pool: str, rank: int) -> bytes:
        """The page's content: derived from its key (hence its token ids), pool and rank."""
        return hashlib.shake_256(f"{pool}/{rank}/{key}".encode()).digest(self._nbytes(pool))

    @staticmethod
    def _storage_key(key: str, pool: str) -> str:
        return key if pool == KV else f"{key}.{pool}"

    # -- writes -------------------------------------------------------------------------------
    def enqueue(self, keys: list[str]) -> None:
        """Back up new pages; the last one also carries the prefix's Mamba state."""
        fresh = [k for k in keys if k not in self.queued]
        self.queued.update(fresh)
        for i, key in enumerate(keys):
            if key in fresh or i == len(keys) - 1:
                self.queue.put((key, i == len(keys) - 1))

    def pending(self) -> int:
        return self.queue.unfinished_tasks

    def _writer(self) -> None:
        while True:
            key, with_mamba = self.queue.get()
            try:
                time.sleep(self.write_delay)
                self._write_page(key, with_mamba)
            except Exception as exc:  # a failed backup is a future miss, never a crash
                log.warning("backup of %s failed: %s", key, exc)
            finally:
                self.queue.task_done()

    def _write_page(self, key: str, with_mamba: bool) -> None:
        pools = (KV, INDEXER, MAMBA) if with_mamba else (KV, INDEXER)
        new = not self.stores[0].exists(key)
        for rank, store in enumerate(self.stores):
            for pool in pools:
                data = torch.frombuffer(bytearray(self.expected(key, pool, rank)), dtype=torch.uint8)
                store.set(self._storage_key(key, pool), data)
        self.stats.backuped_pages += int(new)

    @property
    def corrupt_pages(self) -> int:
        """Pages the runtime itself refused and removed (patch 0001's ``page_discards``; 0 on the parent)."""
        return sum(sum(getattr(store, "page_discards", {}).values()) for store in self.stores)

    def wait_drained(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.pending()

    # -- reads --------------------------------------------------------------------------------
    def restorable(self, keys: list[str]) -> list[int]:
        """Prefix lengths (pages) every rank can restore, by the wheel's own batch_exists_v2."""
        hs = self.hs
        transfers = [
            hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-1:], hit_policy=hs.PoolHitPolicy.TRAILING_PAGES),
            hs.PoolTransfer(name=hs.PoolName.INDEXER, keys=keys, hit_policy=hs.PoolHitPolicy.ALL_PAGES),
        ]
        common: set[int] | None = None
        for store in self.stores:
            found = set(store.batch_exists_v2(keys, transfers).restorable_prefix_pages or [])
            common = found if common is None else common & found
        return sorted(common or [])

    def _read_ok(self, key: str, pool: str) -> bool:
        for rank, store in enumerate(self.stores):
            target = torch.empty(self._nbytes(pool), dtype=torch.uint8)
            storage_key = self._storage_key(key, pool)
            try:
                got = store.get(storage_key, target)
            except Exception as exc:  # the unpatched parent raises on a short file
                self.stats.read_errors.append(f"{storage_key}: {exc}")
                got = None
            if got is None:
                self.queued.discard(key)  # the runtime removed it: a later request backs it up again
                return False
            if bytes(target.numpy()) != self.expected(key, pool, rank):
                # The runtime would serve these bytes: so does the stand-in (never kinder), and counts it.
                self.stats.wrong_bytes_served += 1
        return True

    def load(self, keys: list[str], min_pages: int) -> int:
        """Pages of ``keys`` restored from disk (the longest verified restorable prefix), or 0."""
        good = 0  # leading KV+indexer pages verified so far
        for n in reversed(self.restorable(keys)):
            if n < min_pages:
                break
            while good < n and self._read_ok(keys[good], KV) and self._read_ok(keys[good], INDEXER):
                good += 1
            if good >= n and self._read_ok(keys[n - 1], MAMBA):
                self.stats.prefetched_pages += n
                return n
            good = min(good, n)
        return 0

    def clear(self) -> None:
        for store in self.stores:
            store.clear()
        self.queued.clear()

    def file_count(self) -> int:
        return sum(1 for n in os.listdir(self.directory) if n.endswith(".bin"))
