"""SIMULATION ONLY: the engine stand-in's cache tiers (device, host, disk) without a GPU.

Device and host tiers are LRU sets of page keys. The disk tier is the real ``HiCacheFile`` from the
pinned (patched) wheel, one instance per TP rank, fed as the runtime feeds it: by the tree's own
storage-backup code (``harness.sim.runtime_code``), one controller and backup thread per rank.

What is real (the tree's code, parent or patched): ``write_storage``, ``backup_queue`` /
``ack_backup_queue``, ``backup_thread_func`` with ``_page_backup`` (sidecar pools by ``batch_set_v2``,
KV by the file backend's ``_generic_page_set``), and at SIGTERM ``UnifiedRadixCache.release_host_resources``
-> (patch 0003) ``drain_storage_backup`` and ``_stop_storage_threads``. What is restated: the controller's
attributes (``attach_storage_backend``'s for the file backend, no prefetch threads), one storage operation
per page, and the scheduler's ack step (``ongoing_backup`` entries leave once every rank acked, as the
rank-consensus minimum does). What is simulated: the host pools (``PagePayloads``: no tensors kept; after
the release a read never returns, as the process exits right after it) and the write time (``write_delay``).

Pages are real tensors of a small fixed geometry per pool -- KV, ``.indexer`` (all pages) and
``.mamba`` (only at the last page of each stored prefix, as the hybrid model's trailing-state pool
keeps) -- whose bytes derive from the page key, i.e. from the token ids, so a read that returns
anything else is detected here (the runtime cannot; here it counts as a miss and a metric).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

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
    read_prefixes: int = 0
    """Prefixes this node read back whole (its part of a group's hit)."""


class PagePayloads:
    """SIMULATED host pool of one TP rank: the pages the runtime's backup thread reads from host memory.

    The stand-in keeps no host tensors; page ``slot`` of this pool is the derived payload of the key the
    disk tier mapped to that slot (``DiskTier.slots``). ``page_size`` is what the runtime reads off a host
    pool (host indices per page: the token page for KV and indexer, one slot for Mamba); no ``layout``
    attribute, so the page tag names the flat layout, as before.
    """

    def __init__(self, tier: DiskTier, pool: str, rank: int, page_size: int) -> None:
        self.tier, self.pool, self.rank, self.page_size = tier, pool, rank, page_size
        self.released = False

    def get_data_page(self, index: Any, flat: bool = True) -> torch.Tensor:
        if self.released:
            # The graceful exit released the host pools, and the runtime's process exits right after: a backup
            # thread still running (the parent's) writes nothing more, and acks nothing, until the exit takes it.
            threading.Event().wait()
        key = self.tier.slots[int(index) // self.page_size]
        return torch.frombuffer(bytearray(self.tier.expected(key, self.pool, self.rank)), dtype=torch.uint8)


class DiskTier:
    """The real HiCacheFile per TP rank, each fed by the tree's own storage-backup controller; verified reads.

    Per rank (one scheduler process each in the runtime): a ``HybridCacheController`` compiled from the
    tree (``harness.sim.runtime_code``) holding what its backup thread touches -- ``backup_queue``,
    ``ack_backup_queue``, the stop event, the rank's ``HiCacheFile`` as ``storage_backend``, the simulated
    host pools -- and running ``backup_thread_func``. A backed-up page goes in through the runtime's
    ``write_storage`` with the indexer page (indices from KV) and, on a prefix's last page, the Mamba slot
    as sidecar transfers, as ``UnifiedRadixCache.write_backup_storage`` passes them; the thread writes
    them with ``HiCacheFile.batch_set_v2`` and the KV page with ``_generic_page_set`` (the file backend's
    ``page_set_func``), wrapped only to wait ``write_delay`` and count new pages.
    """

    def __init__(self, hs: ModuleType, directory: str, model: str, tp_size: int, page_size: int,
                 write_delay: float = 0.0, tree: str | os.PathLike | None = None,
                 ranks: range | None = None) -> None:  # fmt: skip
        """`ranks`: the TP ranks this node runs (all of them on a single node; harness.sim.group.node_ranks)."""
        from harness.sim import runtime_code

        self.hs, self.page_size, self.write_delay = hs, page_size, write_delay
        self.ranks = list(range(tp_size) if ranks is None else ranks)
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = directory  # the runtime's highest-priority source
        self.configs = [self._config(model, rank, tp_size) for rank in self.ranks]
        self.stores = [hs.HiCacheFile(config, file_path=directory) for config in self.configs]
        self.directory = self.stores[0].file_path  # created by tp_rank 0 only, as the runtime does
        self.stats = DiskStats()
        self.queued: set[str] = set()
        self.tree = Path(tree) if tree is not None else Path(hs.__file__).parents[3]
        code = runtime_code.storage_backup_classes(self.tree)
        self._release = runtime_code.release_host_resources(self.tree)
        self.slots: dict[int, str] = {}  # host page slot -> page key, while its backup is in flight
        self._next_slot = 0
        self.lock = threading.Lock()
        self.pools = [{pool: PagePayloads(self, pool, rank, 1 if pool == MAMBA else page_size)
                       for pool in (KV, INDEXER, MAMBA)} for rank in self.ranks]  # fmt: skip
        self.controllers = [self._controller(code.HybridCacheController, i) for i in range(len(self.ranks))]
        # Per local rank, as UnifiedRadixCache.ongoing_backup: operation id -> host slot, until the backup is acked.
        self.ongoing_backup: list[dict[int, int]] = [{} for _ in self.ranks]

    def _config(self, model: str, rank: int, tp_size: int):
        return self.hs.HiCacheStorageConfig(
            tp_rank=rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
        )  # fmt: skip

    def _controller(self, cls: type, rank: int) -> Any:
        """What ``HiCacheController.attach_storage_backend`` sets up for the file backend, minus the prefetch side.

        ``rank`` indexes this node's ranks (``self.ranks``)."""
        store, pools, hs, store_config = self.stores[rank], self.pools[rank], self.hs, self.configs[rank]
        store.register_mem_host_pool_v2(pools[INDEXER], hs.PoolName.INDEXER)
        store.register_mem_host_pool_v2(pools[MAMBA], hs.PoolName.MAMBA)
        ctrl = object.__new__(cls)  # the real __init__ builds device streams and process groups
        ctrl.__dict__.update(
            enable_storage=True,
            page_size=self.page_size,
            storage_stop_event=threading.Event(),
            backup_drain_deadline=None,  # patch 0003's attribute (unused by the parent's code)
            backup_queue=queue.Queue(),
            ack_backup_queue=queue.Queue(),
            storage_backend=store,
            storage_backend_type="file",
            storage_host_pool=pools[KV],
            storage_config=store_config,
            mem_pool_host=SimpleNamespace(layout_lease=contextlib.nullcontext, entry_map={}),
            pp_prefetch_command_thread=None,
        )
        generic_page_set = ctrl._generic_page_set  # the file backend's page_set_func

        def page_set(hash_values: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> bool:
            time.sleep(self.write_delay * len(hash_values))
            new = sum(not store.exists(k) for k in hash_values) if rank == 0 else 0
            ok = generic_page_set(hash_values, host_indices, extra_info)
            if ok:
                self.stats.backuped_pages += new
            return ok

        ctrl.page_set_func = page_set
        name = f"backup-{self.ranks[rank]}"
        ctrl.backup_thread = threading.Thread(target=ctrl.backup_thread_func, name=name, daemon=True)
        ctrl.backup_thread.start()
        return ctrl

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
        """Back up new pages, one storage operation each; the last one also carries the prefix's Mamba state."""
        hs = self.hs
        self._take_acks()  # a scheduler iteration: acks first, so finished operations do not pile up
        fresh = [k for k in keys if k not in self.queued]
        self.queued.update(fresh)
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if key not in fresh and not last:
                continue
            with self.lock:
                slot, self._next_slot = self._next_slot, self._next_slot + 1
                self.slots[slot] = key
            host_indices = torch.arange(slot * self.page_size, (slot + 1) * self.page_size, dtype=torch.int64)
            for rank, ctrl in enumerate(self.controllers):
                sidecars = [hs.PoolTransfer(name=hs.PoolName.INDEXER, indices_from_pool=hs.PoolName.KV)]
                if last:
                    mamba = torch.tensor([slot], dtype=torch.int64)
                    policy = hs.PoolHitPolicy.TRAILING_PAGES
                    sidecars.append(
                        hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=[key], host_indices=mamba, hit_policy=policy)
                    )
                with self.lock:
                    op_id = ctrl.write_storage(host_indices, [], hash_value=[key], extra_pools=sidecars)
                    self.ongoing_backup[rank][op_id] = slot

    def _take_acks(self) -> None:
        """The scheduler's ack step: backups acked on every rank leave ``ongoing_backup`` (rank consensus: min)."""
        with self.lock:
            n = min(ctrl.ack_backup_queue.qsize() for ctrl in self.controllers)
            for rank, ctrl in enumerate(self.controllers):
                for _ in range(n):
                    slot = self.ongoing_backup[rank].pop(ctrl.ack_backup_queue.get_nowait().id, None)
                    if rank == len(self.controllers) - 1 and slot is not None:
                        self.slots.pop(slot, None)

    def pending(self) -> int:
        """Page backups not yet acked by every rank (what the runtime's idle check counts)."""
        self._take_acks()
        return len(self.ongoing_backup[0])

    def release_host_resources(self) -> None:
        """The graceful exit, on every rank at once: the tree's ``UnifiedRadixCache.release_host_resources``.

        The parent's releases the host pools and leaves its backup thread running, so what is still queued
        dies with the process; patch 0003's first runs ``drain_storage_backup`` (bounded by
        ``SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT``, default 8 s).
        """

        def release(rank: int) -> None:
            pools = self.pools[rank].values()
            group = SimpleNamespace(destroy=lambda: [setattr(p, "released", True) for p in pools])
            cache = SimpleNamespace(cache_controller=self.controllers[rank], linker=None, host_pool_group=group)
            try:
                self._release(cache)
            except Exception:  # as the scheduler's finally: logged, the process exits anyway
                log.exception("release_host_resources of rank %d failed", rank)

        threads = [threading.Thread(target=release, args=(rank,)) for rank in range(len(self.controllers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    @property
    def corrupt_pages(self) -> int:
        """Pages the runtime itself refused and removed (patch 0001's ``page_discards``; 0 on the parent)."""
        return sum(sum(getattr(store, "page_discards", {}).values()) for store in self.stores)

    def storage_counters(self) -> dict[str, int]:
        """Rank 0's integrity and eviction counts as patch 0006 exports them (keys for ``metrics.render``).

        Only what the tree's HiCacheFile counts (nothing on the parent); rank 0 stands for every rank, as the
        token counters do.
        """
        store = self.stores[0]
        out = {f"hicache_storage_page_discards_total/{k}": v for k, v in getattr(store, "page_discards", {}).items()}
        out |= {f"hicache_storage_read_errors_total/{k}": v for k, v in getattr(store, "read_errors", {}).items()}
        if hasattr(store, "evicted_pages"):
            out["hicache_storage_evicted_pages_total"] = store.evicted_pages
        if hasattr(store, "written_bytes"):  # the commits' bytes and wall time: the tier's write rate
            out["hicache_storage_written_bytes_total"] = store.written_bytes
            out["hicache_storage_write_seconds_total"] = store.write_seconds
        return out

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
        for rank, store in zip(self.ranks, self.stores, strict=True):
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

    def verify(self, keys: list[str], n: int, good: int = 0) -> tuple[int, bool]:
        """Read back this node's shards of the first ``n`` pages (KV and indexer from page ``good`` on, already
        verified before it) and the Mamba state at page ``n - 1``: (pages verified, whole prefix read)."""
        while good < n and self._read_ok(keys[good], KV) and self._read_ok(keys[good], INDEXER):
            good += 1
        ok = good >= n and self._read_ok(keys[n - 1], MAMBA)
        self.stats.read_prefixes += int(ok)
        return good, ok

    def load(self, keys: list[str], min_pages: int, peers: Sequence[Any] = ()) -> int:
        """Pages of ``keys`` restored from disk (the longest prefix every rank verified), or 0.

        ``peers``: the group's other nodes (``restorable``/``verify`` over their own ranks): the hit is the MIN over
        all ranks, as the runtime's rank-reduced hit query and prefetch completion, so one cold node is a miss."""
        nodes = [self, *peers]
        common = set(self.restorable(keys))
        for peer in peers:
            common &= set(peer.restorable(keys))
        good = [0] * len(nodes)  # per node, leading KV+indexer pages verified so far
        for n in sorted(common, reverse=True):
            if n < min_pages:
                break
            results = [node.verify(keys, n, g) for node, g in zip(nodes, good, strict=True)]
            if all(ok for _, ok in results):
                self.stats.prefetched_pages += n
                return n
            good = [min(g, n) for g, _ in results]
        return 0

    def clear(self) -> None:
        for store in self.stores:
            store.clear()
        self.queued.clear()

    def file_count(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.directory) if n.endswith(".bin"))
        except FileNotFoundError:  # a node whose ranks exclude 0 never creates the directory
            return 0
