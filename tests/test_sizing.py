"""Sizing: the 0.5.23 figures of the example, each rule that makes the runtime's numbers differ from a naive
reading of the spec, pod memory, disk tier, node fit and the errors for input that cannot be sized. The values
themselves are checked against the runtime's own constructors by tests/conformance (a matrix of 100+ cases)."""

from __future__ import annotations

import ast
import copy
import json
import math
import zipfile
from pathlib import Path

import pytest
import yaml
from qwen_hicache import units
from qwen_hicache.derive import launch_sizing
from qwen_hicache.geometry import from_hf_config
from qwen_hicache.launch import MEMORY_FLAGS, launch_args
from qwen_hicache.sizing import GIB, SizingError, check_fit, compute_sizing
from qwen_hicache.sizing_report import render_table
from qwen_hicache.spec import QwenHiCacheServerSpec
from resources import derived, variant

ROOT = Path(__file__).parent.parent
HF = Path(__file__).parent / "data" / "hf"
WHEEL = Path.home() / ".cache/qwen-hicache/wheels/sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"

RUNTIME_HOST_KV_TOKENS = 2_143_040
RUNTIME_HOST_MAMBA_SLOTS = 467
"""What sglang 0.5.23 + runtime_patches allocates for the example (tests/conformance executes it)."""
ORIGINAL_RUN = (2_541_440, 371)
"""The measured run of the original change, on another build with its own host-pool patches: history only."""


def example() -> dict:
    return yaml.safe_load((ROOT / "examples" / "qwenhicache.yaml").read_text())["spec"]


def sized(raw: dict):
    return compute_sizing(QwenHiCacheServerSpec.model_validate(raw))


def within(value: int, target: int, tolerance: float = 0.005) -> bool:
    return abs(value - target) <= tolerance * target


def hf_spec(model: str, tp: int = 2, **runtime) -> dict:
    raw = example()
    geometry = from_hf_config(json.loads((HF / model / "config.json").read_text()))
    raw["model"] = {**raw["model"], "profile": None, "geometry": geometry.wire()}
    raw["runtime"].pop("mambaSsmDtype")
    raw["runtime"].update(tensorParallelSize=tp, **runtime)
    return raw


# --- the example and the rules that changed --------


def test_example_is_sized_as_sglang_0_5_23_allocates():
    """TP2, FP8 KV, page 64, bf16 SSM, 512 device slots, 4,342,208 GPU tokens, --hicache-size 30, NEXTN."""
    s = sized(example())
    assert s.host.hicache_size_gb == 30
    assert (s.host.kv_tokens, s.host.mamba_slots) == (RUNTIME_HOST_KV_TOKENS, RUNTIME_HOST_MAMBA_SLOTS)
    assert (s.host.kv_tokens, s.host.mamba_slots) != ORIGINAL_RUN


def test_split_weighs_ssm_verify_snapshots_and_draft_index_keys():
    """The Mamba weight counts (spec states + 1) x draft tokens x (conv + SSM) per layer on top of the state;
    the QSA scaling counts the draft's compressed keys too."""
    s = sized(example())
    sh, dev = s.shapes, s.device
    per_layer = sh.conv_bytes_per_layer + sh.ssm_bytes_per_layer
    assert dev.spec_states == 64
    assert dev.mamba_bytes == (512 + 1) * 36 * per_layer + (64 + 1) * 4 * 36 * per_layer
    rows = -(-(4_342_208 + 64) // 4)
    assert dev.index_bytes == rows * 128 * 2 * (12 + 1)
    no_mtp = example()
    del no_mtp["runtime"]["speculative"]
    plain = sized(no_mtp)
    assert plain.device.mamba_bytes == (512 + 1) * 36 * per_layer and plain.device.spec_states == 0
    assert plain.host.mamba_slots < s.host.mamba_slots  # the verify scratch weighs in the split


def test_nextn_packs_one_draft_layer_whatever_the_config_declares():
    """Qwen3-Next's real config has no MTP field; the runtime still loads one MTP layer."""
    with_mtp = sized(hf_spec("qwen3_next", kvCacheDtype="bf16"))
    raw = hf_spec("qwen3_next", kvCacheDtype="bf16")
    del raw["runtime"]["speculative"]
    without = sized(raw)
    assert with_mtp.geometry.mtp_layers == 0
    assert with_mtp.shapes.kv_bytes_per_token == without.shapes.kv_bytes_per_token * 13 // 12


def test_a_host_tier_no_larger_than_the_device_pool_says_restores_are_refused():
    """The engine run (bench/gpu_engine.md, 2026-12-05 17:41): 42,560 host KV tokens beside a 65,536-token device
    pool; the runtime refused 25,024 tokens of disk hits for host capacity once the host held pages still on the
    GPU. The example (2,143,040 host, 4,342,208 device) is in the same state and says so; more host memory is not."""
    note = [n for n in sized(example()).notes if n.startswith("host KV")]
    assert note and 'reason="host_capacity"' in note[0] and "raise hostMemoryPerRankGB" in note[0]
    raw = example()
    raw["hicache"]["hostMemoryPerRankGB"] = 80
    assert not [n for n in sized(raw).notes if n.startswith("host KV")]


def test_running_requests_are_capped_by_the_mamba_slots_and_said_so():
    raw = example()
    raw["runtime"]["maxRunningRequests"] = 256
    s = sized(raw)
    assert s.device.running_requests == s.device.spec_states == 512 // 5
    assert any("capped by the runtime to 102" in n for n in s.notes)
    assert launch_args(QwenHiCacheServerSpec.model_validate(raw), launch_sizing(s)).count("256") == 1


def test_unset_request_counts_are_rendered_so_the_runtime_does_not_guess():
    raw = example()
    del raw["runtime"]["maxRunningRequests"], raw["runtime"]["maxMambaCacheSize"]
    spec = QwenHiCacheServerSpec.model_validate(raw)
    s = compute_sizing(spec)
    args = launch_args(spec, launch_sizing(s))
    assert args[args.index("--max-running-requests") + 1] == "128"
    assert args[args.index("--max-mamba-cache-size") + 1] == str(128 * 5)
    assert s.device.running_requests == 128


def test_page_size_the_qwen4_exp_override_replaces_is_refused():
    raw = example()
    del raw["runtime"]["speculative"]
    raw["runtime"]["pageSize"] = 128
    with pytest.raises(SizingError, match="forces --page-size 64"):
        sized(raw)


def test_auto_kv_dtype_follows_the_checkpoint_and_is_explained():
    raw = example()
    raw["runtime"]["kvCacheDtype"] = "auto"
    s = sized(raw)
    assert s.shapes.kv_bytes_per_token == 2 * sized(example()).shapes.kv_bytes_per_token  # bf16
    assert any("kvCacheDtype auto: the runtime uses bf16" in n for n in s.notes)
    raw["model"]["geometry"] = {"checkpointKvFp8": True}
    assert sized(raw).shapes.kv_bytes_per_token == sized(example()).shapes.kv_bytes_per_token


def test_geometry_merged_onto_the_default_profile_is_said_in_status():
    raw = example()
    raw["model"]["geometry"] = {"numKeyValueHeads": 4}
    notes = sized(raw).notes
    assert any("merged onto profile 'qwen3.8-flash-next'" in n and "qsaCompressRatio" in n for n in notes)
    assert not any("merged" in n for n in sized(hf_spec("qwen3_next", kvCacheDtype="bf16")).notes)


def test_flags_that_change_the_runtime_allocation_are_not_accepted_from_extra_args():
    managed = derived({"spec": example()}).managed_flags
    assert managed >= MEMORY_FLAGS
    assert {"--enable-linear-replayssm-spec", "--mamba-radix-cache-strategy"} <= managed


def test_estimated_device_pool_lands_near_the_measured_one():
    raw = example()
    del raw["hicache"]["deviceKVTokens"]
    s = sized(raw)
    assert s.device.kv_tokens_estimated
    assert within(s.device.kv_tokens, 4_342_208, 0.01)
    assert within(s.host.kv_tokens, RUNTIME_HOST_KV_TOKENS, 0.01)


def test_tp_shards_per_rank_state():
    one, four = (sized(hf_spec("qwen3_next", tp, kvCacheDtype="bf16")).shapes for tp in (1, 4))
    assert one.kv_bytes_per_token == 2 * four.kv_bytes_per_token  # 2 KV heads: 2 at TP1, 1 (not 0.5) at TP4
    assert one.mamba_bytes_per_slot == 4 * four.mamba_bytes_per_slot


# --- pod memory, shm, status, report --------


def test_pod_memory_covers_pools_reserve_and_pinned_ple_table():
    s = sized(example())
    terms = {t.name: t.bytes for t in s.terms}
    assert terms["hostPools"] == 2 * s.host.total_bytes
    assert terms["runtimeReserve"] == 10 * GIB
    assert terms["pleTable"] == 320_000_000 * 160  # fp8 n-gram table, all ranks (models/qwen4_exp.py:113-128)
    total = sum(terms.values())
    assert total <= s.pod_memory_limit_bytes < total + GIB and s.pod_memory_limit_bytes % GIB == 0
    assert s.pod_memory_request_bytes == s.pod_memory_limit_bytes
    # the runtime's own check: all ranks' pools fit in the cgroup minus its 10 GiB reserve
    assert 2 * s.host.total_bytes <= s.pod_memory_limit_bytes - 10 * GIB
    assert s.shm_bytes == terms["shm"] > 0


def test_fractional_host_size_is_floored_to_the_runtime_int():
    raw = example()
    raw["hicache"]["hostMemoryPerRankGB"] = 30.7
    s = sized(raw)
    assert launch_sizing(s).host_size_gb == 30
    assert s.host.kv_tokens == sized(example()).host.kv_tokens


def test_status_and_table_carry_every_number_and_term():
    s = sized(example())
    model = s.as_status()
    status = model.wire()
    for key in (
        "hostKVTokensPerRank",
        "hostMambaSlotsPerRank",
        "hostBytesPerRank",
        "podMemoryLimitBytes",
        "podMemoryRequestBytes",
        "shmBytes",
        "diskCapBytesPerRank",
        "diskVolumeBytes",
        "coverageFraction",
        "memoryTerms",
    ):
        assert key in status, key
    assert status["hostKVTokensPerRank"] == s.host.kv_tokens
    json.dumps(status)
    table = render_table(model, title="flash-next")
    assert f"{s.host.kv_tokens:,}" in table and f"{s.host.mamba_slots:,}" in table
    for term in status["memoryTerms"]:
        assert term["name"] in table and term["why"] in table


# --- disk tier --------


def with_disk(**disk) -> dict:
    raw = example()
    raw["hicache"]["disk"] = {"enabled": True, **disk}
    return raw


def test_disk_cap_from_volume():
    s = sized(with_disk(size="600Gi"))
    assert s.disk.volume_bytes == 600 * GIB
    assert s.disk.cap_bytes_per_rank == math.floor(600 * GIB * 0.9 / 2)


def test_volume_from_cap_round_trips():
    s = sized(with_disk(capPerRank="256G"))
    assert s.disk.cap_bytes_per_rank == 256 * 10**9
    assert s.disk.volume_bytes % GIB == 0 and s.disk.volume_bytes * 0.9 >= 2 * 256 * 10**9
    again = sized(with_disk(size=str(s.disk.volume_bytes)))
    assert again.disk.cap_bytes_per_rank >= 256 * 10**9 and not again.problems


def test_disk_cap_larger_than_the_volume_is_a_problem():
    s = sized(with_disk(size="500Gi", capPerRank="300Gi"))
    assert any("disk cap larger than the volume" in p and "capPerRank" in p for p in s.problems)


def test_disk_with_no_room_is_a_problem():
    s = sized(with_disk(size="10Mi"))
    assert any("disk cap leaves no room" in p for p in s.problems)


# --- node fit --------


def _fit(raw: dict, node_bytes: int | None = None) -> tuple[str, ...]:
    """The node fit derive computes once (against the smaller of the nodeMemory hint and the nodes seen)."""
    return derived({"spec": raw}, node_bytes).fit


def test_pod_that_cannot_fit_the_node_is_refused_with_numbers_and_a_fix_that_works():
    raw = example()
    raw["runtime"]["nodeMemory"] = "120Gi"
    s = sized(raw)
    (problem,) = _fit(raw)
    assert "has 120Gi allocatable" in problem and f"needs {units.binary(s.pod_memory_limit_bytes)} memory" in problem
    assert "180388626432" not in problem and "GiB" not in problem  # sizes for people, never raw bytes
    suggested = int(problem.split("hostMemoryPerRankGB to ")[1].split()[0])
    raw["hicache"]["hostMemoryPerRankGB"] = suggested
    assert not sized(raw).problems and not _fit(raw)


def test_the_fit_is_checked_once_against_the_smallest_known_node():
    raw = example()
    raw["runtime"]["nodeMemory"] = "2Ti"
    assert _fit(raw) == () and len(_fit(raw, 120 * GIB)) == 1 and "120Gi" in _fit(raw, 120 * GIB)[0]
    raw["runtime"]["nodeMemory"] = "100Gi"
    (problem,) = _fit(raw, 120 * GIB)
    assert "100Gi allocatable" in problem


def test_check_fit_is_silent_without_a_hint_or_when_it_fits():
    s = sized(example())
    assert check_fit(s, None) == [] and check_fit(s, s.pod_memory_limit_bytes) == []


# --- input that cannot be sized --------


def test_incomplete_geometry_is_a_sizing_error():
    raw = example()
    raw["model"] = {**raw["model"], "profile": None, "geometry": {"fullAttentionLayers": 4}}
    with pytest.raises(SizingError, match="incomplete"):
        sized(raw)


def test_host_size_of_zero_with_no_ratio_is_a_sizing_error():
    raw = example()
    raw["hicache"]["hostMemoryPerRankGB"] = 0.5
    with pytest.raises(SizingError, match="0 GB.*no hostRatio"):
        sized(raw)
    spec = QwenHiCacheServerSpec.model_validate(example())
    zero = spec.model_copy(
        update={"hicache": spec.hicache.model_copy(update={"host_memory_per_rank_gb": 0.0})}
    )
    with pytest.raises(SizingError, match="0 GB"):
        compute_sizing(zero)


def test_device_pool_cannot_be_estimated_without_weights_or_a_log():
    raw = example()
    del raw["hicache"]["deviceKVTokens"]
    cfg = json.loads((HF / "qwen3_next" / "config.json").read_text())
    raw["model"] = {**raw["model"], "profile": None, "geometry": from_hf_config(cfg).wire()}
    with pytest.raises(SizingError, match="deviceKVTokens"):
        sized(raw)


# --- the runtime's own source, when the pinned wheel is at hand --------


def wheel_source(path: str) -> str:
    if not WHEEL.exists():
        pytest.skip("pinned sglang wheel not available")
    with zipfile.ZipFile(WHEEL) as whl:
        return whl.read(f"sglang/srt/{path}").decode()


def test_runtime_reserve_and_rounding_match_the_wheel():
    base = wheel_source("mem_cache/pool_host/base.py")
    tree = ast.parse(base)
    reserve = next(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "HICACHE_HOST_MEMORY_RESERVE_BYTES"
    )
    assert eval(compile(ast.Expression(reserve), "base", "eval")) == 10 * GIB  # noqa: S307 - a literal
    assert "int(host_size * 1e9 // self.size_per_token)" in base
    assert "self.page_num = self.size // self.page_size + 1" in base
    assembler = wheel_source("mem_cache/hybrid_cache/hybrid_pool_assembler.py")
    assert "hicache_size * size_bytes / total_device_pool_size" in assembler
    assert "kv_host_size *= kv_bytes / (kv_bytes + index_bytes)" in assembler
    memory = wheel_source("arg_groups/fields/memory.py")
    assert "hicache_size: A[\n        int," in memory


def test_spec_copy_is_not_mutated():
    raw = example()
    before = copy.deepcopy(raw)
    sized(raw)
    assert raw == before


def test_explicit_host_mamba_slots_take_the_whole_size_for_kv() -> None:
    """Series patch 0002: N slots + 1 pad; `--hicache-size` split among the KV-side pools alone."""
    from qwen_hicache.launch import launch_args

    raw = example()
    raw["hicache"]["hostMambaSlotsPerRank"] = 64
    explicit = QwenHiCacheServerSpec.model_validate(raw)
    a, b = sized(example()), compute_sizing(explicit)
    assert b.host.mamba_slots == 65
    assert b.host.kv_tokens > a.host.kv_tokens
    kv_plus_index = b.host.kv_bytes + b.host.index_bytes
    # the runtime scales the KV share by device kv / (kv + target and draft keys), so the index takes a bit more
    # of the size on the device side than it gets on the host: 29.7 of 30 GB are spent
    assert 29.5e9 < kv_plus_index <= 30e9 + 64 * b.shapes.kv_bytes_per_token + b.shapes.index_bytes_per_page
    args = launch_args(explicit, launch_sizing(b))
    assert args[args.index("--hicache-mamba-host-slots") + 1] == "64"


# --- the file count the cap implies (one flat HiCacheFile directory per rank) --------


def test_status_reports_the_page_files_per_rank_by_pool():
    s = sized(example())
    status = s.as_status().wire()
    pages = status["pagesPerRank"]
    assert status["filesPerRankByPool"] == {"kv": pages, "indexer": pages, "mamba": pages}
    assert status["filesPerRank"] == 3 * pages and pages * s.shapes.mamba_bytes_per_slot <= s.disk.cap_bytes_per_rank
    assert not any("page files per rank" in n for n in s.notes)


def test_a_cap_that_implies_millions_of_files_is_warned_about():
    raw = example()
    raw["hicache"]["disk"] = {**raw["hicache"]["disk"], "capPerRank": "20Ti", "size": "46Ti"}
    s = sized(raw)
    assert s.disk_files is not None and s.disk_files.files > 2_000_000
    assert any("ENOSPC" in n and "page files per rank" in n for n in s.notes)
    assert not s.problems  # a warning, not a refusal


def test_a_pod_of_a_multi_node_replica_is_sized_for_its_own_ranks() -> None:
    """Per-rank pools follow the whole TP size (its head split); the pod's memory, shm, disk volume and flush
    budget count only the ranks on that pod: tensorParallelSize / nodesPerReplica."""
    from qwen_hicache import derive as derive_mod
    from qwen_hicache.fingerprint import fingerprint_inputs
    from qwen_hicache.geometry import resolve_geometry
    from qwen_hicache.plan import parse_spec

    base = {"spec.runtime.tensorParallelSize": 4, "spec.hicache.hostMemoryPerRankGB": 16,
            "spec.hicache.disk": {"enabled": True, "capPerRank": "100Gi"}}  # fmt: skip
    one, two = (parse_spec(variant(**base, **extra)["spec"]) for extra in ({}, {"spec.nodesPerReplica": 2}))
    s1, s2 = compute_sizing(one), compute_sizing(two)
    assert s1.host == s2.host and s1.shapes == s2.shapes  # the same ranks, wherever they run
    terms1, terms2 = ({t.name: t.bytes for t in s.terms} for s in (s1, s2))
    assert terms2["hostPools"] == 2 * s2.host.total_bytes and terms1["hostPools"] == 4 * s1.host.total_bytes
    assert s2.pod_ranks == 2 and s2.pod_memory_limit_bytes < s1.pod_memory_limit_bytes
    assert s2.shm_bytes < s1.shm_bytes
    assert s2.disk.cap_bytes_per_rank == s1.disk.cap_bytes_per_rank
    assert s2.disk.volume_bytes < s1.disk.volume_bytes  # two ranks' caps per volume, not four
    assert s2.as_status().host_bytes_per_pod == 2 * s2.host.total_bytes
    g = resolve_geometry(two.model)
    assert "nodes" not in fingerprint_inputs(one, g)
    assert fingerprint_inputs(two, g)["nodes"] == 2 and fingerprint_inputs(two, g)["ranksPerNode"] == 2
    d1, d2 = derive_mod.derive(one, g), derive_mod.derive(two, g)
    assert d2.layout.drain.flush_seconds <= d1.layout.drain.flush_seconds
    assert d1.layout.fingerprint != d2.layout.fingerprint
