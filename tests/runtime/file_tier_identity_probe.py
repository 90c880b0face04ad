"""Patches 0006, 0007 and 0008 on one sglang tree's own code, on CPU: page identity, I/O errors, exported discards,
group commit, early writeback, read staging.

    python file_tier_identity_probe.py TREE WORKDIR [SCENARIO,...]

Scenarios (each prints what the tree did; the tests decide):

* ``copied_page``: a valid page file copied under another key's file name, then that key is read;
* ``io_errors``: a read that fails with EMFILE (real: the open-file limit lowered to what is open), EIO and
  EACCES (injected into the read's ``open``, as root cannot be refused a file), then the same read again;
* ``exported``: the tree's own ``StorageMetricsCollector`` (labels as ``StorageAttachment._resolve_metrics_collector``
  builds them) fed by the tree's own ``UnifiedRadixCache.check_hicache_events`` (compiled from source: the module
  imports the OpenAI protocol models), whose storage backend is a ``HiCacheFile`` that just discarded pages; the
  registry's exposition text, before and after;
* ``group_commit``: the tree's ``HybridCacheController`` backup thread (real class, attributes as
  ``attach_storage_backend`` sets them for the file backend) writing hybrid backup operations (KV pages in
  128-page chunks, the QSA indexer sidecar on every page, the Mamba state on the last page), syncs and acks in
  the order they happen;
* ``readahead``: which page files a batch read asks the kernel for (POSIX_FADV_WILLNEED) before the first read;
* ``writeback`` (0007): which page files a hybrid backup starts writing back (``sync_file_range``) and when, against
  its sync and ack; and the same backup where the call is absent or fails;
* ``staging`` (0008): the buffers a disk hit is read into by the hybrid controller's own prefetch transfer, and the
  dummy pages the host pools make for it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import errno
import json
import logging
import os
import resource
import shutil
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

import torch  # noqa: E402
from probe_pools import PAGE, fill_random, kv_file, kv_host, mamba_host, qsa_host, storage  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402

KEYS = [f"{i:064x}" for i in range(1, 4)]


def _kv_pages(path: Path) -> tuple[hs.HiCacheFile, list[torch.Tensor]]:
    store = storage(path)
    pages = [torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
             for i in range(len(KEYS))]  # fmt: skip
    assert store.batch_set(KEYS, pages)
    return store, pages


def _counters(store: hs.HiCacheFile) -> dict:
    errors = getattr(store, "read_errors", {})
    return {"discards": dict(getattr(store, "page_discards", {})), "read_errors": dict(errors)}


def copied_page() -> dict:
    """KEYS[1]'s file replaced by a copy of KEYS[0]'s (a restore script, a misplaced rsync, a rename)."""
    store, pages = _kv_pages(WORK / "copied")
    shutil.copyfile(kv_file(store, KEYS[0]), kv_file(store, KEYS[1]))
    target = torch.empty(4096, dtype=torch.uint8)
    got = store.get(KEYS[1], target)
    return {
        "hit": got is not None,
        "served_other_keys_bytes": got is not None and torch.equal(target, pages[0]),
        "file_left": kv_file(store, KEYS[1]).exists(),
        "exists_after": store.exists(KEYS[1]),
        "original_still_reads": store.get(KEYS[0], target) is not None and torch.equal(target, pages[0]),
        **_counters(store),
    }


@contextlib.contextmanager
def _lowered_fd_limit():
    """Every new file descriptor fails with EMFILE: the limit is lowered near what is open, and the rest filled."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
    filler = []
    try:
        while True:
            filler.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        assert exc.errno == errno.EMFILE, exc
    try:
        yield
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def _injected(path: Path, code: int):
    """Opening ``path`` (os.open or open) fails with ``code``: a disk or permission error."""
    real_os_open, real_open = os.open, builtins.open

    def guarded(real):
        def opener(p, *args, **kwargs):
            if os.fspath(p) == str(path):
                raise OSError(code, os.strerror(code), str(path))
            return real(p, *args, **kwargs)

        return opener

    os.open, builtins.open = guarded(real_os_open), guarded(real_open)
    try:
        yield
    finally:
        os.open, builtins.open = real_os_open, real_open


def io_errors() -> dict:
    out = {}
    for name in ("EMFILE", "EIO", "EACCES"):
        store, pages = _kv_pages(WORK / f"io-{name}")
        bad = kv_file(store, KEYS[1])
        target = torch.empty(4096, dtype=torch.uint8)
        scope = _lowered_fd_limit() if name == "EMFILE" else _injected(bad, getattr(errno, name))
        try:
            with scope:
                got = store.get(KEYS[1], target)
            result = {"raised": None, "hit": got is not None}
        except Exception as exc:  # the parent: the error escapes and kills the whole prefetch batch
            result = {"raised": type(exc).__name__, "hit": False}
        again = store.get(KEYS[1], target)
        out[name] = {
            **result,
            "file_left": bad.exists(),
            "exists_after": store.exists(KEYS[1]),
            "reads_after_the_error": again is not None and torch.equal(target, pages[1]),
            **_counters(store),
        }
    return out


def _method(path: str, cls: str, name: str, namespace: dict):
    module = ast.parse((TREE / path).read_text())
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.returns = None
    exec(compile(ast.Module([fn], []), str(TREE / path), "exec"), namespace)
    return namespace[name]


def _exposition(prefix: str) -> list[str]:
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    return sorted(line for line in text.splitlines() if line.startswith(prefix) and "_total{" in line)


def exported() -> dict:
    """Discards reach /metrics through the runtime's own per-step path."""
    from sglang.srt.observability import metrics_collector as mc

    labels = {"storage_backend": "file", "tp_rank": 0, "dp_rank": 0, "pp_rank": 0, "pp_size": 1,
              "attn_cp_rank": 0, "attn_cp_size": 1}  # fmt: skip
    collector = mc.StorageMetricsCollector(labels=labels)
    step = _method("sglang/srt/mem_cache/unified_radix_cache.py", "UnifiedRadixCache", "check_hicache_events",
                   {"torch": torch, "StorageMetrics": mc.StorageMetrics})  # fmt: skip
    store, _ = _kv_pages(WORK / "exported")
    nothing = lambda *a, **k: None  # noqa: E731
    cache = SimpleNamespace(
        linker=None, _drain_async_work=nothing, flush_pending_backups=nothing, writing_check=nothing,
        loading_check=nothing, _sync_hicache_ready_counts=lambda: (0, 0, None, []), enable_storage=True,
        buffer_pipeline=None, enable_storage_metrics=True, storage_metrics_collector=collector,
        cache_controller=SimpleNamespace(storage_backend=store), prefetch_outcome_stats_snapshot=dict,
    )  # fmt: skip
    step(cache)
    before = _exposition("sglang:hicache_storage_")
    shutil.copyfile(kv_file(store, KEYS[0]), kv_file(store, KEYS[1]))
    with open(kv_file(store, KEYS[2]), "r+b") as f:  # a flipped byte in the payload
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x40]))
    target = torch.empty(4096, dtype=torch.uint8)
    store.get(KEYS[1], target), store.get(KEYS[2], target)
    with _injected(kv_file(store, KEYS[0]), errno.EIO), contextlib.suppress(OSError):
        store.get(KEYS[0], target)
    step(cache)
    step(cache)  # a later step with nothing new adds nothing
    after = _exposition("sglang:hicache_storage_")
    # A store capped at three pages: writing five makes the runtime's LRU evictor remove some.
    page = 4096 + getattr(getattr(hs, "PAGE_HEADER", None), "size", 0)
    capped = hs.HiCacheFile(hs.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="Qwen/probe",
        extra_config={"max_size": 3 * page}), file_path=str(WORK / "capped"))  # fmt: skip
    for i in range(5):
        capped.set(f"{100 + i:064x}", torch.zeros(4096, dtype=torch.uint8))
    cache.cache_controller.storage_backend = capped
    step(cache)
    return {"before": before, "after": after, "after_eviction": _exposition("sglang:hicache_storage_evicted"),
            "files_left": len(list((WORK / "capped").glob("*.bin"))),
            "writes": _exposition("sglang:hicache_storage_writ"), "page_file_bytes": page}  # fmt: skip


def _controller(store: hs.HiCacheFile, pools: dict):
    """The tree's HybridCacheController with what its backup thread touches (the real __init__ needs a GPU)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    ctrl = object.__new__(HybridCacheController)
    ctrl.__dict__.update(
        enable_storage=True, page_size=PAGE, storage_stop_event=threading.Event(), backup_drain_deadline=None,
        backup_queue=Queue(), ack_backup_queue=Queue(), storage_backend=store, storage_backend_type="file",
        storage_host_pool=pools[hs.PoolName.KV], storage_config=SimpleNamespace(is_storage_writer=True),
        mem_pool_host=SimpleNamespace(layout_lease=contextlib.nullcontext, entry_map={}),
        pp_prefetch_command_thread=None, backup_skip=False, prefetch_sync_queue=Queue(),
    )  # fmt: skip
    ctrl.page_set_func, ctrl.page_get_func = ctrl._generic_page_set, ctrl._generic_page_get
    return ctrl


def _backup(work: Path, ops: tuple[tuple[int, int, int], ...], events: list[str], keep: dict | None = None) -> dict:
    """Hybrid backup operations (first page, pages, Mamba slot) through the tree's backup thread, acks recorded;
    `keep` gets the store, pools, controller and keys for a read back."""
    pages = sum(n for _, n, _ in ops)
    store, kv = storage(work), kv_host(pages)
    pools = {hs.PoolName.KV: kv, hs.PoolName.INDEXER: qsa_host(kv), hs.PoolName.MAMBA: mamba_host()}
    for name in (hs.PoolName.INDEXER, hs.PoolName.MAMBA):
        store.register_mem_host_pool_v2(pools[name], name)
    for i in range(pages):
        fill_random(kv, i * PAGE, seed=i)
    ctrl = _controller(store, pools)
    ack = ctrl.ack_backup_queue.put
    ctrl.ack_backup_queue.put = lambda op: (events.append(f"ack {len(op.hash_value)}"), ack(op))[1]
    keys = [f"{i:064x}" for i in range(100, 100 + pages)]
    for first, n, slot in ops:
        span = keys[first : first + n]
        sidecars = [
            hs.PoolTransfer(name=hs.PoolName.INDEXER, indices_from_pool=hs.PoolName.KV),
            hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=span[-1:], host_indices=torch.tensor([slot]),
                            hit_policy=hs.PoolHitPolicy.TRAILING_PAGES),
        ]  # fmt: skip
        host = torch.arange(first * PAGE, (first + n) * PAGE, dtype=torch.int64)
        ctrl.write_storage(host, [], hash_value=span, extra_pools=sidecars)
    thread = threading.Thread(target=ctrl.backup_thread_func, daemon=True)
    thread.start()
    while sum(e.startswith("ack ") for e in events) < len(ops):
        thread.join(0.01)
    ctrl.storage_stop_event.set()
    thread.join()
    if keep is not None:
        keep.update(store=store, pools=pools, ctrl=ctrl, keys=keys)
    target = kv.get_dummy_flat_data_page()
    last = [keys[first + n - 1] for first, n, _ in ops]
    return {"kv_pages_stored": sum(store.get(k, target) is not None for k in keys),
            "mamba_states_stored": sum(store.exists(f"{k}.{hs.PoolName.MAMBA}") for k in last),
            "files": sorted(f.name for f in work.iterdir()),
            "sizes": sorted(f.stat().st_size for f in work.iterdir())}  # fmt: skip


@contextlib.contextmanager
def _recorded_syncs(events: list[str]):
    real_syncfs, real_sync = getattr(hs, "_syncfs", None), os.sync
    if real_syncfs is not None:
        hs._syncfs = lambda fd: (events.append("sync"), real_syncfs(fd))[1]
    os.sync = lambda: (events.append("sync"), real_sync())[1]
    try:
        yield
    finally:
        if real_syncfs is not None:
            hs._syncfs = real_syncfs
        os.sync = real_sync


def group_commit() -> dict:
    """Two hybrid backup operations (200 and 4 pages) through the backup thread; what is synced when."""
    events: list[str] = []
    with _recorded_syncs(events):
        out = _backup(WORK / "commit", ((0, 200, 0), (200, 4, 1)), events)
    return {"events": events, "kv_pages_stored": out["kv_pages_stored"],
            "mamba_states_stored": out["mamba_states_stored"]}  # fmt: skip


# Patch 0009's size floor for early writeback, lowered here to fall between this probe's small files (QSA index
# sidecars and the Mamba state, under 600 B) and its KV pages (16 KiB), as 128 KiB falls between Flash-Next's.
PROBE_WRITEBACK_MIN_BYTES = 1024


def writeback() -> dict:
    """Patches 0007 and 0009: a 4-page hybrid backup through the backup thread with the tree's sync_file_range call
    recorded (the file it was given, its size then, the flags), the size floor at PROBE_WRITEBACK_MIN_BYTES; then
    the same backup with no sync_file_range (not Linux) and with one that fails."""
    events: list[str] = []
    real = getattr(hs, "_sync_file_range", None)
    floor = getattr(hs, "_EARLY_WRITEBACK_MIN_BYTES", None)
    out: dict = {"has_writeback": real is not None, "min_bytes": floor, "probe_min_bytes": PROBE_WRITEBACK_MIN_BYTES}
    if floor is not None:
        hs._EARLY_WRITEBACK_MIN_BYTES = PROBE_WRITEBACK_MIN_BYTES

    def recorded(fd, offset, length, flags):
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        events.append(f"writeback {name} {os.fstat(fd).st_size} {offset} {length} {flags}")
        return real(fd, offset, length, flags)

    with _recorded_syncs(events):
        if real is not None:
            hs._sync_file_range = recorded
        try:
            out["recorded"] = _backup(WORK / "writeback", ((0, 4, 0),), events)
            out["events"] = list(events)  # the two variants below sync too
            if real is not None:
                for name, fn in (("absent", None), ("failing", lambda *a: -1)):
                    hs._sync_file_range = fn
                    out[name] = _backup(WORK / f"writeback-{name}", ((0, 4, 0),), [])
        finally:
            if real is not None:
                hs._sync_file_range = real
            if floor is not None:
                hs._EARLY_WRITEBACK_MIN_BYTES = floor
    return out


def staging() -> dict:
    """Patch 0008: a 130-page hybrid backup read back twice by the hybrid controller's own ``_page_transfer`` of a
    prefetch operation (KV in batches of 128 and 2, each page's QSA index sidecar, then the Mamba state into another
    slot), the host pools cleared before each read: the buffers the file tier read into, how many dummy pages each
    pool made, and whether the pools hold what was written."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation

    pages, keep = 130, {}
    _backup(WORK / "staging", ((0, pages, 0),), [], keep)
    store, pools, ctrl, keys = keep["store"], keep["pools"], keep["ctrl"], keep["keys"]
    kv, index, mamba = (pools[n] for n in (hs.PoolName.KV, hs.PoolName.INDEXER, hs.PoolName.MAMBA))
    written = [kv.kv_buffer.clone(), index.get_data_page(0, flat=True).clone(), mamba.get_data_page(0, flat=True)]
    made: list[str] = []  # the pool of every dummy page made
    for name, pool in pools.items():
        real = pool.get_dummy_flat_data_page
        pool.get_dummy_flat_data_page = lambda name=name, real=real: (made.append(name), real())[1]
    buffers, get = [], hs.HiCacheFile.get
    store.get = lambda key, target, *a: (buffers.append(target.data_ptr()), get(store, key, target, *a))[1]
    reads = []
    for _ in range(2):
        kv.kv_buffer.zero_()
        index.set_from_flat_data_page(0, torch.zeros_like(written[1]))
        before, made_before = len(buffers), len(made)
        operation = PrefetchOperation(CacheRequestHandle("staging", 0), [], pool_transfers=[
            hs.PoolTransfer(name=hs.PoolName.INDEXER, indices_from_pool=hs.PoolName.KV),
            hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-1:], host_indices=torch.tensor([1]),
                            hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)])  # fmt: skip
        operation.hash_value, operation.host_indices = keys, torch.arange(0, pages * PAGE, dtype=torch.int64)
        ctrl._page_transfer(operation)
        acks = [ctrl.prefetch_sync_queue.get_nowait() for _ in range(ctrl.prefetch_sync_queue.qsize())]
        reads.append({
            "kv_tokens": max(a.completed_tokens or 0 for a in acks),
            "mamba_states": sum((a.pool_hits or {}).get(hs.PoolName.MAMBA, 0) for a in acks),
            "same": [torch.equal(kv.kv_buffer, written[0]), torch.equal(index.get_data_page(0, flat=True), written[1]),
                     torch.equal(mamba.get_data_page(1, flat=True), written[2])],
            "gets": len(buffers) - before, "buffers": len(set(buffers[before:])),
            "dummies": {str(n): made[made_before:].count(n) for n in pools},
        })  # fmt: skip
    return {"reads": reads, "buffers_both_reads": len(set(buffers)), "has_staging": hasattr(store, "staging_pages")}


def readahead() -> dict:
    store, _ = _kv_pages(WORK / "readahead")
    asked: list[str] = []
    real, os_open, names = os.posix_fadvise, os.open, {}

    def opened(path, *a, **k):
        fd = os_open(path, *a, **k)
        names[fd] = Path(path).name
        return fd

    def fadvise(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append(names.get(fd, "?"))
        return real(fd, offset, length, advice)

    os.posix_fadvise, os.open = fadvise, opened
    try:
        targets = [torch.empty(4096, dtype=torch.uint8) for _ in KEYS]
        results = store.batch_get(KEYS, targets)
    finally:
        os.posix_fadvise, os.open = real, os_open
    return {"asked": asked, "files": [kv_file(store, k).name for k in KEYS], "hits": [r is not None for r in results]}


if __name__ == "__main__":
    report = {}
    for fn in (copied_page, io_errors, exported, group_commit, readahead, writeback, staging):
        if ONLY is not None and fn.__name__ not in ONLY:
            continue
        try:
            report[fn.__name__] = fn()
        except Exception:
            report[fn.__name__] = {"error": traceback.format_exc(limit=6)}
    print(json.dumps(report))
