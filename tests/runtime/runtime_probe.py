"""Exercise one SGLang tree's HiCache file tier on CPU and print the outcomes as JSON.

Run as ``python runtime_probe.py TREE WORKDIR``; the tests run it once against the
pinned parent and once against the patched tree, in separate interpreters so the
two ``sglang`` packages never share a process. On CPU ``is_cuda()`` is false, so
the host pools never import ``sgl_kernel``. One stub: ``torchvision`` (cpu_stub.py).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import cpu_stub

TREE, WORK = Path(sys.argv[1]), Path(sys.argv[2])
ONLY = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None  # run just these scenarios


cpu_stub.install()
sys.path.insert(0, str(TREE))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository, for harness.sim.runtime_code
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from probe_pools import (  # noqa: E402
    PAGE,
    MHATokenToKVPoolHost,
    fill_random,
    kv_file,
    kv_host,
    mamba_host,
    qsa_host,
    storage,
    transfer,
)
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402

from harness.sim import runtime_code  # noqa: E402

KEYS = [f"{i:064x}" for i in range(1, 4)]


def with_bad_middle_page(damage: Callable[[Path], None]) -> dict:
    """Write three KV pages, damage the middle file, then fetch the batch."""
    path = WORK / damage.__name__
    store, pool = storage(path), kv_host()
    store.register_mem_host_pool_v2(pool, hs.PoolName.KV)
    for i in range(3):
        fill_random(pool, i * PAGE, seed=i)
    store.batch_set_v2([transfer(hs.PoolName.KV, pool, KEYS, 0)])
    bad = kv_file(store, KEYS[1])
    out: dict = {"exists_before": store.exists(KEYS[1])}
    damage(bad)
    try:
        out["results"] = store.batch_get_v2([transfer(hs.PoolName.KV, pool, KEYS, 0)])[hs.PoolName.KV]
        out["raised"] = None
    except Exception as exc:  # the bug: one bad file kills the whole prefetch batch
        out["raised"] = type(exc).__name__
    out["bad_path_left"] = os.path.lexists(bad)
    out["exists_after"] = store.exists(KEYS[1])
    out["discards"] = dict(getattr(store, "page_discards", {}))
    storage(path)  # a restart: the owning rank sweeps what was moved aside
    out["left_after_restart"] = sorted(n for n in os.listdir(path) if not n.endswith(".bin"))
    return out


def truncated(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def short(path: Path) -> None:
    os.truncate(path, 0)  # what a power loss after an un-fsynced rename leaves


def oversized(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 128)


def unreadable(path: Path) -> None:
    path.unlink()
    path.mkdir()  # open() fails with an OSError other than FileNotFoundError, even as root


def vanished(path: Path) -> None:
    path.unlink()


def _rewrite(path: Path, edit: Callable[[bytearray], None]) -> None:
    data = bytearray(path.read_bytes())
    edit(data)
    path.write_bytes(bytes(data))


def zeroed(path: Path) -> None:
    """Right size, all zeros: what a crash between rename and writeback can leave."""
    path.write_bytes(bytes(path.stat().st_size))


def zeroed_tail(path: Path) -> None:
    size = path.stat().st_size
    _rewrite(path, lambda d: d.__setitem__(slice(size * 3 // 4, size), bytes(size - size * 3 // 4)))


def sparse_hole(path: Path) -> None:
    """Same size, a hole (reads as zeros) over the middle of the file."""
    data, size = path.read_bytes(), path.stat().st_size
    path.unlink()
    with open(path, "wb") as f:
        f.write(data[: size // 4])
        f.seek(size // 2)
        f.write(data[size // 2 :])


def bit_flip(path: Path) -> None:
    size = path.stat().st_size
    _rewrite(path, lambda d: d.__setitem__(size // 2, d[size // 2] ^ 0x10))


def old_format(path: Path) -> None:
    """The raw page bytes without a header, as the parent writes them."""
    header = getattr(getattr(hs, "PAGE_HEADER", None), "size", 0)
    _rewrite(path, lambda d: d.__delitem__(slice(0, header)))


def foreign_tag(path: Path) -> None:
    """A valid page of another pool/dtype/layout: header and checksum consistent, the tag not this pool's."""
    fmt = getattr(hs, "PAGE_HEADER", None)
    if fmt is None:
        return  # the parent has no header: nothing to forge
    data = bytearray(path.read_bytes())
    fields = list(fmt.unpack(data[: fmt.size]))
    tag = hs._page_tag("kv", "float8_e4m3fn", "page_first")
    payload = bytes(data[fmt.size :])
    if hasattr(hs, "_page_checksum"):  # format 2 (patch 0006): the checksum binds the file's key too
        fields[-3:] = [*reversed(hs._page_checksum(tag, path.name.removesuffix(".bin"), payload)), tag]
    else:
        import xxhash

        check = xxhash.xxh3_64(tag)
        check.update(payload)
        fields[-2:] = [check.intdigest(), tag]
    data[: fmt.size] = fmt.pack(*fields)
    path.write_bytes(bytes(data))


def crash_leftovers() -> dict:
    path = WORK / "leftovers"
    path.mkdir(parents=True)
    for name in (".0123abcd.tmp", ".feedface.tmp"):
        (path / name).write_bytes(b"half a page")
    (path / ".c0ffee.tmp").mkdir()  # a quarantined directory (a bad page that was a directory)
    (path / ".c0ffee.tmp" / "x").write_bytes(b"x")
    (path / "keep.bin").write_bytes(b"x")
    storage(path)
    return {"left": sorted(os.listdir(path))}


def durability() -> dict:
    """Count per-file fsyncs and filesystem syncs while one page, then a batch of three pages, is written."""
    calls: list[str] = []
    real_fsync, real_sync, real_syncfs = os.fsync, os.sync, getattr(hs, "_syncfs", None)
    os.fsync = lambda fd: (calls.append("fsync"), real_fsync(fd))[1]
    os.sync = lambda: (calls.append("sync"), real_sync())[1]
    if real_syncfs is not None:
        hs._syncfs = lambda fd: (calls.append("sync"), real_syncfs(fd))[1]
    out = {}
    try:
        store = storage(WORK / "durable")
        store.set(KEYS[0], torch.arange(256, dtype=torch.uint8))
        out["one_page"] = {"fsyncs": calls.count("fsync"), "syncs": calls.count("sync")}
        calls.clear()
        store.batch_set([f"{i:064x}" for i in range(20, 23)], [torch.arange(256, dtype=torch.uint8)] * 3)
        out["batch_of_3"] = {"fsyncs": calls.count("fsync"), "syncs": calls.count("sync")}
        calls.clear()
        store.batch_set([f"{i:064x}" for i in range(20, 23)], [torch.arange(256, dtype=torch.uint8)] * 3)
        out["batch_already_stored"] = {"fsyncs": calls.count("fsync"), "syncs": calls.count("sync")}
    finally:
        os.fsync, os.sync = real_fsync, real_sync
        if real_syncfs is not None:
            hs._syncfs = real_syncfs
    return out


def restart_round_trip() -> dict:
    """Write KV, Mamba (with PLE side state) and QSA indexer pages, restart, read back."""
    path = WORK / "restart"
    written, read = {}, {}
    for phase in ("write", "read"):
        store, kv = storage(path), kv_host()
        pools = {hs.PoolName.KV: kv, hs.PoolName.MAMBA: mamba_host(), hs.PoolName.INDEXER: qsa_host(kv)}
        for name, pool in pools.items():
            store.register_mem_host_pool_v2(pool, name)
        keys = KEYS[:2]
        transfers = [transfer(name, pool, keys, 1) for name, pool in pools.items()]
        if phase == "write":
            for name, pool in pools.items():
                step = getattr(pool, "page_size", 1) or 1
                written[name] = [fill_random(pool, (1 + i) * step, seed=hash((name, i)) % 1000) for i in range(2)]
            store.batch_set_v2(transfers)
            continue
        exists = store.batch_exists_v2(keys, [t for t in transfers if t.name != hs.PoolName.KV])
        results = store.batch_get_v2(transfers)
        for name, pool in pools.items():
            step = getattr(pool, "page_size", 1) or 1
            read[name] = [pool.get_data_page((1 + i) * step, flat=True) for i in range(2)]
    same = {
        str(name): all(torch.equal(a, b) for a, b in zip(written[name], read[name], strict=True)) for name in written
    }
    sizes = {str(name): int(written[name][0].numel()) for name in written}
    return {
        "same": same,
        "sizes": sizes,
        "results": {str(k): v for k, v in results.items()},
        "kv_hit_pages": exists.kv_hit_pages,
    }


def qsa_page_aligned() -> dict:
    """QSAIndexerPoolHost refuses token-granular moves (its page row packs compressed groups, not tokens)."""
    pool = qsa_host(kv_host())
    out = {"page_aligned_only": getattr(pool, "page_aligned_only", None)}
    if not out["page_aligned_only"]:
        return {**out, "backup_tokens": "not refused"}  # calling on would try to JIT-build a CUDA kernel
    for name, call in (
        ("backup_tokens", lambda: pool.backup_tokens_from_device_all_layer(torch.arange(3), torch.arange(3))),
    ):
        try:
            call()
            out[name] = "moved"
        except ValueError as exc:
            out[name] = "refused" if "expects page-aligned indices" in str(exc) else f"ValueError: {exc}"
        except Exception as exc:  # reached the token-granular DSV4 copy (not even importable on CPU)
            out[name] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def mamba_slots() -> dict:
    out = {"default_size": mamba_host().size}
    try:
        out["explicit_size"] = mamba_host(host_slots=40).size
    except TypeError as exc:
        out["explicit_size"] = f"TypeError: {exc}"
    from sglang.srt.arg_groups.fields import memory

    fields, defaults = memory.Memory.__struct_fields__, memory.Memory.__struct_defaults__
    out["flag_default"] = dict(zip(fields[len(fields) - len(defaults) :], defaults, strict=True)).get(
        "hicache_mamba_host_slots", "absent"
    )
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa

    split = getattr(hpa, "_split_hicache_size_with_mamba", None)
    kv, mamba = SimpleNamespace(host_capacity_bytes=300), SimpleNamespace(host_capacity_bytes=100)
    for slots in (0, 5):
        memory_args = SimpleNamespace(hicache_mamba_host_slots=slots)
        with mock.patch.object(hpa, "get_memory", return_value=memory_args):
            out[f"split_slots_{slots}"] = list(split(8, (kv,), mamba)) if split else None
    return out


def _backup_controller(store: hs.HiCacheFile, pool: MHATokenToKVPoolHost, write_s: float):
    """A HybridCacheController with only what its storage-backup thread touches; each page write takes write_s."""
    import contextlib
    import threading
    import time
    from queue import Queue

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    ctrl = object.__new__(HybridCacheController)
    ctrl.__dict__.update(
        enable_storage=True,
        page_size=PAGE,
        storage_stop_event=threading.Event(),
        backup_drain_deadline=None,
        backup_queue=Queue(),
        ack_backup_queue=Queue(),
        storage_backend=store,
        storage_host_pool=pool,
        mem_pool_host=SimpleNamespace(layout_lease=contextlib.nullcontext),
        storage_config=SimpleNamespace(is_storage_writer=True),
        pp_prefetch_command_thread=None,
    )
    ctrl.page_set_func = lambda *a: (time.sleep(write_s), ctrl._generic_page_set(*a))[1]
    ctrl.backup_thread = threading.Thread(target=ctrl.backup_thread_func, daemon=True)
    ctrl.backup_thread.start()
    return ctrl


def _queue_backups(ctrl, keys: list[str]) -> None:
    """Enqueue one page per key and return once the first is being written (the rest are queued)."""
    import time

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import StorageOperation

    for i, key in enumerate(keys):
        ctrl.backup_queue.put(StorageOperation(torch.arange(i * PAGE, (i + 1) * PAGE), [], hash_value=[key]))
    while ctrl.backup_queue.qsize() > len(keys) - 1:
        time.sleep(0.005)


def _method_from_source(path: str, cls: str, name: str) -> Callable:
    """Compile one self-contained method out of TREE's source.

    unified_radix_cache imports the OpenAI protocol models at load, which a CPU
    test runner does not install; release_host_resources itself uses only self.
    """
    return runtime_code.method_from_source(TREE, path, cls, name)


def flush_idle() -> dict:
    """The runtime's own idle check and deferred flush: what makes preStop's /flush_cache?timeout=N safe.

    ``Scheduler.is_fully_idle`` is compiled out of TREE's scheduler.py (the module imports GPU code) and run
    on a scheduler with nothing but HiCache work in flight; ``SchedulerFlushWrapper`` is imported as is.
    """
    import enum

    # flush_wrapper.py runs as is, minus its io_struct import (which pulls in the OpenAI protocol models).
    SchedulerFlushWrapper, FlushCacheReqInput = runtime_code.flush_wrapper_class(TREE)

    mode = enum.Enum("DisaggregationMode", "NULL PREFILL DECODE")
    namespace = {"DisaggregationMode": mode, "get_memory": lambda: SimpleNamespace(hicache_host_memory_mode="full")}
    is_fully_idle = runtime_code.is_fully_idle(TREE, namespace)
    ongoing = ("ongoing_write_through", "ongoing_load_back", "ongoing_prefetch", "ongoing_backup")
    tree_cache = SimpleNamespace(enable_storage=True, **{name: {} for name in ongoing})
    sched = SimpleNamespace(
        running_batch=SimpleNamespace(is_empty=lambda: True, reqs=[]), chunked_req=None,
        dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False), last_batch=None, enable_overlap=False,
        result_queue=[], _pp_microbatches_drained=lambda: True, waiting_queue=[], disaggregation_mode=mode.NULL,
        grammar_manager=SimpleNamespace(grammar_queue=[]), enable_hisparse=False, enable_hierarchical_cache=True,
        tree_cache=tree_cache, enable_lmcache=False, _engine_paused=False, disagg_decode_prealloc_queue=None,
    )  # fmt: skip
    out = {"idle_when_nothing_in_flight": is_fully_idle(sched)}
    for name in ongoing:
        getattr(tree_cache, name)[1] = object()
        out[f"idle_with_{name}"] = is_fully_idle(sched)
        getattr(tree_cache, name).clear()
    flushes, sent = [], []
    wrapper = SchedulerFlushWrapper(
        flush_cache=lambda: (flushes.append(1), True)[1],
        is_fully_idle=lambda: is_fully_idle(sched),
        send_output=lambda output, req: sent.append(output.success),
    )
    tree_cache.ongoing_backup[7] = object()  # a storage backup of the last write-through is in flight
    out["answered_at_once"] = wrapper.handle(FlushCacheReqInput(timeout_s=30.0)) is not None
    wrapper.check_pending()
    out["flushed_while_backup_in_flight"] = len(flushes)
    tree_cache.ongoing_backup.clear()  # its storage ack arrives
    wrapper.check_pending()
    out["flushed_after_backup_acked"], out["reply"] = len(flushes), sent
    return out


def _module_function(path: str, names: tuple[str, ...]) -> dict:
    """Compile module-level assignments and functions named ``names`` out of TREE's source (module imports stay out)."""
    module = ast.parse((TREE / path).read_text())
    keep = [
        n for n in module.body
        if (isinstance(n, ast.FunctionDef) and n.name in names)
        or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in names for t in n.targets))
    ]  # fmt: skip
    namespace: dict = {"os": os}
    exec(compile(ast.Module(keep, []), str(TREE / path), "exec"), namespace)
    return namespace


def exit_grace() -> dict:
    """Seconds the tokenizer waits after ShutdownReq before it SIGKILLs the schedulers, per drain timeout."""
    ns = _module_function(
        "sglang/srt/managers/tokenizer_manager.py", ("_SCHEDULER_EXIT_TIMEOUT_SECS", "_scheduler_exit_timeout")
    )
    grace = ns.get("_scheduler_exit_timeout", lambda: ns["_SCHEDULER_EXIT_TIMEOUT_SECS"])
    out = {}
    for value in (None, "8", "120", "0"):
        with mock.patch.dict(os.environ, {} if value is None else {"SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT": value}):
            if value is None:
                os.environ.pop("SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT", None)
            out[str(value)] = float(grace())
    source = (TREE / "sglang/srt/managers/tokenizer_manager.py").read_text()
    out["used_for_the_kill_deadline"] = "deadline = time.monotonic() + _scheduler_exit_timeout()" in source
    return out


def shutdown_drain() -> dict:
    """Queue four page backups behind a slow disk, then run the graceful-shutdown release.

    The files present when release_host_resources returns are what survives: the
    scheduler process exits right after it, taking the daemon backup thread along.
    """
    import time

    release_host_resources = _method_from_source(
        "sglang/srt/mem_cache/unified_radix_cache.py", "UnifiedRadixCache", "release_host_resources"
    )
    keys = [f"{i:064x}" for i in range(10, 14)]
    out = {}
    for case, timeout in (("graceful", "8"), ("bounded", "0.3")):
        os.environ["SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT"] = timeout
        store, pool = storage(WORK / f"drain-{case}"), kv_host()
        for i in range(len(keys)):
            fill_random(pool, i * PAGE, seed=i)
        ctrl = _backup_controller(store, pool, write_s=0.25)
        _queue_backups(ctrl, keys)
        on_destroy = []
        cache = SimpleNamespace(
            cache_controller=ctrl,
            linker=None,
            host_pool_group=SimpleNamespace(destroy=lambda o=on_destroy, s=store: o.append(sum(map(s.exists, keys)))),
        )
        start = time.monotonic()
        release_host_resources(cache)
        out[case] = {
            "written_at_exit": sum(kv_file(store, k).exists() for k in keys),
            "written_when_pools_released": on_destroy,
            "seconds": round(time.monotonic() - start, 2),
            "thread_alive": ctrl.backup_thread.is_alive(),
        }
    os.environ.pop("SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT")
    # reset()/detach() stop the threads without a drain deadline: queued work is dropped, as before.
    store, pool = storage(WORK / "drain-detach"), kv_host()
    ctrl = _backup_controller(store, pool, write_s=0.25)
    _queue_backups(ctrl, keys)
    ctrl._stop_storage_threads()
    out["stop_without_drain"] = {"written": sum(kv_file(store, k).exists() for k in keys)}
    return out


def run(fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc(limit=4)}


if __name__ == "__main__":
    damages = (truncated, short, oversized, unreadable, vanished, zeroed, zeroed_tail, sparse_hole, bit_flip,
               old_format, foreign_tag)  # fmt: skip
    report = {
        d.__name__: run(lambda d=d: with_bad_middle_page(d)) for d in damages if ONLY is None or d.__name__ in ONLY
    }
    for fn in (crash_leftovers, durability, restart_round_trip, mamba_slots, shutdown_drain, exit_grace,
               flush_idle, qsa_page_aligned):
        if ONLY is None or fn.__name__ in ONLY:
            report[fn.__name__] = run(fn)
    print(json.dumps(report))
