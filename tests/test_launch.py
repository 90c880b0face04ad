"""Launch-flag derivation: every spec field that matters reaches the runtime, exactly once."""

from __future__ import annotations

from qwen_hicache.cli import offline_meta
from qwen_hicache.launch import JIT_CACHE_ENV, LaunchSizing, launch_args, launch_env
from qwen_hicache.plan import parse_spec, plan
from resources import derived, example, variant

SIZING = LaunchSizing(30, 1 << 30, 2 << 30, 1 << 29, 123, 456)


def _flags(doc: dict, sizing: LaunchSizing = SIZING) -> dict[str, str | None]:
    args = launch_args(parse_spec(doc["spec"]), sizing)
    out: dict[str, str | None] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_example_flags() -> None:
    f = _flags(example())
    assert f["--tp-size"] == "2" and f["--page-size"] == "64" and f["--kv-cache-dtype"] == "fp8_e4m3"
    assert f["--hicache-size"] == "30" and "--hicache-ratio" not in f
    assert f["--hicache-write-policy"] == "write_through"
    assert f["--hicache-mem-layout"] == "page_first" and f["--hicache-io-backend"] == "kernel"
    assert f["--hicache-storage-backend"] == "file"
    assert f["--hicache-storage-prefetch-policy"] == "wait_complete"
    assert f["--speculative-algorithm"] == "NEXTN" and f["--speculative-num-draft-tokens"] == "4"
    assert f["--mamba-ssm-dtype"] == "bfloat16"
    assert f["--model-path"] == "/models/Qwen3.8-Flash-Next"
    for flag in ("--enable-hierarchical-cache", "--enable-metrics", "--enable-cache-report"):
        assert flag in f


def test_ratio_when_no_host_size_and_sized_mamba_slots_always_passed() -> None:
    doc = variant(**{"spec.hicache.hostMemoryPerRankGB": None, "spec.hicache.hostRatio": 3.0,
                     "spec.runtime.maxMambaCacheSize": None})
    p = plan(offline_meta(doc), doc["spec"])
    args = p.launch.args
    assert args[args.index("--hicache-ratio") + 1] == "3.0" and "--hicache-size" not in args
    assert args[args.index("--max-mamba-cache-size") + 1] == str(p.sizing.wire()["deviceMambaSlotsPerRank"])


def test_no_disk_tier_no_storage_flags_or_env() -> None:
    doc = variant(**{"spec.hicache.disk": {"enabled": False}})
    f = _flags(doc)
    assert "--hicache-storage-backend" not in f and "--hicache-storage-prefetch-policy" not in f
    env = launch_env(parse_spec(doc["spec"]), SIZING, "v1-x", "s", 1, 0)
    assert not {e["name"] for e in env} & {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "QWEN_HICACHE_FINGERPRINT"}


def test_extra_args_come_last_and_unset_optionals_are_omitted() -> None:
    doc = variant(**{"spec.runtime.extraArgs": ["--log-level", "debug"], "spec.runtime.contextLength": None,
                     "spec.runtime.speculative": None})
    args = launch_args(parse_spec(doc["spec"]), SIZING)
    assert args[-2:] == ["--log-level", "debug"]
    assert "--context-length" not in args and "--speculative-algorithm" not in args


def test_each_flag_appears_once() -> None:
    args = [a for a in launch_args(parse_spec(example()["spec"]), SIZING) if a.startswith("--")]
    assert len(args) == len(set(args))


def test_managed_flags_cover_derived_ones() -> None:
    assert {"--tp-size", "--hicache-size", "--hicache-ratio", "--page-size"} <= derived(example()).managed_flags


def test_the_stated_device_pool_is_rendered_page_aligned_and_an_estimated_one_is_not() -> None:
    """The runtime must build the device pool the host pools were sized against (docs/sizing.md)."""
    stated = derived(variant(**{"spec.hicache.deviceKVTokens": 65_630}))
    assert stated.args[stated.args.index("--max-total-tokens") + 1] == "65600"  # page 64: whole pages only
    assert stated.sizing.device.kv_tokens == 65_600
    estimated = derived(variant(**{"spec.hicache.deviceKVTokens": None}))
    assert "--max-total-tokens" not in estimated.args


def test_compile_caches_live_on_the_volume_per_namespace_unless_the_spec_sets_them() -> None:
    env = {e["name"]: e.get("value") for e in launch_env(parse_spec(example()["spec"]), SIZING, "v1-x", "s", 1, 0)}
    assert env["TRITON_CACHE_DIR"] == "/var/cache/hicache/.jit/v1-x/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/hicache/.jit/v1-x"
    assert {k for k, _ in JIT_CACHE_ENV} <= set(env) and "SGLANG_CACHE_DIR" not in env
    own = variant(**{"spec.runtime.env": [{"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"}]})
    got = [e for e in launch_env(parse_spec(own["spec"]), SIZING, "v1-x", "s", 1, 0) if e["name"] == "TRITON_CACHE_DIR"]
    assert got == [{"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"}]
    off = variant(**{"spec.hicache.disk": {"enabled": False}})
    names = {e["name"] for e in launch_env(parse_spec(off["spec"]), SIZING, "v1-x", "s", 1, 0)}
    assert not names & {k for k, _ in JIT_CACHE_ENV}  # no volume: the container's own filesystem, as before
