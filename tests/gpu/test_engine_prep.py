"""What of the GPU engine run (tests/gpu/run_engine.py) can be checked without a GPU.

The tiny checkpoint's config and tokenizer build deterministically and agree with the spec's geometry; the wheel
manifest pins every wheel by version and sha256 as the runtime lock (and the router image's lock) does; the command
line the run starts is the operator's rendered one; the whole sequence (cold, preStop + SIGTERM, the rollout's warm
check, a changed fingerprint, damaged pages) and the router part (two pods behind the real smg, rolled with the
router seam) run end to end against the engine stand-in, so the GPU lease only meets the engine.
"""

from __future__ import annotations

import ast
import json
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import engine_pod  # noqa: E402
import engine_wheels  # noqa: E402
import run_engine  # noqa: E402
import tiny_model  # noqa: E402

from harness.sim.nameshim import unshare_available  # noqa: E402


def _build(out: Path) -> dict:
    subprocess.run([sys.executable, str(HERE / "tiny_model.py"), "--no-weights", str(out)], check=True,
                   capture_output=True)  # fmt: skip
    return json.loads((out / "manifest.json").read_text())


def test_tiny_config_and_tokenizer_build_deterministically(tmp_path: Path) -> None:
    a, b = _build(tmp_path / "a"), _build(tmp_path / "b")
    assert a == b
    assert set(a["files"]) == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    text = tiny_model.CORPUS.read_text()[:4000]
    assert tok.decode(tok(text).input_ids) == text
    assert tok.eos_token_id == 0 == tiny_model.config()["text_config"]["eos_token_id"]
    assert len(tok) <= tiny_model.VOCAB


def test_tiny_config_is_the_architecture_at_a_small_size() -> None:
    text = tiny_model.text_config()
    assert tiny_model.config()["architectures"] == ["Qwen4ExpForConditionalGeneration"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]  # fmt: skip
    assert text["hc_count"] > 1 and text["ple_layer_ids"] == [2] and text["mtp_num_hidden_layers"] == 1
    assert text["indexer_budget"] // text["indexer_compress_ratio"] in (512, 2048)  # the runtime's fast_topk_v2


def test_deep_scale_is_flash_next_at_its_own_widths_and_depth() -> None:
    """The TTFT model (`--wide-scale deep`): every width and the layer pattern as Flash-Next's own config has them."""
    real = json.loads((REPO / "tests/data/hf/qwen4_exp/config.json").read_text())["text_config"]
    deep = tiny_model.text_config("deep")
    same = ("hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "indexer_n_heads", "indexer_head_dim", "ple_embed_dim", "hc_count")  # fmt: skip
    assert {k: deep[k] for k in same} == {k: real[k] for k in same}


def test_full_index_scale_keeps_every_block_of_an_8k_prompt() -> None:
    """The token-identity diagnostic: the deep model, but its top-k (a k the runtime has) covers 8,192 tokens."""
    deep, full = tiny_model.text_config("deep"), tiny_model.text_config("deep-full-index")
    assert full["indexer_budget"] // full["indexer_compress_ratio"] == 2048
    assert full["indexer_budget"] >= 8192 and {**full, "indexer_budget": deep["indexer_budget"]} == deep


def test_flat_router_zeroes_the_routers_only() -> None:
    layer = "model.language_model.layers.0.mlp."
    router = tiny_model._values(layer + "gate.weight", (8, 16), "bfloat16", flat_router=True)
    shared = tiny_model._values(layer + "shared_expert_gate.weight", (1, 16), "bfloat16", flat_router=True)
    assert not router.any() and shared.any()
    assert tiny_model._values(layer + "gate.weight", (8, 16), "bfloat16").any()


def test_spec_geometry_is_what_the_operator_derives_from_the_tiny_config() -> None:
    from qwen_hicache.geometry import from_hf_config

    spec = yaml.safe_load(engine_pod.SPEC.read_text())["spec"]
    derived = from_hf_config(tiny_model.config()).model_dump(by_alias=True, exclude_none=True)
    stated = dict(spec["model"]["geometry"])
    stated.pop("gpuWeightBytes")
    assert stated == derived


def test_wheel_manifest_pins_every_wheel_as_the_runtime_lock_does() -> None:
    rows = engine_wheels.manifest()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    lock = (REPO / "runtime_patches" / "requirements.lock").read_text()
    pinned = {m.group(1): m.group(2) for m in re.finditer(r"^([a-z0-9][a-z0-9.-]*)==(\S+)", lock, re.M)}
    outside_lock = {"decorator", "importlib-metadata", "zipp", "kubernetes", "durationpy", "websocket-client",
                    "requests-oauthlib", "oauthlib", "smg"}  # fmt: skip
    router_lock = (REPO / "images" / "router" / "requirements.lock").read_text()
    smg = next(r for r in rows if r["name"] == "smg")
    assert f"smg=={smg['version']} --hash=sha256:{smg['sha']}" in router_lock
    for r in rows:
        assert re.fullmatch(r"[0-9a-f]{64}", r["sha"]) and r["file"].endswith(".whl")
        assert r["file"].lower().replace("_", "-").startswith(f"{r['name']}-{r['version']}-")
        if r["name"] in outside_lock:
            continue
        assert pinned.get(r["name"]) == r["version"], r["name"]
        block = lock[lock.index(f"\n{r['name']}=={r['version']}") + 1 :].split("\n", 1)[1]
        end = re.search(r"^\S", block, re.M)
        block = block[: end.start() if end else len(block)]
        assert f"sha256:{r['sha']}" in block, f"{r['file']}: hash not in the lock"
    for must in ("sglang", "sglang-kernel", "torch", "nvidia-nccl-cu13", "transformers", "kubernetes",
                 "flashinfer-python"):
        assert must in names
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"kubernetes==' + next(r["version"] for r in rows if r["name"] == "kubernetes") + '"' in pyproject
    assert set(engine_wheels.SLIM) == set(engine_wheels.SLIM_SHA256) <= {r["file"] for r in rows}
    assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha in engine_wheels.SLIM_SHA256.values())


def test_the_site_takes_the_machines_headers_it_lacks_and_cuda_home_accepts_it(tmp_path: Path) -> None:
    """STAND-IN (link_machine_headers): the carried site has no nvidia-cublas, so cuda-home.sh would refuse it; the
    machine's own nvidia/cu13/include entries the site lacks are linked in (cublasLt.h among them), no other is
    touched, and a second run links nothing more but still says where cublasLt.h comes from."""
    site, machine = tmp_path / "site", tmp_path / "torch" / "nvidia"
    nv = site / "nvidia" / "cu13"
    for f in ("bin/nvcc", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/crt/host_defines.h",
              "include/cccl/cuda/std/version", "include/curand.h", "lib/libcudart.so.13"):  # fmt: skip
        (nv / f).parent.mkdir(parents=True, exist_ok=True)
        (nv / f).write_text("site")
    for f in ("cublasLt.h", "cublas_api.h", "curand.h", "cudnn/cudnn.h"):
        (machine / "cu13" / "include" / f).parent.mkdir(parents=True, exist_ok=True)
        (machine / "cu13" / "include" / f).write_text("machine")
    script = ["sh", str(REPO / "images" / "runtime" / "cuda-home.sh"), str(site), str(tmp_path / "cuda")]
    assert subprocess.run(script, capture_output=True, text=True).returncode == 1  # no cublasLt.h: refused
    got = run_engine.link_machine_headers(site, [machine, site / "nvidia"])  # the site's own directory is skipped
    assert got == {"linked_machine_headers": 3, "machine_include": [str(machine / "cu13" / "include")],
                   "cublasLt_from_machine": True}  # fmt: skip
    assert (nv / "include" / "curand.h").read_text() == "site" and not (nv / "include" / "curand.h").is_symlink()
    assert (nv / "include" / "cudnn").is_symlink() and (nv / "include" / "cublasLt.h").read_text() == "machine"
    subprocess.run(script, check=True, capture_output=True)
    assert (tmp_path / "cuda" / "include" / "cublasLt.h").read_text() == "machine"
    again = run_engine.link_machine_headers(site, [machine])
    assert again["linked_machine_headers"] == 0 and again["cublasLt_from_machine"]
    assert run_engine.link_machine_headers(tmp_path / "empty", [machine])["linked_machine_headers"] == 0


def test_the_run_starts_the_command_line_the_operator_renders(tmp_path: Path) -> None:
    site, model, root = tmp_path / "site", tmp_path / "model", tmp_path / "hicache"
    site.mkdir()
    p = engine_pod.plan(site, engine_pod.spec_file(tmp_path, 1), model, root, 31234)
    docs = engine_pod.rendered(site, engine_pod.SPEC)
    server = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    rendered = server["command"] + server["args"]
    assert len(p["argv"]) == len(rendered)
    differ = {i for i, (a, b) in enumerate(zip(p["argv"], rendered, strict=True)) if a != b}
    named = {rendered.index(f) + 1 for f in ("--model-path", "--host", "--port")}
    key = next(i for i, a in enumerate(rendered) if a.startswith("--admin-api-key="))
    assert differ <= named | {key}
    assert p["argv"][p["argv"].index("--model-path") + 1] == str(model)
    assert p["argv"][p["argv"].index("--host") + 1] == "127.0.0.1"
    for flag in ("--enable-hierarchical-cache", "--disable-cuda-graph", "--enable-metrics", "--enable-cache-report"):
        assert flag in p["argv"]
    assert p["argv"][p["argv"].index("--hicache-storage-backend") + 1] == "file"
    assert p["cache_dir"] == str(root / p["fingerprint"])
    assert p["env"]["QWEN_HICACHE_FINGERPRINT"] == p["fingerprint"]
    p2 = engine_pod.plan(site, engine_pod.spec_file(tmp_path, 2), model, root, 31234)
    assert p2["argv"][p2["argv"].index("--tp-size") + 1] == "2" and p2["fingerprint"] != p["fingerprint"]
    p3 = engine_pod.plan(site, engine_pod.spec_file(tmp_path, 1, kvCacheDtype="bfloat16"), model, root, 31234)
    assert p3["fingerprint"] != p["fingerprint"]
    engine_pod.DROP_ARGS[:] = ["--disable-cuda-graph"]  # run_engine.py --cuda-graph
    try:
        p4 = engine_pod.plan(site, engine_pod.spec_file(tmp_path, 1), model, root, 31234)
    finally:
        engine_pod.DROP_ARGS[:] = []

    def bare(argv: list[str]) -> list[str]:
        return [a for a in argv if a != "--disable-cuda-graph" and not a.startswith("--admin-api-key=")]

    assert "--disable-cuda-graph" not in p4["argv"] and bare(p4["argv"]) == bare(p["argv"])
    assert p4["fingerprint"] == p["fingerprint"]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """run_engine.py against the engine stand-in, on loopback addresses of its own (the machine is shared)."""
    net = random.randint(100, 250)
    site, model, out = tmp_path / "site", tmp_path / "model", tmp_path / "out"
    site.mkdir()
    _build(model)
    cmd = [sys.executable, str(HERE / "run_engine.py"), "--site", str(site), "--work", str(tmp_path / "work"),
           "--out", str(out), "--model-dir", str(model), "--prompt-chars", "2000", "--fillers", "2",
           "--engine-cmd", f"{sys.executable} -m harness.sim.engine", "--engine-path", str(REPO),
           "--host", f"127.{net}.1.1", "--router-net", str(net), *extra]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=450)
    return r, json.loads((out / "engine-tp1.json").read_text())


@pytest.mark.timeout(480)
def test_the_whole_sequence_runs_against_the_engine_stand_in(tmp_path: Path) -> None:
    """SIMULATED engine (harness/sim/engine.py, the real HiCacheFile underneath): the run's own logic only."""
    stale = tmp_path / "work" / "hicache-wide" / "left-by-an-earlier-wide-step"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier call's namespace")
    r, report = _run(tmp_path, "--parts", "engine", "--wide", "--wide-scale", "deep", "--flat-router",
                     "--switch-interval", "0.0002", "--third-env", "SGLANG_HICACHE_PREFETCH_POLL_INTERVAL=0",
                     "--wide-host-gb", "8", "--profile", "--wide-runtime", "kvCacheDtype=bfloat16")  # fmt: skip
    bad = {k: v for k, v in report["steps"].items() if v["status"] != "ok"}
    assert r.returncode == 0 and not bad, r.stdout[-3000:] + json.dumps(bad)[:3000]
    assert "cuda_home" not in report  # the stand-in compiles nothing: no CUDA_HOME, no headers linked
    first = report["restarts"][0]
    assert first["warm"] and first["storage_hit_tokens"] > 0 and first["all_identical"]
    assert [s.split()[0] for s in report["rollout"]["steps"]] == ["canary", "delete", "baseline", "verify"]
    assert report["stop_warm"]["prestop_output"].startswith("flush: 200") and report["stop_warm"]["exit_code"] == 0
    fc = report["fingerprint_change"]
    assert fc["old"] != fc["new"] and fc["storage_hit_tokens"] == 0 and fc["old_dir_unchanged"]
    assert report["damage"] == {"zeroed": "miss", "bitflip": "miss", "truncated": "miss"}
    assert report["damage_detail"]["others_still_hit"]
    wide = report["wide"]
    assert wide["storage_hit_tokens"] > 0 and wide["tokens_identical"] == wide["prompts"] == 4
    assert wide["fingerprint"] != report["launch"]["fingerprint"]  # its own geometry: its own namespace
    assert wide["scale"] == "deep" and wide["dims"]["num_hidden_layers"] == 48 and wide["flat_router"]
    assert wide["runtime_overrides"] == {"kvCacheDtype": "bfloat16"}  # rendered as the spec field, a new namespace
    assert wide["disk_read"]["bytes"] > 0 and wide["restore"]["storage_tokens"] == wide["storage_hit_tokens"]
    assert not stale.exists()  # the cold process starts on an empty volume, whatever a step before left there
    assert run_engine.storage_hits(wide["per_request"]["cold"]) == 0
    rec = run_engine.bench_record(report)
    assert tuple(rec) == run_engine.RECORD_KEYS and rec["damage"] == report["damage"] and rec["router"] is None
    assert rec["wide"]["ttft_cold_s"] == wide["ttft_cold_s"] and "--disable-cuda-graph" in rec["wide"]["extra_args"]
    assert rec["wide"]["runtime_overrides"] == wide["runtime_overrides"]
    assert rec["wide"]["start_cold_s"] > 0 and rec["wide"]["start_warm_s"] > 0 and rec["server_startup"] is None
    assert rec["wide"]["prefetch_wait_s"] is not None and rec["wide"]["ttft_after_prefetch_s"] > 0
    # the steady pass (other documents, kernels compiled), the device-hit reference and the cache's own metrics
    assert wide["storage_hit_tokens_steady"] > 0 and wide["disk_vs_cold_steady"] is not None
    assert wide["vs_reuse"]["prompts"] == wide["reuse_repeat"]["prompts"] == 4
    assert any(ln.startswith("sglang:cached_tokens_total") for ln in wide["metrics"])
    assert wide["sampled"]["ok"] and rec["wide"]["sampled"] == wide["sampled"]  # a top-k/top-p request answered
    assert json.loads(json.dumps(rec, allow_nan=False))["wide"]["vs_reuse"]["prompts"] == 4
    third = wide["third"]
    assert third["switch_interval_s"] == 0.0002 and third["env"] == {"SGLANG_HICACHE_PREFETCH_POLL_INTERVAL": "0"}
    assert third["storage_hit_tokens"] > 0 and third["ttft_disk_s"] is not None and third["prefetch_wait_s"] >= 0
    assert len(wide["per_request"]["disk_third"]) == 8 and rec["wide"]["third"]["env"] == third["env"]
    # the host tier above the device pool, and each phase's stacks sampled in the server processes
    assert wide["host_kv_tokens"] > wide["device_kv_tokens"] == 65536
    assert {"cold", "reuse", "disk-warm"} <= set(wide["profile"])
    assert any(t["samples"] > 0 for t in wide["profile"]["disk-warm"].values())


@pytest.mark.timeout(480)
@pytest.mark.skipif(not unshare_available(), reason="the cluster-DNS stand-in needs root and `unshare -m`")
def test_two_pods_behind_the_real_router_roll_warm_and_keep_their_conversations(tmp_path: Path) -> None:
    """SIMULATED engine behind the REAL smg (the rendered flags and manifest): the router part's own logic."""
    r, report = _run(tmp_path, "--parts", "router", "--router-prompt-chars", "1500")
    bad = {k: v for k, v in report["steps"].items() if v["status"] != "ok"}
    assert r.returncode == 0 and not bad, r.stdout[-3000:] + json.dumps(bad)[:3000]
    rt = report["router"]
    assert rt["spread"] == [0, 1], rt["landed_before"]  # conversations on both replicas
    assert rt["stayed"] and rt["warm"] == {"tiny-qwen4-exp-0": True, "tiny-qwen4-exp-1": True}
    assert [s.split()[:2] for s in rt["rollout"]["steps"] if "deferred" not in s] == [
        ["canary", "tiny-qwen4-exp-1"], ["delete", "tiny-qwen4-exp-1"], ["baseline", "tiny-qwen4-exp-1"],
        ["verify", "tiny-qwen4-exp-1"], ["canary", "tiny-qwen4-exp-0"], ["delete", "tiny-qwen4-exp-0"],
        ["baseline", "tiny-qwen4-exp-0"], ["verify", "tiny-qwen4-exp-0"]]  # fmt: skip
    for pod in ("tiny-qwen4-exp-0", "tiny-qwen4-exp-1"):
        assert rt["rollout"]["pods"][pod]["stop"]["prestop_output"].startswith("flush: 200")
    # before each delete the router had stopped routing to the pod (its own GET /workers), and both came back
    assert rt["workers_after"] == {"tiny-qwen4-exp-0": "ready", "tiny-qwen4-exp-1": "ready"}
    assert rt["storage_tokens_after"] > 0
    rec = run_engine.bench_record(report)["router"]
    assert rec["stayed"] and rec["replicas"] == 2 and rec["conversations"] == 8


def test_reuse_figures_pick_the_passes_by_what_they_found_cached() -> None:
    """As on the H100: the first repeat found nothing cached (a full recompute), the next ones device hits."""

    def row(ids: list[int], device: int = 0) -> list[dict]:
        return [{"ids": ids, "cached": {"device": device, "storage_backend": "HiCacheFile"} if device else {},
                 "first_top": {1: -0.5}, "first_probe": {7: -1.0}}]  # fmt: skip

    cold, warm = [row([1, 2])], [row([1, 3])]
    reuse = [[row([1, 2])], [row([1, 3], device=64)], [row([1, 3], device=64)]]
    got = run_engine.reuse_figures(cold, reuse, warm)
    assert got["recompute_repeat"]["tokens_identical"] == 1 and got["reuse_repeat"]["all_identical"]
    assert got["vs_reuse"]["all_identical"] and got["vs_reuse"]["same_cached_identical"] is None  # warm: no hit
    assert run_engine.reuse_figures(cold, reuse[:1], warm) == {"vs_reuse": None, "reuse_repeat": None,
                                                               "recompute_repeat": got["recompute_repeat"]}


def test_prefetch_rates_are_the_restored_bytes_over_the_prefetch_waits_of_the_same_documents() -> None:
    def row(wait: float | None, storage: int = 8384) -> list[dict]:
        return [{"ttft_s": 0.3, "cached": {"storage": storage}, "timing": {"storage_prefetch_wait": wait}}]

    wide = {"restore": {"bytes": 800_000_000}, "disk_read_gbps": 2.0,
            "per_request": {"disk_warm": [row(0.2), row(0.2)], "disk_steady": [row(0.1)],
                            "disk_third": [row(0.4), row(0.4), row(0.9)]}}  # fmt: skip
    rates = run_engine.prefetch_rates(wide)
    assert rates["prefetch"] == {"gbps": 2.0, "vs_disk": 1.0}  # 800 MB over 0.4 s
    assert rates["prefetch_third"] == {"gbps": 1.0, "vs_disk": 0.5}  # the same two documents: 0.8 s
    wide["per_request"]["disk_warm"].append(row(0.3, storage=0))  # a recompute among them: no rate to give
    assert run_engine.prefetch_rates(wide)["prefetch"] == {"gbps": None, "vs_disk": None}


def test_lp_split_finds_where_the_numbers_part_before_the_tokens_do() -> None:
    a = {"ids": [5, 6, 7], "lps": [-0.1, -0.2, -0.3]}
    assert run_engine.lp_split(a, dict(a)) is None
    assert run_engine.lp_split(a, {"ids": [5, 6, 7], "lps": [-0.1, -0.25, -0.3]}) == 1  # same tokens, drifted
    assert run_engine.lp_split(a, {"ids": [5, 6, 8], "lps": [-0.1, -0.2, -0.3]}) == 2
    assert run_engine.lp_split({"ids": [5, 6]}, {"ids": [5, 7]}) == 1  # no log-probs: the tokens alone
    assert run_engine.compare([[{**a, "first_top": {}}]], [[{**a, "first_top": {}}]])["lp_split_at"] == [None]


def test_ordered_hc_mix_makes_every_server_process_skip_the_atomic_mix(tmp_path: Path) -> None:
    """`--ordered-hc-mix`: the servers' sitecustomize patches the runtime's own hc_mix module as it loads."""
    import os
    from types import SimpleNamespace

    from harness.sim.sglang_tree import patched_sglang_tree

    tree = str(patched_sglang_tree())
    shim, _ = run_engine.server_hooks(SimpleNamespace(work=tmp_path, out=tmp_path / "out", profile=False,
                                                  ordered_hc_mix=True))  # fmt: skip
    code = ("from sglang.kernels.ops.gemm.hc_mix import fused_hc_mix_supported, _deterministic_inference as d\n"
            "import sglang.kernels.ops.gemm.hc_mix as m\nprint(m._deterministic_inference(), d())")  # fmt: skip

    def run(path: list[str]) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.split("\n")[-2]

    assert run([*shim, tree]) == "True True"  # the module's own check, as fused_hc_mix_supported calls it
    assert run([tree]) == "False False"
    assert run_engine.server_hooks(SimpleNamespace(work=tmp_path, out=tmp_path / "o", profile=False,
                                               ordered_hc_mix=False))[0] == ()  # fmt: skip


COLD_LOG = """[2026-12-07 13:00:17] Setting page size to 64 for compressed QSA (full//ratio compressed addressing).
 0%| 0/58[2026-12-07 13:02:32] Capture target prefill CUDA graph end. elapsed=101.14 s, mem usage=6.65 GB
[2026-12-07 13:02:44] Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 5, 6, 7, 8], elapsed=12.16 s, mem
[2026-12-07 13:02:53] Capture draft decode CUDA graph end. elapsed=6.23 s, mem usage=0.01 GB, avail mem=111.11 GB.
[2026-12-07 13:03:23] Engine startup timings (s): load_weight=2.41, kv_cache_allocation=2.51, scheduler_e2e=160.89, \
cuda_graph={prefill=101.14, decode=0.00, target_verify=12.16}, tokenizer_e2e=182.91
[2026-12-07 13:03:24] INFO:     127.0.0.1:40956 - "GET /health HTTP/1.1" 503 Service Unavailable
"""  # the H200 run of 2026-12-07 12:59, shortened; a second process killed during its captures says only those
WARM_LOG = """[2026-12-07 13:04:40] Setting page size to 64 for compressed QSA (full//ratio compressed addressing).
[2026-12-07 13:05:55] Capture target prefill CUDA graph end. elapsed=38.66 s, mem usage=6.65 GB, avail mem=112.99 GB.
"""


def test_startup_phases_come_from_the_servers_own_log_lines_even_when_a_process_was_killed(tmp_path: Path) -> None:
    cold = run_engine.startup_phases(COLD_LOG)
    assert cold["captures"] == {"target_prefill": 101.14, "target_verify": 12.16, "draft_decode": 6.23}
    assert cold["engine"] == {"load_weight": 2.41, "kv_cache_allocation": 2.51, "scheduler_e2e": 160.89,
                              "tokenizer_e2e": 182.91}  # fmt: skip
    assert cold["logged_s"] == 187
    warm = run_engine.startup_phases(WARM_LOG)
    assert warm == {"captures": {"target_prefill": 38.66}, "logged_s": 75}  # no summary: killed before ready
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server-wide-cold.log").write_text(COLD_LOG)
    (logs / "server-wide-warm.log").write_text(WARM_LOG)
    (logs / "router.log").write_text("not a server")
    with tarfile.open(tmp_path / "logs-tp1.tgz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    got = run_engine.logs_startup(run_engine.logs_archive(tmp_path, 1))
    assert got == {"wide-cold": cold, "wide-warm": warm}
    assert run_engine.logs_startup(run_engine.logs_archive(tmp_path / "elsewhere", 1)) == {}


def test_a_pod_restarted_in_one_call_gives_each_process_its_own_start_up_and_calls_do_not_share_logs(
        tmp_path: Path) -> None:
    """A pod's log is appended to (the one-pod sequence restarts `server-0`); the mark engine_pod writes before each
    process splits it. The device machine keeps the work directory between calls: each call empties its logs."""
    mark = run_engine.ep.PROCESS_MARK
    logs = run_engine.fresh_logs(tmp_path)
    (logs / "server-0.log").write_text(f"{mark}0 2026-12-07 13:00:00\n{COLD_LOG}"
                                       f"{mark}0 2026-12-07 13:04:39\n{WARM_LOG}")  # fmt: skip
    with tarfile.open(run_engine.logs_archive(tmp_path, 1), "w:gz") as tar:
        tar.add(logs, arcname="logs")
    got = run_engine.logs_startup(run_engine.logs_archive(tmp_path, 1))
    assert got == {"0": run_engine.startup_phases(COLD_LOG), "0#2": run_engine.startup_phases(WARM_LOG)}
    assert got["0"]["engine"]["scheduler_e2e"] == 160.89 and "engine" not in got["0#2"]
    assert run_engine.processes("") == [""] and run_engine.processes(COLD_LOG) == [COLD_LOG]
    assert list(run_engine.fresh_logs(tmp_path).iterdir()) == []  # the next call starts with none of these


class _Number(float):
    """A value for any expression a log call's f-string holds (`time.perf_counter() - tic` too)."""

    def __getattr__(self, _name: str) -> _Number:
        return self

    def __call__(self, *_args: object, **_kwargs: object) -> _Number:
        return self


class _Values(dict):
    """Any name a log call's f-string reads: a capture's name, else a number for its `:.2f` fields."""

    def __missing__(self, name: str) -> object:
        return "target prefill" if name == "capture_name" else _Number(12.5)


def _runtime_messages(tree: Path, marker: str) -> list[str]:
    """Every string literal or f-string in the runtime's source holding `marker`, evaluated on stand-in values."""
    out = []
    for path in sorted((tree / "sglang").rglob("*.py")):
        text = path.read_text()
        if marker not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.JoinedStr) and marker in ast.unparse(node):
                out.append(eval(compile(ast.Expression(node), str(path), "eval"), {}, _Values()))  # noqa: S307
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and marker in node.value:
                out.append(node.value)
    return out


def test_the_runtime_still_logs_the_start_up_lines_startup_phases_reads() -> None:
    """`startup_phases` parses the runtime's own log lines; their text comes from the patched tree we ship, formatted
    as its logger does (`configure_logger`: `[%Y-%m-%d %H:%M:%S] message`), so a reworded line fails here, not on a
    lease."""
    from harness.sim.sglang_tree import patched_sglang_tree

    tree = patched_sglang_tree()
    stamp = "[2026-12-07 13:00:00] "
    captures = _runtime_messages(tree, "CUDA graph end. ")
    assert len(captures) >= 3, captures  # the target prefill/decode captures and the draft's
    summary = _runtime_messages(tree, "Engine startup timings (s): ")
    assert len(summary) == 1, summary
    line = summary[0] % (2.41, 2.51, 160.89, "prefill=101.14, decode=0.00", 182.91)
    got = run_engine.startup_phases("\n".join(stamp + m for m in [*captures, line]))
    assert {"target_prefill", "draft_decode"} <= set(got["captures"]), captures
    assert all(isinstance(v, float) for v in got["captures"].values())
    assert got["engine"] == {"load_weight": 2.41, "kv_cache_allocation": 2.51, "scheduler_e2e": 160.89,
                             "tokenizer_e2e": 182.91}  # fmt: skip
    assert got["logged_s"] == 0


def test_the_damage_log_keeps_the_runtimes_own_lines_about_pages_it_will_not_serve() -> None:
    """`run_engine.discards` matches the patched tree's own messages (a reworded one fails here, not on a lease), and
    not the start-up `server_args` line, whose `model_checksum` an earlier filter took for one."""
    from harness.sim.sglang_tree import patched_sglang_tree

    tree = patched_sglang_tree()
    unusable = _runtime_messages(tree, "treating it as a miss")
    dropped = _runtime_messages(tree, "prefetch discarded")
    assert len(unusable) >= 2 and len(dropped) == 1, (unusable, dropped)
    stamp = "[2026-12-07 20:22:18] "
    lines = [stamp + m for m in [*unusable, dropped[0]]]
    log = "\n".join([stamp + "server_args={'model_checksum': None, 'kv_cache_dtype': 'fp8_e4m3'}", *lines])
    assert run_engine.discards(log) == lines


def test_a_kept_volume_loses_its_model_state_and_keeps_only_its_compiled_kernels(tmp_path: Path) -> None:
    """`--keep-compile-caches`: a later call on the same machine starts as a restarted pod (kernels on the volume),
    never warm from an earlier call's pages; the router's new volumes take the one-pod volume's kernels."""
    from qwen_hicache.constants import JIT_CACHE_DIR

    assert engine_pod.JIT_DIR == JIT_CACHE_DIR
    vol = tmp_path / "hicache"
    (vol / "v1-abc").mkdir(parents=True)
    (vol / "v1-abc" / "page.bin").write_bytes(b"kv")
    (vol / JIT_CACHE_DIR / "v1-abc" / "triton").mkdir(parents=True)
    (vol / JIT_CACHE_DIR / "v1-abc" / "triton" / "k.cubin").write_bytes(b"sass")
    engine_pod.empty_volume(vol, keep_compiled=True)
    assert sorted(p.name for p in vol.iterdir()) == [JIT_CACHE_DIR]
    assert (vol / JIT_CACHE_DIR / "v1-abc" / "triton" / "k.cubin").read_bytes() == b"sass"
    seeded = tmp_path / "router" / "volume-0"
    engine_pod.empty_volume(seeded, keep_compiled=True, seed=vol / JIT_CACHE_DIR)
    assert (seeded / JIT_CACHE_DIR / "v1-abc" / "triton" / "k.cubin").exists()
    engine_pod.empty_volume(vol)
    assert list(vol.iterdir()) == [] and not list(tmp_path.glob(".*-compiled"))


@pytest.mark.timeout(480)
def test_the_damage_runs_alone_on_a_kept_volume_when_the_fingerprint_half_is_left_out(tmp_path: Path) -> None:
    """SIMULATED engine: `--skip fingerprint,copy --keep-compile-caches` (the 2026-12-07 20:16 call): no server of a
    new fingerprint, the damaged pages still misses judged against the restart, and an earlier call's pages gone."""
    (tmp_path / "spec").mkdir()
    _build(tmp_path / "model")
    fp = engine_pod.plan(tmp_path, engine_pod.spec_file(tmp_path / "spec", 1), tmp_path / "model",
                         tmp_path / "plan", 30000)["fingerprint"]  # fmt: skip
    volume = tmp_path / "work" / "hicache"
    kernels = volume / engine_pod.JIT_DIR / fp / "triton"
    kernels.mkdir(parents=True)
    (volume / fp).mkdir()
    (volume / fp / "page.bin").write_bytes(b"an earlier call's page")
    r, report = _run(tmp_path, "--parts", "engine", "--skip", "fingerprint,copy", "--keep-compile-caches")
    bad = {k: v for k, v in report["steps"].items() if v["status"] != "ok"}
    assert r.returncode == 0 and not bad, r.stdout[-3000:] + json.dumps(bad)[:3000]
    assert "fingerprint_change" not in report and len(report["start_fingerprint_damaged_s"]) == 1
    assert report["damage"] == {"zeroed": "miss", "bitflip": "miss", "truncated": "miss"}
    assert report["damage_detail"]["others_still_hit"] and "copy_gbps" not in report
    assert kernels.is_dir() and not (volume / fp / "page.bin").exists()
    assert any(s.startswith("compile caches kept") for s in report["stand_ins"])
