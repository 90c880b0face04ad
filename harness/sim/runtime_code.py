"""SIMULATION ONLY: pieces of the runtime's own code, compiled out of an sglang tree's source.

The modules holding the storage-backup thread, the graceful-shutdown release and the flush idle check
(``managers/cache_controller.py``, ``mem_cache/hybrid_cache/hybrid_cache_controller.py``,
``mem_cache/unified_radix_cache.py``, ``managers/scheduler.py``) import GPU-minded code at load (about
14 s on CPU, and packages a CPU runner lacks). The methods themselves need little: each is compiled
here from the tree's own source text (file name and line numbers kept, so a traceback points into the
tree), with only the module's light imports (stdlib, torch, ``hicache_storage``) executed. What the
callers then build around them -- the attributes a method reads -- is theirs to state.

Used by the engine stand-in (``harness.sim.tiers``) and by ``tests/runtime/runtime_probe.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace

CACHE_CONTROLLER = "sglang/srt/managers/cache_controller.py"
HYBRID_CONTROLLER = "sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py"
UNIFIED_RADIX_CACHE = "sglang/srt/mem_cache/unified_radix_cache.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
FLUSH_WRAPPER = "sglang/srt/managers/scheduler_components/flush_wrapper.py"

# Imports a compiled piece may execute: already loaded (or stdlib) and free of GPU-side modules.
LIGHT_MODULES = frozenset({
    "__future__", "logging", "os", "threading", "time", "queue", "typing", "dataclasses", "enum",
    "torch", "contextlib", "sglang.srt.mem_cache.hicache_storage",
})  # fmt: skip

# What the storage-backup thread runs (base and hybrid controller), and its shutdown drain when the tree has one
# (patch 0003). A name the tree lacks is left out, so the parent's class is the parent's.
BACKUP_METHODS = (
    "backup_skip", "_generic_page_set", "_page_backup", "_page_backup_or_log", "_backup_draining",
    "drain_storage_backup", "backup_thread_func", "_stop_storage_threads",
)  # fmt: skip
HYBRID_BACKUP_METHODS = (
    "write_storage", "_page_backup", "_page_backup_with_stable_layout", "should_backup", "backup_thread_func",
    "_resolve_sidecar_kv_derived_pool_transfers", "_resolve_sidecar_nonkv_derived_pool_transfers",
    "_stop_pp_prefetch_thread", "_stop_storage_threads",
)  # fmt: skip


def _parse(tree: Path, path: str) -> tuple[ast.Module, str]:
    filename = str(Path(tree) / path)
    return ast.parse(Path(filename).read_text()), filename


def _light_imports(module: ast.Module) -> list[ast.stmt]:
    def light(node: ast.stmt) -> bool:
        if isinstance(node, ast.Import):
            return all(a.name in LIGHT_MODULES for a in node.names)
        return isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in LIGHT_MODULES

    return [node for node in module.body if light(node)]


def _run(nodes: list[ast.stmt], filename: str, namespace: dict) -> dict:
    exec(compile(ast.Module(nodes, type_ignores=[]), filename, "exec"), namespace)
    return namespace


def method_from_source(tree: Path, path: str, cls: str, name: str) -> Callable:
    """One self-contained method of ``cls`` compiled out of ``tree``'s source, as a plain function."""
    module, filename = _parse(tree, path)
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.returns = None
    return _run([fn], filename, {})[name]


def classes_from_source(
    tree: Path, path: str, classes: dict[str, Iterable[str] | None], functions: Iterable[str] = (),
    namespace: dict | None = None,
) -> dict:  # fmt: skip
    """The named classes of ``path``, each holding only the named methods (None: the whole class body).

    The classes are compiled as written (bases, decorators, ``super()``), beside the module's light
    imports, its ``logger`` and the module-level ``functions`` named; other names come from ``namespace``.
    """
    module, filename = _parse(tree, path)
    nodes = _light_imports(module)
    functions = set(functions)
    for node in module.body:
        is_logger = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "logger" for t in node.targets)
        if is_logger or (isinstance(node, ast.FunctionDef) and node.name in functions):
            nodes.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in classes:
            wanted = classes[node.name]
            if wanted is not None:
                wanted = set(wanted)
                node.body = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in wanted] or [
                    ast.Pass()
                ]
            nodes.append(node)
    return _run(nodes, filename, dict(namespace or {}))


def storage_backup_classes(tree: Path) -> SimpleNamespace:
    """The tree's ``HybridCacheController`` (storage-backup methods only) and its ``StorageOperation``.

    ``sglang.srt.mem_cache.hicache_storage`` must already be imported from ``tree``
    (``harness.sim.sglang_tree.import_hicache_storage``).
    """
    base = classes_from_source(
        tree, CACHE_CONTROLLER, {"StorageOperation": None, "HiCacheController": BACKUP_METHODS},
        namespace={"__name__": "sglang.srt.managers.cache_controller"},
    )  # fmt: skip
    hybrid = classes_from_source(
        tree, HYBRID_CONTROLLER, {"StorageOperation": None, "HybridCacheController": HYBRID_BACKUP_METHODS},
        functions=("_trailing_chain_groups",),
        namespace={
            "__name__": "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
            "BaseHiCacheController": base["HiCacheController"],
            "BaseStorageOperation": base["StorageOperation"],
        },
    )  # fmt: skip
    return SimpleNamespace(
        HybridCacheController=hybrid["HybridCacheController"], StorageOperation=hybrid["StorageOperation"]
    )


def release_host_resources(tree: Path) -> Callable:
    """``UnifiedRadixCache.release_host_resources``: the last step of the scheduler's graceful exit."""
    return method_from_source(tree, UNIFIED_RADIX_CACHE, "UnifiedRadixCache", "release_host_resources")


def flush_wrapper_class(tree: Path) -> tuple[type, Callable]:
    """``SchedulerFlushWrapper`` as is (its io_struct import left out), and a ``FlushCacheReqInput`` stand-in."""
    module, filename = _parse(tree, FLUSH_WRAPPER)
    module.body = [n for n in module.body if not (isinstance(n, ast.ImportFrom) and n.module.endswith("io_struct"))]
    namespace = {
        "FlushCacheReqInput": lambda timeout_s=None: SimpleNamespace(timeout_s=timeout_s),
        "FlushCacheReqOutput": lambda success, message="": SimpleNamespace(success=success, message=message),
    }
    _run(module.body, filename, namespace)
    return namespace["SchedulerFlushWrapper"], namespace["FlushCacheReqInput"]


def is_fully_idle(tree: Path, namespace: dict) -> Callable:
    """``Scheduler.is_fully_idle``; ``namespace`` gives the module names it reads (DisaggregationMode, get_memory)."""
    module, filename = _parse(tree, SCHEDULER)
    klass = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "is_fully_idle")
    fn.returns = None
    return _run([fn], filename, dict(namespace))["is_fully_idle"]
