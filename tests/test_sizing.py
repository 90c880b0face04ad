"""Sizing: calibration against the measured Flash-Next run, a matrix against an independent restatement of the
runtime's pools, pod memory, disk tier, node fit and the errors for input that cannot be sized."""

from __future__ import annotations

import ast
import copy
import itertools
import json
import math
import zipfile
from pathlib import Path

import pytest
import yaml
from qwen_hicache.geometry import from_hf_config
from qwen_hicache.sizing import GIB, SizingError, check_fit, compute_sizing
from qwen_hicache.sizing_report import render_table
from qwen_hicache.spec import QwenHiCacheServerSpec

ROOT = Path(__file__).parent.parent
HF = Path(__file__).parent / "data" / "hf"
WHEEL = Path.home() / ".cache/qwen-hicache/wheels/sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"

MEASURED_HOST_KV_TOKENS = 2_541_440
MEASURED_HOST_MAMBA_SLOTS = 371


def example() -> dict:
    return yaml.safe_load((ROOT / "examples" / "qwenhicache.yaml").read_text())["spec"]


def sized(raw: dict):
    return compute_sizing(QwenHiCacheServerSpec.model_validate(raw))


def within(value: int, target: int, tolerance: float = 0.005) -> bool:
    return abs(value - target) <= tolerance * target


# --- an independent restatement of sglang 0.5.23's pools, written as the tensor shapes they allocate --------


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def layer_kinds(t: dict) -> tuple[int, int]:
    kinds = t.get("layer_types") or [
        "full_attention" if (i + 1) % t.get("full_attention_interval", 4) == 0 else "linear_attention"
        for i in range(t["num_hidden_layers"])
    ]
    full = sum(k != "linear_attention" for k in kinds)
    return full, len(kinds) - full


def reference(
    cfg: dict,
    *,
    tp,
    kv_item,
    ssm_item,
    mtp,
    page,
    size_gb,
    ratio,
    dev_tokens,
    slots,
    reqs,
    draft,
    snapshots=True,
):
    """(host KV tokens, host Mamba slots, host bytes) per rank, from shapes as the runtime builds them."""
    t = text_config(cfg)
    full, linear = layer_kinds(t)
    heads = max(1, t["num_key_value_heads"] // tp)
    hd = t["head_dim"]
    kv_layers = full + (t.get("mtp_num_hidden_layers", 0) if mtp else 0)
    # MHATokenToKVPoolHost.get_size_per_token; device k/v buffers: (size + page, heads, head_dim) per layer
    host_kv_token = (hd + hd) * heads * kv_layers * kv_item
    dev_kv = 2 * full * math.prod((dev_tokens + page, heads, hd)) * kv_item
    # Mamba2StateShape.create
    nk, nv, kd, vd, kern = (
        t[k]
        for k in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        )
    )
    groups = nk + (tp - nk if nk % tp else 0)
    conv = ((vd * nv + 2 * groups * kd) // tp, kern - 1)
    temporal = (nv // tp, vd, kd)
    # MambaPool: conv/temporal (L, size+1, ...); verify scratch (L, reqs+1, D, ...)
    dev_mamba = linear * (slots + 1) * (math.prod(conv) * 2 + math.prod(temporal) * ssm_item)
    if mtp:
        dev_mamba += linear * (reqs + 1) * draft * math.prod(conv) * 2
        if snapshots:
            dev_mamba += linear * (reqs + 1) * draft * math.prod(temporal) * ssm_item
    # MambaPoolHost.get_size_per_token (+ PLE side-state rows registered on the slot)
    ple = 0
    if t.get("ple_layer_ids"):
        ple = t["hidden_size"] * t["hc_count"] * (t["ple_conv_kernel_size"] - 1) * t["ngram_size"] * 2
        ple += (t["ngram_size"] - 1) * 8
    host_slot = (math.prod(conv) * 2 + math.prod(temporal) * ssm_item) * linear + ple
    # QSAIndexerPoolHost: layers x pages x (row bytes x page / ratio)
    item = (
        t["indexer_kv_heads"] * t["indexer_head_dim"] * 2 * page // t["indexer_compress_ratio"]
        if ("indexer_n_heads" in t)
        else 0
    )
    if size_gb:
        kv_share = size_gb * dev_kv / (dev_kv + dev_mamba)
        mamba_share = size_gb * dev_mamba / (dev_kv + dev_mamba)
        if item:
            kv_share *= host_kv_token / (host_kv_token + kv_layers * item / page)
        tokens = (int(kv_share * 1e9 // host_kv_token) // page + 1) * page
        host_slots = int(mamba_share * 1e9 // host_slot) + 1
    else:
        tokens = (int(dev_tokens * ratio) // page + 1) * page
        host_slots = int(slots * ratio) + 1
    host_bytes = tokens * host_kv_token + kv_layers * (tokens // page) * item + host_slots * host_slot
    return tokens, host_slots, host_bytes


# --- calibration --------


def test_calibration_reproduces_the_measured_flash_next_run():
    """TP2, FP8 KV, page 64, bf16 SSM, 512 device slots, 4,342,208 GPU tokens, --hicache-size 30."""
    s = sized(example())
    assert s.host.hicache_size_gb == 30
    assert within(s.host.kv_tokens, MEASURED_HOST_KV_TOKENS), s.host.kv_tokens
    assert within(s.host.mamba_slots, MEASURED_HOST_MAMBA_SLOTS), s.host.mamba_slots


def test_calibration_is_derived_from_geometry_not_constants():
    """The same run re-derived by the reference from a Flash-Next config.json; other geometry moves it."""
    cfg = json.loads((HF / "qwen4_exp" / "config.json").read_text())
    kw = dict(
        tp=2,
        kv_item=1,
        ssm_item=2,
        mtp=True,
        page=64,
        size_gb=30,
        ratio=None,
        dev_tokens=4_342_208,
        slots=512,
        reqs=64,
        draft=4,
        snapshots=False,
    )
    tokens, slots, _ = reference(cfg, **kw)
    s = sized(example())
    assert (s.host.kv_tokens, s.host.mamba_slots) == (tokens, slots)
    raw = example()
    raw["model"]["geometry"] = {"linearNumValueHeads": 32}
    assert sized(raw).host.mamba_slots != s.host.mamba_slots


def test_estimated_device_pool_lands_near_the_measured_one():
    raw = example()
    del raw["hicache"]["deviceKVTokens"]
    s = sized(raw)
    assert s.device.kv_tokens_estimated
    assert within(s.device.kv_tokens, 4_342_208, 0.01)
    assert within(s.host.kv_tokens, MEASURED_HOST_KV_TOKENS, 0.01)


# --- the matrix --------

MODELS = ("qwen3_next", "qwen3_5", "qwen4_exp")
MATRIX = list(
    itertools.product(
        MODELS, (1, 2, 4), ("bf16", "fp8_e4m3"), ("float32", "bfloat16"), (False, True), ("size", "ratio")
    )
)


def matrix_spec(cfg: dict, tp: int, kv: str, ssm: str, mtp: bool, mode: str) -> dict:
    raw = example()
    raw["model"] = {**raw["model"], "profile": None, "geometry": from_hf_config(cfg).wire()}
    raw["runtime"].update(
        tensorParallelSize=tp,
        kvCacheDtype=kv,
        mambaSsmDtype=ssm,
        maxMambaCacheSize=256,
        maxRunningRequests=48,
        pageSize=64,
    )
    if not mtp:
        raw["runtime"].pop("speculative")
    raw["hicache"] = {
        "deviceKVTokens": 1_000_000,
        **({"hostMemoryPerRankGB": 20} if mode == "size" else {"hostRatio": 3.0}),
    }
    return raw


@pytest.mark.parametrize(("model", "tp", "kv", "ssm", "mtp", "mode"), MATRIX)
def test_host_pools_match_the_runtime_restatement(model, tp, kv, ssm, mtp, mode):
    cfg = json.loads((HF / model / "config.json").read_text())
    s = sized(matrix_spec(cfg, tp, kv, ssm, mtp, mode))
    expected = reference(
        cfg,
        tp=tp,
        kv_item=2 if kv == "bf16" else 1,
        ssm_item=4 if ssm == "float32" else 2,
        mtp=mtp,
        page=64,
        size_gb=20 if mode == "size" else 0,
        ratio=3.0,
        dev_tokens=1_000_000,
        slots=256,
        reqs=48,
        draft=4,
    )
    assert (s.host.kv_tokens, s.host.mamba_slots, s.host.total_bytes) == expected
    if mode == "size":
        assert s.host.total_bytes <= 20 * 10**9 * 1.01  # the split spends the size, up to pad page and slot


def test_tp_shards_per_rank_state():
    cfg = json.loads((HF / "qwen3_next" / "config.json").read_text())
    one, four = (sized(matrix_spec(cfg, tp, "bf16", "float32", False, "ratio")).shapes for tp in (1, 4))
    assert one.kv_bytes_per_token == 2 * four.kv_bytes_per_token  # 2 KV heads: 2 at TP1, 1 (not 0.5) at TP4
    assert one.mamba_bytes_per_slot == 4 * four.mamba_bytes_per_slot


# --- pod memory, shm, status, report --------


def test_pod_memory_covers_pools_reserve_and_pinned_ple_table():
    s = sized(example())
    terms = {t.name: t.bytes for t in s.terms}
    assert terms["hostPools"] == 2 * s.host.total_bytes
    assert terms["runtimeReserve"] == 10 * GIB
    assert terms["pleTable"] == 320_000_000 * 160 * 9 // 16  # NVFP4: 4 bits + one fp8 scale per 16
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
    assert s.launch_sizing().host_size_gb == 30
    assert s.host.kv_tokens == sized(example()).host.kv_tokens


def test_status_and_table_carry_every_number_and_term():
    s = sized(example())
    status = s.as_status()
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
    table = render_table(status, title="flash-next")
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


def test_pod_that_cannot_fit_the_node_is_refused_with_numbers_and_a_fix_that_works():
    raw = example()
    raw["runtime"]["nodeMemory"] = "120Gi"
    s = sized(raw)
    (problem,) = s.problems
    assert "120.0 GiB" in problem and f"{s.pod_memory_limit_bytes / GIB:,.1f} GiB" in problem
    suggested = int(problem.split("hostMemoryPerRankGB to ")[1].split()[0])
    raw["hicache"]["hostMemoryPerRankGB"] = suggested
    assert not sized(raw).problems


def test_check_fit_is_silent_without_a_hint_or_when_it_fits():
    s = sized(example())
    assert check_fit(s, None) == [] and check_fit(s, s.pod_memory_limit_bytes) == []


# --- input that cannot be sized --------


def test_incomplete_geometry_is_a_sizing_error():
    raw = example()
    raw["model"] = {**raw["model"], "profile": None, "geometry": {"fullAttentionLayers": 4}}
    with pytest.raises(SizingError, match="incomplete"):
        sized(raw)


def test_page_size_the_qsa_ratio_does_not_divide_is_a_sizing_error():
    raw = example()
    raw["runtime"]["pageSize"] = 2
    raw["runtime"].pop("speculative")
    with pytest.raises(SizingError, match="compress ratio 4"):
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
    assert 29.9e9 < kv_plus_index <= 30e9 + 64 * b.shapes.kv_bytes_per_token + b.shapes.index_bytes_per_page
    args = launch_args(explicit, b.launch_sizing())
    assert args[args.index("--hicache-mamba-host-slots") + 1] == "64"
