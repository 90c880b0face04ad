"""Which nodes a chunked prefill's inserts back up, through one tree's own radix tree core on CPU.

    python chunk_backup_probe.py TREE

Upstream #33714 reports that on 0.5.x a prompt whose extend exceeds the chunked-prefill size is never backed
up (``_inc_hit_count_and_check`` returning False for chunked inserts). This drives 0.5.23's
``UnifiedTreeCore.begin_insert`` for each chunk of a 384-token prompt in 128-token chunks, with the
``InsertParams`` ``UnifiedRadixCache.checkpoint_into_tree`` builds (``prev_prefix_len`` = the protected length,
``inserted_len`` = what the request inserted before), on a tree with the FULL component
(the backup decision is the tree core's: ``_finish_insert_walk_node`` / ``_should_backup_after_insert`` ->
``_inc_hit_count_and_check``; no component is consulted for it), with HiCache on and the write-through
threshold the cache sets for ``write_through`` (1) and ``write_through_selective`` (2), and prints the
``BackupKV`` actions each insert emits, as the token spans of the nodes they name; then a second request
with the same prompt inserts it whole. The actions are not applied (nothing becomes ``backuped``), so each
``BackupKV`` also chains the earlier unbacked nodes, ancestors first.
"""

from __future__ import annotations

import json
import logging
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

import cpu_stub

TREE = Path(sys.argv[1])
cpu_stub.install()
sys.path.insert(0, str(TREE))
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.cache_action import BackupKV  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402

PAGE, CHUNK, PROMPT = 64, 128, 384


def span(core: UnifiedTreeCore, node_id) -> list[int]:
    node = core.node_by_id(node_id)
    start, ancestor = 0, node.parent
    while ancestor is not None and ancestor is not core.root_node:
        start += len(ancestor.key)
        ancestor = ancestor.parent
    return [start, start + len(node.key)]


def insert(core: UnifiedTreeCore, params: InsertParams, steps: list) -> list[list[list[int]]]:
    """One insert to completion (resumed at each barrier, as the cache does); the BackupKV spans it emitted."""
    step = core.begin_insert(params)
    steps.append(step)
    while step.result is None:
        step = core.resume_insert()
        steps.append(step)
    core.end_insert()
    return [[span(core, i) for i in a.node_ids] for st in steps for a in st.actions if isinstance(a, BackupKV)]


def chunked_prefill(threshold: int) -> list[dict]:
    params = SimpleNamespace(
        page_size=PAGE, is_eagle=False, enable_session_radix_cache=False, eviction_policy="lru",
        eviction_policy_config=None, token_to_kv_pool_allocator=None, enable_kv_cache_events=False,
        dynamo_kv_event_format=False, kv_event_lora_names=None,
    )  # fmt: skip
    core = UnifiedTreeCore(
        params, {ComponentType.FULL: FullComponent(SimpleNamespace(enable_session_radix_cache=False), params)}
    )
    core.enable_hicache, core.write_through_threshold = True, threshold
    tokens = list(range(1000, 1000 + PROMPT))
    out = []
    for end in range(CHUNK, PROMPT + 1, CHUNK):
        chunk = InsertParams(
            key=RadixKey(array("q", tokens[:end]), None),
            value=torch.arange(end, dtype=torch.int64),
            prev_prefix_len=end - CHUNK,
            inserted_len=end - CHUNK,
        )
        steps: list = []
        out.append({"chunk_end": end, "backups": insert(core, chunk, steps), "barriers": len(steps) - 1})
    # A second request with the same prompt, unchunked (a prefix hit): its insert counts each node again.
    again = InsertParams(key=RadixKey(array("q", tokens), None), value=torch.arange(PROMPT, dtype=torch.int64))
    steps = []
    out.append({"second_request": True, "backups": insert(core, again, steps), "barriers": len(steps) - 1})
    return out


if __name__ == "__main__":
    print(json.dumps({"write_through": chunked_prefill(1), "write_through_selective": chunked_prefill(2)}))
