"""Small pure policy checks (cert-manager style) for what the schema cannot express.

Each check looks at one concern and returns a Problem or None. Blocking problems stop the operator from
applying anything (no half-valid workload); warnings become a condition and an event but do not block.
"""

from __future__ import annotations

from collections.abc import Callable

from . import launch, runtime_flags, units
from .conditions import Problem
from .derive import Derived
from .geometry import Geometry
from .spec import QwenHiCacheServerSpec

Check = Callable[[Derived], Problem | None]


CONFIG_FILE_DEST = "config"
"""`--config FILE` makes the runtime read any flag from a YAML file: the operator could not see them."""


def _managed_dests(d: Derived) -> dict[str, str]:
    """Setting (argparse dest) -> the flag the operator spells for it."""
    out, dests = {CONFIG_FILE_DEST: "--config"}, runtime_flags.table().options
    for flag in sorted(d.managed_flags):
        out[dests.get(flag) or flag.lstrip("-").replace("-", "_")] = flag
    return out


def _extra_options(spec: QwenHiCacheServerSpec) -> list[runtime_flags.Resolved]:
    return [r for r in map(runtime_flags.resolve, spec.runtime.extra_args) if r is not None]


def _spelled(r: runtime_flags.Resolved, canonical: str) -> str:
    written = r.token.split("=", 1)[0]
    return written if written == canonical else f"{written} (the runtime reads it as {canonical})"


def managed_flag_override(d: Derived) -> Problem | None:
    """extraArgs may not set a setting the operator derives (by any alias or abbreviation the runtime's parser
    accepts): status, sizing and cache identity would lie."""
    managed = _managed_dests(d)
    clash = sorted({_spelled(r, managed[r.dest]) for r in _extra_options(d.spec) if r.dest in managed})
    if not clash:
        return None
    return Problem(
        "ManagedFlagInExtraArgs",
        f"runtime.extraArgs sets {', '.join(clash)}, which the operator derives from the spec "
        "(the runtime reads aliases and abbreviations as the same setting); set the corresponding spec field instead",
    )


def unknown_runtime_flag(d: Derived) -> Problem | None:
    """A flag the runtime's parser does not know, or cannot tell apart, makes the server exit at startup."""
    bad = [r for r in _extra_options(d.spec) if r.error]
    if not bad:
        return None
    parts = [f"{r.token.split('=', 1)[0]} is not a flag of {runtime_flags.table().runtime}" if r.error == "unrecognized"
             else f"{r.token.split('=', 1)[0]} is ambiguous (could be {', '.join(r.candidates[:5])}"
                  f"{', ...' if len(r.candidates) > 5 else ''}); spell the flag out"
             for r in bad]
    return Problem("UnknownRuntimeFlag", f"runtime.extraArgs: {'; '.join(parts)}: the runtime would exit at startup")


def managed_env_override(d: Derived) -> Problem | None:
    """The file tier's directory and cap belong to the operator (the volume layout depends on them)."""
    spec = d.spec
    clash = sorted({e.name for e in spec.runtime.env} & launch.MANAGED_ENV)
    if not clash:
        return None
    return Problem(
        "ManagedEnvInSpec",
        f"runtime.env sets {', '.join(clash)}, which the operator manages; use hicache.disk instead",
    )


def duplicate_env(d: Derived) -> Problem | None:
    """Kubernetes keeps only one value per name; a duplicate is almost always a mistake."""
    spec = d.spec
    names = [e.name for e in spec.runtime.env]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if not dupes:
        return None
    return Problem("DuplicateEnv", f"runtime.env repeats {', '.join(dupes)}")


def write_back_not_persistent(d: Derived) -> Problem | None:
    """`write_back` only writes pages to disk when the GPU evicts them: a restart finds a cold cache."""
    spec = d.spec
    if not (spec.hicache.disk.enabled and spec.hicache.write_policy == "write_back"):
        return None
    return Problem(
        "WriteBackNotPersisted",
        "hicache.writePolicy write_back never writes un-evicted prefixes to the disk tier, so a restart "
        "cannot warm-start from disk; use write_through for a persistent cache",
        blocking=False,
        condition="CachePersistent",
    )


def speculative_rewritten(d: Derived) -> Problem | None:
    """The runtime (EAGLE family: NEXTN is EAGLE) replaces numDraftTokens with numSteps + 1 when eagleTopk is 1;
    the fingerprint and the draft-vs-page check would describe a configuration that never runs."""
    spec = d.spec
    sp = spec.runtime.speculative
    if sp is None or sp.eagle_topk != 1 or sp.num_draft_tokens == sp.num_steps + 1:
        return None
    return Problem(
        "SpeculativeRewritten",
        f"runtime.speculative.numDraftTokens {sp.num_draft_tokens} with eagleTopk 1: the runtime replaces it with "
        f"numSteps + 1 = {sp.num_steps + 1}; set numDraftTokens: {sp.num_steps + 1} (or raise eagleTopk)",
    )


def image_not_pinned(d: Derived) -> Problem | None:
    """The cache fingerprint hashes the image reference: a mutable tag can change the runtime under the cache."""
    spec = d.spec
    if "@" in spec.runtime.image:
        return None
    return Problem(
        "ImageNotPinned",
        f"runtime.image {spec.runtime.image!r} is a mutable tag: the disk cache is keyed by the reference, so a "
        "re-pushed tag would run a different runtime on the same cache; pin it by digest (repo@sha256:...)",
        blocking=False,
        condition="ImagePinned",
    )


def disk_slower_than_budgeted(d: Derived) -> Problem | None:
    """The replaced pods' disk tiers wrote slower than hicache.disk.writeBytesPerSecond: the stop budget now
    assumes the measured rate (a longer grace period), and the spec's figure is wrong."""
    if not (d.spec.hicache.disk.enabled and d.measured_write_rate and d.measured_write_rate < d.write_rate):
        return None
    return Problem(
        "DiskSlowerThanBudgeted",
        f"the disk tier wrote at {units.binary(d.measured_write_rate, down=True)}/s on the pods the last rollout "
        "replaced, "
        f"below hicache.disk.writeBytesPerSecond ({units.binary(d.write_rate)}/s): the flush budget now assumes "
        f"the measured rate (flush {d.layout.drain.flush_seconds} s, grace {d.layout.drain.grace_seconds} s, for "
        "pods started from now on); set writeBytesPerSecond to what the disk sustains or use a faster volume",
        blocking=False,
        condition="DiskWriteRate",
    )


CHECKS: tuple[Check, ...] = (managed_flag_override, unknown_runtime_flag, managed_env_override, duplicate_env,
                             write_back_not_persistent, speculative_rewritten, image_not_pinned,
                             disk_slower_than_budgeted)


def _valid_tp_sizes(kv_heads: int) -> list[int]:
    return [tp for tp in range(1, 17) if (kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0)]


def tp_vs_kv_heads(spec: QwenHiCacheServerSpec, g: Geometry) -> Problem | None:
    """The runtime's attention layer asserts that TP splits the KV heads evenly or replicates them evenly
    (`total_num_kv_heads % tp == 0` when there are at least tp heads, else `tp % total_num_kv_heads == 0`)."""
    tp, kv = spec.runtime.tensor_parallel_size, g.num_key_value_heads or 0
    if not kv or tp in _valid_tp_sizes(kv):
        return None
    return Problem(
        "TensorParallelSizeInvalid",
        f"runtime.tensorParallelSize {tp} cannot split the model's {kv} KV heads evenly (the runtime's attention "
        f"layers refuse it at startup); use one of {_valid_tp_sizes(kv)}",
    )


def no_kv_layers(spec: QwenHiCacheServerSpec, g: Geometry) -> Problem | None:
    """Without full-attention layers (or MTP draft layers in use) there is no KV for the hierarchical cache."""
    kv_layers = (g.full_attention_layers or 0) + ((g.mtp_layers or 0) if spec.runtime.speculative else 0)
    if kv_layers:
        return None
    return Problem(
        "NoKVLayers",
        "model.geometry.fullAttentionLayers is 0 (and no MTP draft layer is in use): a model without full-attention "
        "layers has no KV cache for HiCache to keep; set fullAttentionLayers from the checkpoint's config.json",
        condition="SizingValid",
    )


ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
_TRUE = ("true", "1", "yes", "y")
"""The runtime's EnvBool truthy spellings (tests compare)."""


def context_too_long(spec: QwenHiCacheServerSpec, g: Geometry) -> Problem | None:
    """The runtime refuses a context longer than the model's derived one unless its override is set."""
    asked, limit = spec.runtime.context_length, g.max_context_length
    allowed = any(e.name == ALLOW_LONGER_CONTEXT_ENV and e.value.lower() in _TRUE for e in spec.runtime.env)
    if asked is None or limit is None or asked <= limit or allowed:
        return None
    return Problem(
        "ContextLengthTooLong",
        f"runtime.contextLength {asked} is longer than the model's {limit} (derived from config.json as the runtime "
        f"does; the runtime refuses it at startup); lower contextLength to at most {limit}, or set runtime.env "
        f"{ALLOW_LONGER_CONTEXT_ENV}=1 to make the runtime accept it (it warns of incorrect outputs)",
    )


GEOMETRY_CHECKS = (no_kv_layers, tp_vs_kv_heads, context_too_long)


def geometry_problems(spec: QwenHiCacheServerSpec, g: Geometry) -> list[Problem]:
    """Checks on the resolved geometry that must pass before sizing can even be computed."""
    return [p for p in (check(spec, g) for check in GEOMETRY_CHECKS) if p]


def evaluate(d: Derived) -> list[Problem]:
    """Every problem found, blocking ones first."""
    found = [p for p in (check(d) for check in CHECKS) if p]
    return sorted(found, key=lambda p: not p.blocking)
