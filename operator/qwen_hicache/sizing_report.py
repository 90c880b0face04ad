"""`qwen-hicache size`: the sizing as a readable table, each number with where it comes from."""

from __future__ import annotations

from typing import Any

from . import status_model, units

_ROWS: tuple[tuple[str, str, str], ...] = (
    ("kvBytesPerToken", "B", "host KV per token: K+V dims x KV heads/rank x (attn + 1 MTP draft layer) x dtype"),
    ("indexBytesPerPage", "B", "QSA compressed keys per page: index dim x bf16 x layers x page / ratio"),
    ("mambaBytesPerSlot", "B", "Mamba slot: (conv + SSM) x GDN layers + PLE side state"),
    ("deviceKVTokensPerRank", "tok", "GPU KV pool per rank (runtime log, or estimated)"),
    ("deviceMambaSlotsPerRank", "slots", "GPU Mamba slots per rank (--max-mamba-cache-size)"),
    ("runningRequests", "req", "requests the runtime keeps: min(--max-running-requests, tokens/2, slots/5)"),
    ("mambaSpecStates", "", "Mamba verify-scratch states (= runningRequests with speculative decoding)"),
    ("deviceKVBytesPerRank", "B", "split weight: target full-attention KV buffers (tokens + 1 page)"),
    ("deviceMambaBytesPerRank", "B", "split weight: Mamba state of slots+1 + SSM/conv verify scratch"),
    ("deviceIndexBytesPerRank", "B", "QSA scaling: compressed keys of target and draft pools"),
    ("hicacheSizeGB", "GB", "--hicache-size per rank (whole GB), split KV:Mamba by the device bytes above"),
    ("hicacheRatio", "x", "--hicache-ratio (host pools = ratio x device pools) when no size is set"),
    ("hostKVTokensPerRank", "tok", "host KV tokens per rank, whole pages + 1 pad page"),
    ("hostMambaSlotsPerRank", "slots", "host Mamba slots per rank, + 1 pad slot"),
    ("hostBytesPerRank", "B", "pinned host pools per rank: KV + QSA index + Mamba"),
    ("coverageKVTokensPerMambaSlot", "tok", "mean cached prefix at which KV and Mamba fill together"),
    ("coverageFraction", "", "share of host KV restorable with one Mamba state per contextLength prefix"),
    ("podMemoryLimitBytes", "B", "pod memory limit (= request): the terms below, rounded up to GiB"),
    ("shmBytes", "B", "/dev/shm (memory-backed emptyDir) size"),
    ("diskCapBytesPerRank", "B", "file tier cap per rank (SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE)"),
    ("diskVolumeBytes", "B", "cache volume per replica: TP ranks x cap + filesystem headroom"),
    ("filesPerRank", "files", "page files a full cap holds in the rank's one flat directory (all pools)"),
)


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "B" and isinstance(value, int):
        return units.binary(value)  # exact integers stay in `-o json` and the status
    if isinstance(value, int):
        return f"{value:,} {unit}".rstrip()
    return f"{value} {unit}".rstrip()


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"  {a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]


def render_table(sizing: status_model.Sizing, title: str = "") -> str:
    """`status.sizing` as text: numbers, memory terms with their reasons, notes, problems."""
    s = sizing.explicit()
    lines = [f"Sizing for {title}" if title else "Sizing", ""]
    lines += _table([(key, _fmt(s.get(key), unit), why) for key, unit, why in _ROWS if key in s])
    lines += ["", "Pod memory limit, term by term:"]
    lines += _table([(t["name"], _fmt(t["bytes"], "B"), t["why"]) for t in s.get("memoryTerms", [])])
    for header, key in (("Notes:", "notes"), ("PROBLEMS (SizingValid=False):", "problems")):
        if s.get(key):
            lines += ["", header, *(f"  - {m}" for m in s[key])]
    return "\n".join(lines) + "\n"
