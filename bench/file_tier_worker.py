"""One rank of bench/file_tier.py: the tree's own backup thread writing its patterns, turn by turn, then the reads.

    python bench/file_tier_worker.py TREE WORKDIR SPEC_JSON   # then JSON commands on stdin, one JSON reply each

Runs in its own interpreter (one sglang tree per process) and imports the tree as the runtime does (the whole
package; torchvision stubbed as tests/runtime/cpu_stub.py does: its wheel needs CUDA). What runs is the tree's
code: its ``HiCacheController`` (KV only) or ``HybridCacheController`` (KV plus sidecars) backup thread, built as
the probes build it (tests/runtime/file_tier_identity_probe.py: the attributes ``attach_storage_backend`` sets
for the file backend), its host pools (``MHATokenToKVPoolHost`` page_first, ``QSAIndexerPoolHost``,
``MambaPoolHost``) and its ``HiCacheFile``. The process builds every pattern of its rank, prints ``ready``, then
waits on stdin, so the bench decides when each turn runs and the other tree's idle ranks cost nothing meanwhile:
``{"do": "write", "pattern": P, "args": [k]}`` queues turn k's backup operations at once, as a burst of finished
requests queues them, and times them from the first queued to the last acknowledged; ``drop`` syncs and drops the
pattern's files from the page cache (``POSIX_FADV_DONTNEED``); ``read`` reads every KV page of the pattern back (turn
k: the same pages each turn, dropped before) by the controller's own prefetch path (``_generic_page_get``,
128-page batches), checked equal; ``startup``, ``end``.

The parent never syncs, so its pages are not durable when it acknowledges; with ``parent_sync`` the worker
wraps the parent's ``_page_backup_or_log`` to end every operation with the one ``syncfs`` the patched tree
makes (patch 0006's group commit): "the parent plus the same syncs".

With ``{"restore": ...}`` it runs bench/restore_path.py's measurement instead and prints its one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import logging
import os
import resource
import sys
import threading
import time
from pathlib import Path
from queue import Queue
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
TREE, WORK, SPEC = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, str(REPO / "tests/runtime"))
import cpu_stub  # noqa: E402

cpu_stub.install()
sys.path.insert(0, str(TREE))
import torch  # noqa: E402

# The runtime's scheduler runs torch on one intra-op thread (0.5.23 model_runner.py:1279, load_model:
# torch.set_num_threads(1) on GPU devices), so the host pools' copies and the backup thread's page gathers run so
# here too. With torch's default (one OpenMP thread per core), four rank processes on a 2-core machine spin-wait on
# each other: their reads ran at 45-341 MB/s instead of 1,000-1,600 (2026-12-05), a figure of the bench host.
torch.set_num_threads(1)
logging.disable(logging.CRITICAL)

from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController,
    PrefetchOperation,
)
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.qsa import QSAIndexerPoolHost  # noqa: E402

PAGE = 64
CHUNK = 128  # the controllers' STORAGE_BATCH_SIZE: prefetch reads in the same batches


def syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def drop_cache(path: Path) -> None:
    for name in os.listdir(path):
        fd = os.open(path / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def kv_host(g: dict, pages: int) -> MHATokenToKVPoolHost:
    layers, heads, dim = g["layers"], g["heads"], g["dim"]
    # The device buffers only lend shapes and dtype to the host pool; one page of them is enough.
    k = tuple(torch.zeros(PAGE, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    v = tuple(torch.zeros(PAGE, heads, dim, dtype=torch.bfloat16) for _ in range(layers))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )  # fmt: skip
    return MHATokenToKVPoolHost(info, 1.0, 0, PAGE, "page_first", pin_memory=False,
                                device_capacity_tokens=PAGE * pages, start_layer=0, end_layer=layers,
                                host_token_capacity=PAGE * pages)  # fmt: skip


def mamba_host(g: dict, slots: int) -> MambaPoolHost:
    layers = g["mamba_layers"]
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, g["mamba_heads"], g["mamba_dim"], g["mamba_dim"], dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 8 * g["mamba_heads"], 3, dtype=torch.bfloat16),),
        extra_checkpoint_buffers=(torch.zeros(slots, 3, 5, dtype=torch.bfloat16),
                                  torch.zeros(slots, 7, dtype=torch.int32)),
    )  # fmt: skip
    # host_slots: patch 0002's host slot count (the parent sizes the host pool by the ratio alone)
    sized = {"host_slots": slots} if "host_slots" in inspect.signature(MambaPoolHost.__init__).parameters else {}
    return MambaPoolHost(info, 1.0, 0, device_capacity=slots, pin_memory=False, layout="page_first", **sized)


def qsa_host(g: dict, anchor: MHATokenToKVPoolHost) -> QSAIndexerPoolHost:
    ratio = 4
    device = SimpleNamespace(
        qsa_compress_ratio=ratio,
        qsa_compressed_k_buffer_pool=[torch.zeros(PAGE // ratio, g["index_width"], dtype=torch.uint8)
                                      for _ in range(g["index_layers"])],
    )  # fmt: skip
    return QSAIndexerPoolHost(device, anchor)


def store(path: Path, rank: int, ranks: int) -> hs.HiCacheFile:
    cfg = hs.HiCacheStorageConfig(tp_rank=rank, tp_size=ranks, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                  is_page_first_layout=True, model_name="Qwen/bench")  # fmt: skip
    return hs.HiCacheFile(cfg, file_path=str(path))


def controller(hybrid: bool, backend: hs.HiCacheFile, pools: dict) -> HiCacheController:
    """The tree's backup thread's object, attributes as attach_storage_backend sets them for the file backend."""
    ctrl = object.__new__(HybridCacheController if hybrid else HiCacheController)
    ctrl.__dict__.update(
        enable_storage=True, page_size=PAGE, storage_stop_event=threading.Event(), backup_drain_deadline=None,
        backup_queue=Queue(), ack_backup_queue=Queue(), storage_backend=backend, storage_backend_type="file",
        storage_host_pool=pools[hs.PoolName.KV], storage_config=SimpleNamespace(is_storage_writer=True),
        mem_pool_host=SimpleNamespace(layout_lease=contextlib.nullcontext, entry_map={}),
        pp_prefetch_command_thread=None, backup_skip=False, prefetch_sync_queue=Queue(),
    )  # fmt: skip
    ctrl.page_set_func = ctrl._generic_page_set
    ctrl.page_get_func = ctrl._generic_page_get
    return ctrl


def host_pools(backend: hs.HiCacheFile, g: dict, pages: int, mamba_slots: int | None) -> dict:
    """The KV host pool of `pages` pages and, with `mamba_slots`, the QSA index and Mamba pools registered with the
    backend as sidecars. The pools' own budget (as the runtime probes set it): the machine's free memory, which other
    jobs share, must not decide whether a few hundred MiB of pools may be allocated."""
    with host_memory_budget_scope(8 << 30):
        kv = kv_host(g, pages)
        pools = {hs.PoolName.KV: kv}
        if mamba_slots:
            pools[hs.PoolName.INDEXER], pools[hs.PoolName.MAMBA] = qsa_host(g, kv), mamba_host(g, mamba_slots)
    for name in (hs.PoolName.INDEXER, hs.PoolName.MAMBA):
        if name in pools:
            backend.register_mem_host_pool_v2(pools[name], name)
    return pools


def fill(kv: MHATokenToKVPoolHost, pages: int, seed: int) -> list[torch.Tensor]:
    """Random bytes in the first `pages` KV pages; the pages as written."""
    gen = torch.Generator().manual_seed(seed)
    reference = []
    for i in range(pages):
        page = kv.get_dummy_flat_data_page()
        page.copy_(torch.randint(0, 256, page.shape, generator=gen, dtype=torch.uint8))
        kv.set_from_flat_data_page(i * PAGE, page)
        reference.append(page)
    return reference


def sidecars(span: list[str], slot: int) -> list[hs.PoolTransfer]:
    """A hybrid operation's sidecar transfers: the QSA index of every page, the Mamba state (in `slot`) of the last."""
    return [hs.PoolTransfer(name=hs.PoolName.INDEXER, indices_from_pool=hs.PoolName.KV),
            hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=span[-1:], host_indices=torch.tensor([slot]),
                            hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)]  # fmt: skip


def queue_and_wait(ctrl: HiCacheController, operations: list[tuple]) -> tuple[float, float, list]:
    """Queue every (host indices, keys, sidecars or None) operation at once, as a burst of finished requests queues
    them, and wait until the running backup thread acknowledges each: (first queued, last acknowledged, the acks)."""
    start = time.time()
    for host, span, extra in operations:
        if extra is None:
            ctrl.write_storage(host, [], hash_value=span)
        else:
            ctrl.write_storage(host, [], hash_value=span, extra_pools=extra)
    acked = [ctrl.ack_backup_queue.get(timeout=600) for _ in operations]
    return start, time.time(), acked


def back_up(ctrl: HiCacheController, operations: list[tuple]) -> tuple[float, float, list]:
    """queue_and_wait on a backup thread of its own, stopped after."""
    thread = threading.Thread(target=ctrl.backup_thread_func, daemon=True)
    thread.start()
    try:
        return queue_and_wait(ctrl, operations)
    finally:
        ctrl.storage_stop_event.set()
        thread.join()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Pattern:
    """One pattern in one rank: its HiCacheFile, host pools and controller, written and read turn by turn as the
    bench asks. ``turns`` lists each turn's operations (page counts); every operation writes the same host pages."""

    def __init__(self, spec: dict, parent_sync: bool) -> None:
        hybrid, rank = spec["hybrid"], spec.get("rank", 0)
        self.pages_dir = WORK / spec["name"] / "pages"
        self.pages_dir.mkdir(parents=True, exist_ok=True)
        self.backend = store(self.pages_dir, rank, spec.get("ranks", 1))
        ops = [n for turn in spec["turns"] for n in turn]
        self.pools = host_pools(self.backend, spec["geometry"], max(ops), len(ops) if hybrid else None)
        self.kv = self.pools[hs.PoolName.KV]
        self.reference = fill(self.kv, max(ops), seed=rank)
        self.page_bytes = self.reference[0].numel() * self.reference[0].element_size()
        self.ctrl = controller(hybrid, self.backend, self.pools)
        if parent_sync and not self.patched:
            inner, pages_dir = self.ctrl._page_backup_or_log, self.pages_dir

            def backup_then_sync(operation):  # the one sync per operation the patched tree makes
                inner(operation)
                syncfs(pages_dir)

            self.ctrl._page_backup_or_log = backup_then_sync
        keys = [[f"{op:08x}{i:056x}" for i in range(n)] for op, n in enumerate(ops)]
        operations = iter([(torch.arange(0, n * PAGE, dtype=torch.int64), span, sidecars(span, op) if hybrid else None)
                           for op, (n, span) in enumerate(zip(ops, keys, strict=True))])  # fmt: skip
        self.write_turns = [[next(operations) for _ in turn] for turn in spec["turns"]]
        # Every read turn reads every KV page the pattern wrote, in the prefetch path's batches (128 pages of one
        # operation at most), page cache dropped before (``drop``): `read_turns` turns of the whole pattern.
        batches = [(i, span[i : i + CHUNK]) for turn in self.write_turns for _, span, _ in turn
                   for i in range(0, len(span), CHUNK)]  # fmt: skip
        self.read_turns = [batches] * spec["read_turns"]
        syncfs(self.pages_dir)
        self.thread = threading.Thread(target=self.ctrl.backup_thread_func, daemon=True)
        self.thread.start()

    @property
    def patched(self) -> bool:
        return hasattr(self.backend, "group_commit")

    def write(self, turn: int) -> dict:
        operations = self.write_turns[turn]
        cpu = cpu_seconds()
        start, end, acked = queue_and_wait(self.ctrl, operations)
        pages = sum(len(span) for _, span, _ in operations)
        return {"start": start, "end": end, "cpu_s": cpu_seconds() - cpu, "kv_bytes": pages * self.page_bytes,
                "pages": pages, "written_pages": sum(op.completed_tokens for op in acked) // PAGE}  # fmt: skip

    def drop(self) -> dict:
        """Every page durable, then out of the page cache: the reads come from the disk."""
        syncfs(self.pages_dir)
        drop_cache(self.pages_dir)
        return {"dropped": True}

    def read(self, turn: int) -> dict:
        """Read turn `turn`'s KV pages (all of the pattern's) through the controller's prefetch path (128-page
        batches), checked equal."""
        blank = torch.zeros_like(self.reference[0])
        request = SimpleNamespace(request_id=0, is_terminated=lambda: False)
        got, pages, same, seconds = 0, 0, True, 0.0
        for first, batch in self.read_turns[turn]:  # the batch's pages were written from host pages first, ...
            pages += len(batch)
            for j in range(len(batch)):
                self.kv.set_from_flat_data_page(j * PAGE, blank)
            host = torch.arange(0, len(batch) * PAGE, dtype=torch.int64)
            t = time.perf_counter()
            got += self.ctrl._generic_page_get(request, batch, host)
            seconds += time.perf_counter() - t
            same = same and all(torch.equal(self.kv.get_data_page(j * PAGE, flat=True), self.reference[first + j])
                                for j in range(len(batch)))  # fmt: skip
        return {"read_s": seconds, "pages": pages, "read_pages": got, "same": same, "kv_bytes": pages * self.page_bytes}

    def close(self) -> dict:
        self.ctrl.storage_stop_event.set()
        self.ctrl.backup_queue.put(None)  # wakes the thread's queue wait
        self.thread.join()
        files = list(self.pages_dir.iterdir())
        return {"patched": self.patched, "files": len(files), "disk_bytes": sum(f.stat().st_size for f in files)}


def startup(files: int) -> dict:
    """The HiCacheFile constructor over `files` page files (+1% stale temporaries), size cap on."""
    crowd = WORK / "crowd"
    crowd.mkdir(parents=True)
    for i in range(files):
        open(crowd / f"{i:064x}_bench_0_1.bin", "wb").close()
    for i in range(files // 100):
        open(crowd / f".{i:032x}.tmp", "wb").close()
    os.environ["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] = "500G"
    t = time.perf_counter()
    store(crowd, 0, 1)
    seconds = time.perf_counter() - t
    return {"name": "startup", "startup_s": seconds, "tmp_left": sum(n.endswith(".tmp") for n in os.listdir(crowd))}


DIRECT_READ = "SGLANG_HICACHE_FILE_DIRECT_READ"


def restore(spec: dict, g: dict) -> dict:
    """One request's disk hit (``pages`` KV pages, their QSA index sidecars, the Mamba state of the last) written by
    the tree's backup thread, then read back, page cache dropped before each read, ``repeat`` times each way: by the
    hybrid controller's own ``_page_transfer`` of a ``PrefetchOperation`` (``_generic_page_get`` in 128-page
    batches with the KV-derived index sidecar, then the Mamba state, as the prefetch thread runs it), on a tree with
    patch 0012 also with its direct read off (staging pages, as qhc.11), and by a plain ``readinto`` of every file:
    GB/s of the files' bytes."""
    pages, work = spec["pages"], WORK / "restore"
    (work / "pages").mkdir(parents=True)
    backend = store(work / "pages", 0, 1)
    pools = host_pools(backend, g, pages, mamba_slots=2)
    fill(pools[hs.PoolName.KV], pages, seed=0)
    keys, host = [f"{i:064x}" for i in range(pages)], torch.arange(0, pages * PAGE, dtype=torch.int64)
    ctrl = controller(True, backend, pools)
    back_up(ctrl, [(host, keys, sidecars(keys, 0))])
    syncfs(work / "pages")
    files = sorted((work / "pages").iterdir())
    total = sum(f.stat().st_size for f in files)

    def prefetch_path() -> None:
        """The hybrid controller's own transfer of one prefetch operation (KV batches with their KV-derived sidecar,
        then the Mamba state), as the prefetch thread runs it; its acks say what it read."""
        operation = PrefetchOperation(CacheRequestHandle("restore", 0), [], pool_transfers=sidecars(keys, 1))
        operation.hash_value, operation.host_indices = keys, host
        ctrl._page_transfer(operation)
        acks = [ctrl.prefetch_sync_queue.get_nowait() for _ in range(ctrl.prefetch_sync_queue.qsize())]
        kv_tokens = max(a.completed_tokens or 0 for a in acks)
        states = sum((a.pool_hits or {}).get(hs.PoolName.MAMBA, 0) for a in acks)
        if kv_tokens != pages * PAGE or states != 1:
            raise SystemExit(f"restore read {kv_tokens} of {pages * PAGE} tokens, {states} Mamba states")

    def plain() -> None:
        buf = memoryview(bytearray(max(f.stat().st_size for f in files)))
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                fh.readinto(buf)

    def staging_path() -> None:
        """The same transfer with patch 0012's direct read off (SGLANG_HICACHE_FILE_DIRECT_READ=0): each page read
        into a staging page, then copied into the host pool, as series qhc.11 read it."""
        old = os.environ.get(DIRECT_READ)
        os.environ[DIRECT_READ] = "0"
        try:
            prefetch_path()
        finally:
            if old is None:
                os.environ.pop(DIRECT_READ)
            else:
                os.environ[DIRECT_READ] = old

    reads = [("plain", plain), ("prefetch", prefetch_path)]
    if hasattr(hs, "_direct_read_enabled"):  # a tree with patch 0012: its staging read beside the direct one
        reads.append(("prefetch_staging", staging_path))
    if spec.get("scheduler_pass_ms") is not None:
        reads += [(f"beside_{name}", beside_scheduler(prefetch_path, spec["scheduler_pass_ms"] / 1e3, interval))
                  for name, interval in (("sleep0", "0"), ("poll", None))]  # fmt: skip
    out: dict = {"name": "restore", "files": len(files), "bytes": total, **{f"{n}_gbps": [] for n, _ in reads}}
    for i in range(spec["repeat"]):  # rotate which goes first: a drift of the disk hits each alike
        for name, read in reads[i % len(reads):] + reads[: i % len(reads)]:
            drop_cache(work / "pages")
            t = time.perf_counter()
            read()
            out[f"{name}_gbps"].append(total / (time.perf_counter() - t) / 1e9)
    return out


def beside_scheduler(read, pass_s: float, interval: str | None):
    """``read`` while another thread runs a waiting scheduler's loop: ``pass_s`` of Python (a stand-in for the rest
    of a pass: ingest, a prefill pass that skips the waiting request), then the tree's own ``Scheduler.on_idle``,
    with a storage prefetch in flight and ``SGLANG_HICACHE_PREFETCH_POLL_INTERVAL`` set to ``interval`` (None: the
    tree's default). On the parent tree, or with interval "0", on_idle sleeps 0 (patch 0010)."""
    from scheduler_idle import poll_interval, waiting_scheduler

    on_idle = waiting_scheduler(TREE, True, {"restore": True})

    def run() -> None:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                end = time.perf_counter() + pass_s
                while time.perf_counter() < end:
                    pass
                on_idle()

        with poll_interval(interval):
            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
            try:
                read()
            finally:
                stop.set()
                thread.join()

    return run


def serve(spec: dict) -> None:
    """Build this rank's patterns, say so, then answer the bench's commands (stdin), one JSON line each (stdout)."""
    patterns = {p["name"]: Pattern(p, spec["parent_sync"]) for p in spec["patterns"]}
    print(json.dumps({"ready": sorted(patterns)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["do"] == "end":
            print(json.dumps({name: p.close() for name, p in patterns.items()}), flush=True)
            return
        if cmd["do"] == "startup":
            out = startup(cmd["files"])
        else:  # write / read (a turn), drop
            out = getattr(patterns[cmd["pattern"]], cmd["do"])(*cmd.get("args", []))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if "restore" in SPEC:
        print(json.dumps(restore(SPEC["restore"], SPEC["geometry"])), flush=True)
    else:
        serve(SPEC)
