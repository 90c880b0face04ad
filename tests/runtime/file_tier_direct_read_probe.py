"""Patch 0012 on one sglang tree's own code, on CPU: a disk hit read straight into the host pools.

    python file_tier_direct_read_probe.py TREE WORKDIR [SCENARIO,...]

Scenarios (each prints what the tree did; the tests decide):

* ``roundtrip``: a hybrid backup (KV pages, each page's QSA index sidecar, the Mamba state on the last page)
  written by the tree's ``HybridCacheController`` backup thread, the host pools then filled with a sentinel and
  read back by the controller's own ``_page_transfer`` into other host pages and another Mamba slot, for each
  layout (page_first, page_first_direct, layer_first) with SGLANG_HICACHE_FILE_DIRECT_READ on and 0: whether every
  page and the state came back exactly, the staging pages lent, and where each ``preadv`` put the payload (inside
  a host pool's memory or elsewhere);
* ``corrupt``: the same read after one page file was damaged (a flipped payload bit, truncated, zero-filled, or
  replaced by another key's page; the KV page, its index sidecar or the Mamba state): the acked prefix, whether
  the pages before it came back, what the host pages of the bad page and the pages after it hold;
* ``safety``: the scheduler side around a read into the pool (storage_hit_probe.py's stand-in for
  ``UnifiedRadixCache``): the prefetch's host pages come from ``allocate_storage_hit`` (free pages, never a live
  node's), a damaged page file ends the acked prefix, and the tail (the bad page included) goes back to the
  host pool through ``_drain_ack_prefetch``'s release (KV only), or the whole hybrid prefetch is discarded by
  ``_check_hybrid_prefetch_result`` with nothing left allocated; a live node's pages are never written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from queue import Queue
from types import SimpleNamespace

import cpu_stub

TREE, WORK = Path(sys.argv[1]), Path(sys.argv[2])
ONLY = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None  # run just these scenarios
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from probe_pools import PAGE, fill_random, kv_file, kv_host, mamba_host, qsa_host, storage  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402

PAGES, BAD = 6, 2  # pages backed up; the damaged one in ``corrupt``
SWITCH = "SGLANG_HICACHE_FILE_DIRECT_READ"
LAYOUTS = ("page_first", "page_first_direct", "layer_first")
SENTINEL = 0xA5
KV, INDEXER, MAMBA = hs.PoolName.KV, hs.PoolName.INDEXER, hs.PoolName.MAMBA


@contextlib.contextmanager
def _switch(value: str | None):
    old = os.environ.get(SWITCH)
    if value is None:
        os.environ.pop(SWITCH, None)
    else:
        os.environ[SWITCH] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = old


def _pool_tensors(pools: dict) -> list[torch.Tensor]:
    mamba, index = pools[MAMBA], pools[INDEXER].kv_buffer  # the index pool's layer_first: one buffer a layer
    return [pools[KV].kv_buffer, *(index if isinstance(index, list) else [index]), mamba.temporal_buffer,
            *mamba.conv_buffer, *getattr(mamba, "slot_state_buffers", [])]  # fmt: skip


def _fill(pools: dict) -> None:
    for t in _pool_tensors(pools):
        t.view(-1).view(torch.uint8).fill_(SENTINEL)


class _Spy:
    """Counts the staging pages the store lends and the preadv calls whose payload lands in host pool memory."""

    def __init__(self, store: hs.HiCacheFile, pools: dict):
        self.ranges = [(t.data_ptr(), t.data_ptr() + t.nbytes) for t in _pool_tensors(pools)]
        self.staging = 0
        self.into_pool = self.elsewhere = 0
        real = getattr(store, "staging_pages", None)
        if real is not None:
            store.staging_pages = lambda pool, n: (setattr(self, "staging", self.staging + n), real(pool, n))[1]

    def _inside(self, buf) -> bool:
        if not isinstance(buf, np.ndarray):
            return False
        start = buf.__array_interface__["data"][0]
        return any(lo <= start and start + buf.nbytes <= hi for lo, hi in self.ranges)

    @contextlib.contextmanager
    def recording(self):
        real = os.preadv

        def preadv(fd, buffers, offset, *a):
            buffers = list(buffers)
            if all(self._inside(buf) for buf in buffers[1:]):  # [header, payload...]
                self.into_pool += 1
            else:
                self.elsewhere += 1
            return real(fd, buffers, offset, *a)

        os.preadv = preadv
        try:
            yield self
        finally:
            os.preadv = real


def _controller(store: hs.HiCacheFile, pools: dict):
    """The tree's HybridCacheController with what its backup thread and prefetch transfer touch."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    ctrl = object.__new__(HybridCacheController)
    ctrl.__dict__.update(
        enable_storage=True, page_size=PAGE, storage_stop_event=threading.Event(), backup_drain_deadline=None,
        backup_queue=Queue(), ack_backup_queue=Queue(), storage_backend=store, storage_backend_type="file",
        storage_host_pool=pools[KV], storage_config=SimpleNamespace(is_storage_writer=True),
        mem_pool_host=SimpleNamespace(layout_lease=contextlib.nullcontext, entry_map={}),
        pp_prefetch_command_thread=None, backup_skip=False, prefetch_sync_queue=Queue(),
    )  # fmt: skip
    ctrl.page_set_func, ctrl.page_get_func = ctrl._generic_page_set, ctrl._generic_page_get
    return ctrl


def _backed_up(work: Path, layout: str) -> dict:
    """PAGES random KV pages (host pages 0..PAGES-1) with their index sidecars and a Mamba state (slot 0),
    backed up by the controller's backup thread as one hybrid operation; what was written, per page."""
    store, kv = storage(work), kv_host(PAGES, layout)
    mamba = mamba_host(layout="page_first" if layout == "layer_first" else layout)  # it takes page-first only
    pools = {KV: kv, INDEXER: qsa_host(kv), MAMBA: mamba}
    for name in (INDEXER, MAMBA):
        store.register_mem_host_pool_v2(pools[name], name)
    for i in range(PAGES):
        fill_random(kv, i * PAGE, seed=i)
        fill_random(pools[INDEXER], i * PAGE, seed=1000 + i)
    fill_random(pools[MAMBA], 0, seed=2000)
    ctrl = _controller(store, pools)
    keys = [f"{i:064x}" for i in range(100, 100 + PAGES)]
    sidecars = [
        hs.PoolTransfer(name=INDEXER, indices_from_pool=KV),
        hs.PoolTransfer(name=MAMBA, keys=keys[-1:], host_indices=torch.tensor([0]),
                        hit_policy=hs.PoolHitPolicy.TRAILING_PAGES),
    ]  # fmt: skip
    ctrl.write_storage(torch.arange(0, PAGES * PAGE, dtype=torch.int64), [], hash_value=keys, extra_pools=sidecars)
    thread = threading.Thread(target=ctrl.backup_thread_func, daemon=True)
    thread.start()
    while ctrl.ack_backup_queue.empty():
        thread.join(0.01)
    ctrl.storage_stop_event.set()
    thread.join()
    written = {
        KV: [kv.get_data_page(i * PAGE, flat=True).clone() for i in range(PAGES)],
        INDEXER: [pools[INDEXER].get_data_page(i * PAGE, flat=True).clone() for i in range(PAGES)],
        MAMBA: [pools[MAMBA].get_data_page(0, flat=True).clone()],
    }
    return {"store": store, "pools": pools, "ctrl": ctrl, "keys": keys, "written": written}


def _page_state(got: torch.Tensor, want: torch.Tensor, other: torch.Tensor | None = None) -> str:
    got = got.view(torch.uint8)
    if torch.equal(got, want.view(torch.uint8)):
        return "exact"
    if bool((got == SENTINEL).all()):
        return "sentinel"
    if other is not None and torch.equal(got, other.view(torch.uint8)):
        return "other_key"
    return "partly_written"


def _read(b: dict, spy: _Spy, tail_freed_at_ack: bool = True) -> dict:
    """The controller's own prefetch transfer into host pages PAGES..2*PAGES-1 and Mamba slot 1; with
    tail_freed_at_ack False, the operation says its controller frees the unfinished tail itself (at termination)."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation

    pools, ctrl, keys, written = b["pools"], b["ctrl"], b["keys"], b["written"]
    _fill(pools)
    operation = PrefetchOperation(CacheRequestHandle("direct", 0), [], pool_transfers=[
        hs.PoolTransfer(name=INDEXER, indices_from_pool=KV),
        hs.PoolTransfer(name=MAMBA, keys=keys[-1:], host_indices=torch.tensor([1]),
                        hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)])  # fmt: skip
    operation.hash_value = keys
    operation.host_indices = torch.arange(PAGES * PAGE, 2 * PAGES * PAGE, dtype=torch.int64)
    operation.ack_releases_incomplete_host_indices = tail_freed_at_ack
    with spy.recording():
        ctrl._page_transfer(operation)
    acks = [ctrl.prefetch_sync_queue.get_nowait() for _ in range(ctrl.prefetch_sync_queue.qsize())]
    at = lambda name, i: pools[name].get_data_page((PAGES + i) * PAGE, flat=True)  # noqa: E731
    return {
        "kv_tokens": max(a.completed_tokens or 0 for a in acks),
        "mamba_states": sum((a.pool_hits or {}).get(MAMBA, 0) for a in acks),
        "kv": [_page_state(at(KV, i), written[KV][i], written[KV][(i + 1) % PAGES]) for i in range(PAGES)],
        "index": [_page_state(at(INDEXER, i), written[INDEXER][i]) for i in range(PAGES)],
        "mamba": _page_state(pools[MAMBA].get_data_page(1, flat=True), written[MAMBA][0]),
        "staging_pages": spy.staging, "preadv_into_pool": spy.into_pool, "preadv_elsewhere": spy.elsewhere,
        "discards": dict(getattr(b["store"], "page_discards", {})),
    }  # fmt: skip


def roundtrip() -> dict:
    out: dict = {"has_spans": {}}
    for switch in ("1", "0"):
        for layout in LAYOUTS:
            b = _backed_up(WORK / f"rt-{switch}-{layout}", layout)
            out.setdefault(layout, {})
            with _switch(switch):
                out[layout][switch] = _read(b, _Spy(b["store"], b["pools"]))
            out["has_spans"][layout] = {str(n): hasattr(p, "flat_page_spans") and p.flat_page_spans(0) is not None
                                        for n, p in b["pools"].items()}  # fmt: skip
    with _switch(None):  # the default: the switch unset
        b = _backed_up(WORK / "rt-default", "page_first")
        out["default"] = _read(b, _Spy(b["store"], b["pools"]))
        b = _backed_up(WORK / "rt-tail-freed-at-termination", "page_first")
        out["tail_freed_at_termination"] = _read(b, _Spy(b["store"], b["pools"]), tail_freed_at_ack=False)
    return out


def _damage(store: hs.HiCacheFile, keys: list[str], target: str, how: str) -> Path:
    key = keys[BAD] if target == "kv" else keys[-1]
    component = {"kv": None, "index": INDEXER, "mamba": MAMBA}[target]
    path = Path(store.file_path) / f"{store._get_component_key(key, component)}.bin"
    data = bytearray(path.read_bytes())
    if how == "bitflip":
        data[-7] ^= 0x10  # in the payload
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "zeroed":
        data = bytearray(len(data))
    elif how == "other_key":  # the next page's file under this key's name (a copy or rename gone wrong)
        other = keys[BAD + 1] if target == "kv" else keys[BAD]
        data = bytearray((Path(store.file_path) / f"{store._get_component_key(other, component)}.bin").read_bytes())
    path.write_bytes(bytes(data))
    return path


CASES = [("kv", how) for how in ("bitflip", "truncated", "zeroed", "other_key")] + [
    ("index", "bitflip"), ("index", "other_key"), ("mamba", "bitflip"), ("mamba", "truncated")]  # fmt: skip


def corrupt() -> dict:
    out: dict = {}
    for switch in ("1", "0"):
        for target, how in CASES:
            b = _backed_up(WORK / f"bad-{switch}-{target}-{how}", "page_first")
            path = _damage(b["store"], b["keys"], target, how)
            with _switch(switch):
                got = _read(b, _Spy(b["store"], b["pools"]))
            out[f"{switch}:{target}:{how}"] = {**got, "file_left": path.exists()}
    return out


def _handle(cache, op) -> tuple[bool, int]:
    info = cache.ongoing_prefetch[op.handle]
    if not cache._check_hybrid_prefetch_result(op.handle, op, op.hash_value, info.host_indices):
        return False, 0  # discarded, and released, by the check
    return True, op.completed_tokens


def safety() -> dict:
    """storage_hit_probe.py's scheduler stand-in: a hit whose page BAD is damaged, read into the pool."""
    cases = {"kv_only": (False, "kv"), "hybrid": (True, "kv"), "hybrid_state": (True, "mamba")}
    return {f"{switch}:{name}": _safety_case(switch, *case) for switch in ("1", "0") for name, case in cases.items()}


def _safety_case(switch: str, hybrid: bool, damaged: str) -> dict:
    """KV page BAD's file damaged (damaged="kv"), or the Mamba state's (damaged="mamba")."""
    import storage_hit_probe as shp
    from sglang.srt.managers.cache_controller import PrefetchAck

    with shp.host_memory_budget_scope(64 << 20):
        kv, mamba = shp.kv_host(), shp.mamba_host()
    group = shp.HostPoolGroup([
        shp.PoolEntry(name=KV, host_pool=kv, device_pool=None, layer_mapper=lambda i: i,
                      is_primary_index_anchor=True),
        shp.PoolEntry(name=MAMBA, host_pool=mamba, device_pool=None, layer_mapper=lambda i: i),
    ])  # fmt: skip
    store = storage(WORK / f"safety-{switch}-{hybrid}")
    store.register_mem_host_pool_v2(kv, KV)
    store.register_mem_host_pool_v2(mamba, MAMBA)
    ctrl = shp.controller(group, store)
    pages = shp.HIT_PAGES
    tokens = list(range(1000, 1000 + pages * PAGE))
    hashes = shp.get_storage_hash_str(tokens, None, page_size=PAGE)
    node_kv, node_state = kv.alloc(pages * PAGE), mamba.alloc(1)
    for i in range(pages):
        fill_random(kv, int(node_kv[i * PAGE]), seed=i)
    fill_random(mamba, int(node_state[0]), seed=99)
    backup = shp.StorageOperation(node_kv, tokens, hash_value=list(hashes), pool_transfers=[
        hs.PoolTransfer(name=MAMBA, host_indices=node_state, keys=[hashes[-1]],
                        hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)] if hybrid else None)  # fmt: skip
    ctrl._page_backup(backup)
    kv.free(node_kv)
    mamba.free(node_state)
    # Another node stays live in the host pool (its pages and its Mamba slot): they must never be written.
    live_kv, live_state = kv.alloc(2 * PAGE), mamba.alloc(1)
    for i in range(2):
        fill_random(kv, int(live_kv[i * PAGE]), seed=500 + i)
    fill_random(mamba, int(live_state[0]), seed=599)
    live_before = [kv.get_data_page(int(live_kv[i * PAGE])).clone() for i in range(2)]
    live_state_before = mamba.get_data_page(int(live_state[0])).clone()
    free_before = (kv.available_size(), mamba.available_size())
    bad = (
        kv_file(store, hashes[BAD])
        if damaged == "kv"
        else (Path(store.file_path) / f"{store._get_component_key(hashes[-1], MAMBA)}.bin")
    )
    data = bytearray(bad.read_bytes())
    data[-7] ^= 0x10
    bad.write_bytes(bytes(data))

    cache = shp._cache_class()()
    handled = []
    cache.__dict__.update(
        cache_controller=ctrl, host_memory_mode="cache", buffer_pipeline=None, page_size=PAGE,
        prefetch_threshold=PAGE, evict_host=lambda *a: 0, storage_prefetch_retries=shp.StoragePrefetchRetries(),
        _prefetch_outcome_stats=shp.defaultdict(int), enable_storage_metrics=False,
        storage_metrics_collector=None, _storage_prefetch_hit_remaining_by_reqid={},
        storage_existence_cache=shp.StorageExistenceCache(), prefetch_loaded_tokens_by_reqid={},
        prefetch_loaded_storage_start_by_reqid={}, ongoing_prefetch={}, dec_host_lock_ref=lambda *a: None,
        components={shp.ComponentType.MAMBA: SimpleNamespace(
            alloc_prefetch_staging=lambda n: mamba.alloc(n), buffer_belief_policy=lambda pool: None)},
        # _handle_prefetch_result: its all-or-nothing check (the tree's own), then the radix insert of
        # host_indices[:completed_tokens] stood in for (the tree itself is not built here).
        _handle_prefetch_result=lambda op: handled.append(_handle(cache, op)),
    )  # fmt: skip
    op = shp.admit_prefetch(cache, ctrl, f"r{hybrid}", tokens, hashes, hybrid)
    request = op.handle
    ctrl.prefetch_buffer.get()
    host = [int(x) for x in op.host_indices[::PAGE]]
    slot = [int(x) for x in op.pool_transfers[0].host_indices] if hybrid else []
    spy = _Spy(store, {KV: kv, INDEXER: SimpleNamespace(kv_buffer=torch.empty(0)), MAMBA: mamba})
    with spy.recording(), _switch(switch):
        ctrl._page_transfer(op)  # the IO thread
    acks = [ctrl.prefetch_sync_queue.get() for _ in range(ctrl.prefetch_sync_queue.qsize())]
    acks.append(PrefetchAck(rid=request.rid, completed_req=True, operation=op))  # prefetch_io_aux_func's last
    bad_host = kv.get_data_page(host[BAD]).clone() if damaged == "kv" else mamba.get_data_page(slot[0]).clone()
    rec = {
        "host_pages_were_free": not set(host) & {int(x) for x in live_kv[::PAGE]},
        "mamba_slot_was_free": not set(slot) & {int(live_state[0])},
        "completed_tokens": max(a.completed_tokens or 0 for a in acks),
        "mamba_pages_read": sum((a.pool_hits or {}).get(MAMBA, 0) for a in acks),
        "preadv_into_pool": spy.into_pool,
        "bad_page_written": not bool((bad_host == 0).all()),  # the pools' pages start zeroed
    }
    for a in acks:  # through the sync thread (one rank: the identity) to _drain_ack_prefetch
        ctrl.ack_prefetch_queue.put(a)
    cache._drain_storage_control_queues_impl(
        n_storage_hit=0, n_ack_prefetch=len(acks), n_backup=0, n_release=None,
        extra_release_counts={MAMBA: None}, log_metrics=False)  # fmt: skip
    rec["usable"], rec["inserted_tokens"] = handled[0] if handled else (None, None)
    rec["host_tokens_still_allocated"] = free_before[0] - kv.available_size()
    rec["mamba_slots_still_allocated"] = free_before[1] - mamba.available_size()
    rec["live_node_intact"] = all(torch.equal(kv.get_data_page(int(live_kv[i * PAGE])), live_before[i])
                                  for i in range(2)) and torch.equal(
        mamba.get_data_page(int(live_state[0])), live_state_before)  # fmt: skip
    return rec


if __name__ == "__main__":
    report = {}
    for fn in (roundtrip, corrupt, safety):
        if ONLY is not None and fn.__name__ not in ONLY:
            continue
        try:
            report[fn.__name__] = fn()
        except Exception:
            report[fn.__name__] = {"error": traceback.format_exc(limit=8)}
    print(json.dumps(report))
