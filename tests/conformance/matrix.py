"""The conformance matrix: specs the operator sizes, and the runtime arguments it renders for each.

Three architectures with real `config.json` files (tests/data/hf, see its README), TP 1/2/4/8, host sizes
16/30/45 GB and two ratios, FP8/bf16/auto KV, speculative decoding on and off, `--hicache-mamba-host-slots`
given or not, and request counts the runtime caps. Each case names the model directory the runtime reads.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from qwen_hicache.derive import launch_sizing
from qwen_hicache.geometry import from_hf_config
from qwen_hicache.launch import launch_args
from qwen_hicache.sizing import compute_sizing
from qwen_hicache.spec import QwenHiCacheServerSpec

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
ARCHS = {"flash-next": "qwen4_exp", "qwen3-next": "qwen3_next", "qwen3.5": "qwen3_5"}
DEVICE_KV_TOKENS = {1: 1_048_576, 2: 4_342_208, 4: 6_291_456, 8: 9_437_184}
"""Device KV pools per rank (page multiples); the runtime profiles them from GPU memory, which CPU cannot."""
HOSTS = ("16GB", "30GB", "45GB", "ratio2")
SPEC = {"algorithm": "NEXTN", "numSteps": 3, "numDraftTokens": 4, "eagleTopk": 1}


def spec_for(arch: str, tp: int, host: str, kv: str, mtp: bool, host_slots: int | None,
             requests: int | None = 64, mamba_slots: int | None = 512) -> dict:
    """A QwenHiCacheServer spec: the profile for Flash-Next, the config.json geometry for the others."""
    if arch == "flash-next":
        model = {"profile": "qwen3.8-flash-next"}
    else:
        geometry = from_hf_config(json.loads((HF / ARCHS[arch] / "config.json").read_text()))
        model = {"profile": None, "geometry": geometry.model_dump(by_alias=True, exclude_none=True)}
    hicache: dict = {"deviceKVTokens": DEVICE_KV_TOKENS[tp], "memLayout": "page_first", "ioBackend": "kernel"}
    if host.startswith("ratio"):
        hicache["hostRatio"] = float(host.removeprefix("ratio"))
    else:
        hicache["hostMemoryPerRankGB"] = float(host.removesuffix("GB"))
    if host_slots:
        hicache["hostMambaSlotsPerRank"] = host_slots
    runtime: dict = {"image": "registry.example.com/sglang@sha256:" + "0" * 64, "tensorParallelSize": tp,
                     "kvCacheDtype": kv, "pageSize": 64, "contextLength": 131072}
    if arch == "flash-next":
        runtime["mambaSsmDtype"] = "bfloat16"
    if requests:
        runtime["maxRunningRequests"] = requests
    if mamba_slots:
        runtime["maxMambaCacheSize"] = mamba_slots
    if mtp:
        runtime["speculative"] = dict(SPEC)
    return {
        "model": {**model, "servedName": f"conf-{arch}", "revision": "0123456789abcdef",
                  "weights": {"claimName": "weights"}},
        "runtime": runtime,
        "hicache": hicache,
    }


def deterministic(spec: dict) -> dict:
    """The spec with the runtime's deterministic mode switched on (README, "Reproducible outputs")."""
    spec["runtime"]["extraArgs"] = ["--enable-deterministic-inference"]
    return spec


def cases() -> list[dict]:
    """Every (arch, TP, host, speculative) combination; KV dtype and explicit host slots rotate through them,
    plus the inputs the runtime treats specially (auto KV, capped or unset request counts)."""
    out = []
    for i, (arch, tp, host, mtp) in enumerate(itertools.product(ARCHS, (1, 2, 4, 8), HOSTS, (True, False))):
        kv = ("fp8_e4m3", "bf16")[i % 2]
        slots = 300 if i % 3 == 0 else None
        out.append(dict(name=f"{arch}-tp{tp}-{host}-{kv}-{'mtp' if mtp else 'nomtp'}-{'slots' if slots else 'split'}",
                        arch=arch, spec=spec_for(arch, tp, host, kv, mtp, slots)))
    extra = [
        ("flash-next-tp2-30GB-auto-mtp", spec_for("flash-next", 2, "30GB", "auto", True, None)),
        ("qwen3-next-tp2-30GB-auto-mtp", spec_for("qwen3-next", 2, "30GB", "auto", True, None)),
        ("flash-next-tp2-30GB-capped-requests", spec_for("flash-next", 2, "30GB", "fp8_e4m3", True, None, 256, 512)),
        ("qwen3.5-tp4-30GB-default-requests", spec_for("qwen3.5", 4, "30GB", "bf16", True, None, None, None)),
        ("qwen3-next-tp1-ratio3-bf16-mtp", spec_for("qwen3-next", 1, "ratio3", "bf16", True, None)),
        ("flash-next-tp2-30GB-deterministic", deterministic(spec_for("flash-next", 2, "30GB", "fp8_e4m3", True, None))),
    ]
    out += [dict(name=name, arch=name.split("-tp")[0], spec=spec) for name, spec in extra]
    return out


def runtime_args(spec: QwenHiCacheServerSpec, arch: str) -> list[str]:
    """What `qwen-hicache render` passes the runtime, with the model path pointed at the config directory and
    the admin key (a `$(VAR)` expanded by the kubelet) left out."""
    args = launch_args(spec, launch_sizing(compute_sizing(spec)))
    args[args.index("--model-path") + 1] = str(HF / ARCHS[arch])
    return [a for a in args if not a.startswith("--admin-api-key=")]
