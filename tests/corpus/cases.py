"""The corpus: bad and borderline QwenHiCacheServers, each with what must happen to it.

- `api`: the API server refuses it (schema, CEL); the fragment must be in its message.
- `refused`: stored, then the operator sets `<condition>=False` (reason given), posts a Warning event with
  that reason and applies nothing.
- `accepted`: borderline but valid; the operator applies everything and the real API server accepts it all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from resources import DELETE, example, variant

DIGEST = "registry.example.com/qwen-hicache/sglang@sha256:" + "0f4b9d1c" * 8


@dataclass(frozen=True)
class Case:
    id: str
    doc: dict[str, Any]
    expect: str
    """'api', 'refused' or 'accepted'."""
    fragment: str = ""
    """api: a fragment of the API server's message. refused: the condition reason."""
    condition: str = "SpecValid"
    warnings: tuple[str, ...] = field(default=())
    """accepted: reasons of Warning events that must be posted (e.g. ImagePinned)."""


def _name(doc: dict, name: str) -> dict:
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = name
    return doc


def api(cid: str, fragment: str, **changes: Any) -> Case:
    return Case(cid, variant(**changes), "api", fragment)


def refused(cid: str, reason: str, condition: str = "SpecValid", **changes: Any) -> Case:
    return Case(cid, variant(**changes), "refused", reason, condition)


def accepted(cid: str, *warnings: str, **changes: Any) -> Case:
    return Case(cid, variant(**changes), "accepted", warnings=warnings)


R, H, D, M = "spec.runtime", "spec.hicache", "spec.hicache.disk", "spec.model"
TOL = f"{R}.tolerations"

SCHEMA = [
    # types, enums and ranges
    api("tp-zero", "tensorParallelSize", **{f"{R}.tensorParallelSize": 0}),
    api("tp-17", "tensorParallelSize", **{f"{R}.tensorParallelSize": 17}),
    api("tp-string", "tensorParallelSize", **{f"{R}.tensorParallelSize": "2"}),
    api("tp-float", "tensorParallelSize", **{f"{R}.tensorParallelSize": 2.5}),
    api("page-48", "pageSize must be a power of two", **{f"{R}.pageSize": 48}),
    api("page-0", "pageSize must be a power of two", **{f"{R}.pageSize": 0}),
    api("page-2048", "pageSize must be a power of two", **{f"{R}.pageSize": 2048}),
    api("page-string", "pageSize", **{f"{R}.pageSize": "64"}),
    api("write-policy", "writePolicy", **{f"{H}.writePolicy": "write_sometimes"}),
    api("prefetch-policy", "prefetchPolicy", **{f"{H}.prefetchPolicy": "eager"}),
    api("layer-first", "accepts only memLayout page_first", **{f"{H}.memLayout": "layer_first"}),
    api("page-head", "accepts only memLayout page_first", **{f"{H}.memLayout": "page_head"}),
    api("io-mismatch", "page_first_direct goes with ioBackend direct", **{f"{H}.ioBackend": "direct"}),
    api("io-bogus", "ioBackend", **{f"{H}.ioBackend": "mmap"}),
    api("kv-dtype", "kvCacheDtype", **{f"{R}.kvCacheDtype": "fp4"}),
    api("ssm-dtype", "mambaSsmDtype", **{f"{R}.mambaSsmDtype": "int8"}),
    api("dtype", "dtype", **{f"{R}.dtype": "float64"}),
    # the disk tier
    api("disk-no-size", "disk tier is enabled but has no size", **{D: {"enabled": True}}),
    api("disk-size-gb", "size", **{f"{D}.size": "600GB"}),
    api("disk-size-zero", "hicache.disk.size must be at least 1Mi", **{f"{D}.size": "0"}),
    api("disk-size-2pi", "hicache.disk.size must be at most 1Pi", **{f"{D}.size": "2Pi"}),
    api("disk-size-negative", "size", **{f"{D}.size": "-1Gi"}),
    api("disk-size-huge", "size", **{f"{D}.size": "9" * 40}),
    api("cap-tiny", "hicache.disk.capPerRank must be at least 1Mi", **{f"{D}.capPerRank": "512Ki"}),
    api("write-rate-zero", "hicache.disk.writeBytesPerSecond must be at least 1Mi",
        **{f"{D}.writeBytesPerSecond": "0"}),
    api("write-rate-1ki", "hicache.disk.writeBytesPerSecond must be at least 1Mi",
        **{f"{D}.writeBytesPerSecond": "1Ki"}),
    api("write-rate-10ti", "hicache.disk.writeBytesPerSecond must be at most 1Ti",
        **{f"{D}.writeBytesPerSecond": "10Ti"}),
    api("retention", "retention", **{f"{D}.retention": "Keep"}),
    api("keep-old-17", "keepOldNamespaces", **{f"{D}.keepOldNamespaces": 17}),
    api("keep-old-negative", "keepOldNamespaces", **{f"{D}.keepOldNamespaces": -1}),
    api("storage-class-underscore", "storageClassName", **{f"{D}.storageClassName": "Fast_SSD"}),
    api("storage-class-empty", "storageClassName", **{f"{D}.storageClassName": ""}),
    api("storage-class-long", "storageClassName", **{f"{D}.storageClassName": "a" * 254}),
    # host memory
    api("host-zero", "hostMemoryPerRankGB", **{f"{H}.hostMemoryPerRankGB": 0}),
    api("host-negative", "hostMemoryPerRankGB", **{f"{H}.hostMemoryPerRankGB": -5}),
    api("host-huge", "hostMemoryPerRankGB", **{f"{H}.hostMemoryPerRankGB": 1e308}),
    api("ratio-one", "hostRatio", **{f"{H}.hostMemoryPerRankGB": DELETE, f"{H}.hostRatio": 1}),
    api("ratio-huge", "hostRatio", **{f"{H}.hostMemoryPerRankGB": DELETE, f"{H}.hostRatio": 1e308}),
    api("size-and-ratio", "set hostMemoryPerRankGB or hostRatio, not both", **{f"{H}.hostRatio": 2.0}),
    api("mamba-slots-zero", "hostMambaSlotsPerRank", **{f"{H}.hostMambaSlotsPerRank": 0}),
    api("device-kv-zero", "deviceKVTokens", **{f"{H}.deviceKVTokens": 0}),
    api("device-kv-huge", "deviceKVTokens", **{f"{H}.deviceKVTokens": 10**11}),
    # runtime numbers
    api("gpu-memory-zero", "gpuMemoryGB", **{f"{R}.gpuMemoryGB": 0}),
    api("gpu-memory-huge", "gpuMemoryGB", **{f"{R}.gpuMemoryGB": 1e308}),
    api("mem-fraction-zero", "memFractionStatic", **{f"{R}.memFractionStatic": 0}),
    api("mem-fraction-one", "memFractionStatic", **{f"{R}.memFractionStatic": 1}),
    api("context-100", "contextLength", **{f"{R}.contextLength": 100}),
    api("context-2g", "contextLength", **{f"{R}.contextLength": 2**31}),
    api("running-zero", "maxRunningRequests", **{f"{R}.maxRunningRequests": 0}),
    api("running-5000", "maxRunningRequests", **{f"{R}.maxRunningRequests": 5000}),
    api("mamba-cache-zero", "maxMambaCacheSize", **{f"{R}.maxMambaCacheSize": 0}),
    api("mamba-cache-huge", "maxMambaCacheSize", **{f"{R}.maxMambaCacheSize": 10**8}),
    api("port-80", "port", **{f"{R}.port": 80}),
    api("port-70000", "port", **{f"{R}.port": 70000}),
    api("startup-10", "startupTimeoutSeconds", **{f"{R}.startupTimeoutSeconds": 10}),
    api("request-zero", "maxRequestSeconds", **{f"{R}.maxRequestSeconds": 0}),
    api("node-memory-words", "nodeMemory", **{f"{R}.nodeMemory": "lots"}),
    api("node-memory-zero", "runtime.nodeMemory must be at least 1Gi", **{f"{R}.nodeMemory": "0"}),
    api("node-memory-2pi", "runtime.nodeMemory must be at most 1Pi", **{f"{R}.nodeMemory": "2Pi"}),
    # placement
    api("selector-key-space", "nodeSelector keys must be label keys", **{f"{R}.nodeSelector": {"bad key": "x"}}),
    api("selector-key-dash", "nodeSelector keys must be label keys", **{f"{R}.nodeSelector": {"-x": "y"}}),
    api("selector-key-64", "nodeSelector keys must be label keys", **{f"{R}.nodeSelector": {"k" * 64: "y"}}),
    api("selector-key-two-slashes", "nodeSelector keys must be label keys", **{f"{R}.nodeSelector": {"a/b/c": "y"}}),
    api("selector-value-bang", "nodeSelector", **{f"{R}.nodeSelector": {"gpu": "yes!"}}),
    api("selector-value-64", "nodeSelector", **{f"{R}.nodeSelector": {"gpu": "v" * 64}}),
    api("selector-65-keys", "nodeSelector", **{f"{R}.nodeSelector": {f"k{i}": "v" for i in range(65)}}),
    api("toleration-exists-value", "operator Exists must not have a value",
        **{TOL: [{"key": "gpu", "operator": "Exists", "value": "x"}]}),
    api("toleration-no-key-equal", "without a key must have operator Exists", **{TOL: [{"operator": "Equal"}]}),
    api("toleration-seconds-noschedule", "tolerationSeconds is only allowed with effect NoExecute",
        **{TOL: [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}]}),
    api("toleration-effect", "effect", **{TOL: [{"key": "gpu", "operator": "Exists", "effect": "Never"}]}),
    api("toleration-operator", "operator", **{TOL: [{"key": "gpu", "operator": "In"}]}),
    api("toleration-key", "key", **{TOL: [{"key": "bad key", "operator": "Exists"}]}),
    api("toleration-value-long", "value", **{TOL: [{"key": "gpu", "value": "v" * 64}]}),
    api("image-empty", "image", **{f"{R}.image": ""}),
    api("image-uppercase-path", "image", **{f"{R}.image": "registry.example.com/Qwen/SGLang:1"}),
    api("image-space", "image", **{f"{R}.image": "sglang latest"}),
    api("image-two-tags", "image", **{f"{R}.image": "sglang:a:b"}),
    api("image-short-digest", "image", **{f"{R}.image": "sglang@sha256:abc"}),
    api("image-too-long", "image", **{f"{R}.image": "r/" + "a" * 600}),
    api("gpu-resource", "gpuResourceName", **{f"{R}.gpuResourceName": "gpu"}),
    api("extra-arg-number", "extraArgs", **{f"{R}.extraArgs": [1]}),
    api("env-digit", "name", **{f"{R}.env": [{"name": "1BAD", "value": "x"}]}),
    api("env-dash", "name", **{f"{R}.env": [{"name": "A-B", "value": "x"}]}),
    api("env-no-name", "name", **{f"{R}.env": [{"value": "x"}]}),
    # the model
    api("no-revision", "revision", **{f"{M}.revision": DELETE}),
    api("short-revision", "revision", **{f"{M}.revision": "abc"}),
    api("served-empty", "servedName", **{f"{M}.servedName": ""}),
    api("served-dash", "servedName", **{f"{M}.servedName": "-x"}),
    api("claim-underscore", "claimName", **{f"{M}.weights.claimName": "Bad_Name"}),
    api("weights-absolute", "path", **{f"{M}.weights.path": "/abs"}),
    api("profile-unknown", "profile", **{f"{M}.profile": "qwen9"}),
    api("geometry-unknown-field", "heads", **{f"{M}.geometry": {"heads": 4}}),
    api("geometry-negative", "headDim", **{f"{M}.geometry": {"headDim": -1}}),
    api("geometry-huge", "headDim", **{f"{M}.geometry": {"headDim": 10**30}}),
    # the rest
    api("replicas-negative", "replicas", **{"spec.replicas": -1}),
    api("replicas-65", "replicas", **{"spec.replicas": 65}),
    api("nodes-zero", "nodesPerReplica", **{"spec.nodesPerReplica": 0}),
    api("nodes-17", "nodesPerReplica", **{"spec.nodesPerReplica": 17}),
    api("nodes-string", "nodesPerReplica", **{"spec.nodesPerReplica": "2"}),
    api("nodes-indivisible", "must be divisible by nodesPerReplica",
        **{"spec.nodesPerReplica": 3, f"{R}.tensorParallelSize": 4}),
    api("nodes-above-tp", "must be divisible by nodesPerReplica",
        **{"spec.nodesPerReplica": 4, f"{R}.tensorParallelSize": 2}),
    api("restart-long", "restart", **{"spec.restart": "r" * 200}),
    api("max-unavailable-zero", "maxUnavailable", **{"spec.rollout.maxUnavailable": 0}),
    api("pod-timeout-10", "podTimeoutSeconds", **{"spec.rollout.podTimeoutSeconds": 10}),
    api("draft-zero", "numDraftTokens", **{f"{R}.speculative.numDraftTokens": 0}),
    api("algorithm", "algorithm", **{f"{R}.speculative.algorithm": "MEDUSA"}),
    api("draft-above-page", "pageSize must be at least speculative.numDraftTokens", **{f"{R}.pageSize": 2}),
    api("unknown-runtime-field", "tpSize", **{f"{R}.tpSize": 2}),
    api("unknown-spec-field", "foo", **{"spec.foo": 1}),
    api("unknown-disk-field", "sizeGi", **{f"{D}.sizeGi": 600}),
    api("no-runtime", "runtime", **{R: DELETE}),
    api("no-model", "model", **{M: DELETE}),
    api("no-image", "image", **{f"{R}.image": DELETE}),
    # names: the StatefulSet's pods need <name>-<revision hash> <= 63, Services need DNS-1035 labels
    Case("name-53", _name(example(), "n" * 53), "api", "metadata.name must be a DNS-1035 label"),
    Case("name-63", _name(example(), "n" * 63), "api", "metadata.name must be a DNS-1035 label"),
    Case("name-digit-first", _name(example(), "1flash"), "api", "metadata.name must be a DNS-1035 label"),
    Case("name-dot", _name(example(), "flash.next"), "api", "metadata.name must be a DNS-1035 label"),
]

OPERATOR = [
    refused("extra-tp-size", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--tp-size", "4"]}),
    refused("extra-tp-alias", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--tensor-parallel-size", "4"]}),
    refused("extra-tp-abbrev", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--tp", "4"]}),
    refused("extra-hicache-abbrev", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--hicache-si=9"]}),
    refused("extra-hicache-alias", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--enable-hicache"]}),
    refused("extra-model-alias", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--model", "/x"]}),
    refused("extra-config", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--config", "/etc/sglang.yaml"]}),
    refused("extra-page-size", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--page-size=32"]}),
    refused("extra-served", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--served-model-name=x"]}),
    refused("extra-admin-key", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--admin-api-key", "k"]}),
    refused("extra-port", "ManagedFlagInExtraArgs", **{f"{R}.extraArgs": ["--port=1"]}),
    refused("extra-unknown", "UnknownRuntimeFlag", **{f"{R}.extraArgs": ["--no-such-flag"]}),
    refused("extra-ambiguous", "UnknownRuntimeFlag", **{f"{R}.extraArgs": ["--hicache", "x"]}),
    refused("env-storage-dir", "ManagedEnvInSpec",
            **{f"{R}.env": [{"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "value": "/tmp"}]}),
    refused("env-admin-key", "ManagedEnvInSpec",
            **{f"{R}.env": [{"name": "QWEN_HICACHE_ADMIN_API_KEY", "value": "k"}]}),
    refused("env-duplicate", "DuplicateEnv",
            **{f"{R}.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
    refused("tp-3", "TensorParallelSizeInvalid", **{f"{R}.tensorParallelSize": 3}),
    refused("tp-5", "TensorParallelSizeInvalid", **{f"{R}.tensorParallelSize": 5}),
    refused("tp-7", "TensorParallelSizeInvalid", **{f"{R}.tensorParallelSize": 7}),
    refused("context-beyond-model", "ContextLengthTooLong", **{f"{M}.geometry": {"maxContextLength": 262144}}),
    refused("speculative-rewritten", "SpeculativeRewritten",
            **{f"{R}.speculative": {"numSteps": 3, "numDraftTokens": 8, "eagleTopk": 1}}),
    refused("no-kv-layers", "NoKVLayers", "SizingValid",
            **{f"{M}.geometry": {"fullAttentionLayers": 0}, f"{R}.speculative": DELETE}),
    refused("qsa-partial", "SizingInvalid", "SizingValid", **{f"{M}.geometry": {"qsaCompressRatio": 0}}),
    refused("ple-partial", "SizingInvalid", "SizingValid", **{f"{M}.geometry": {"pleChannels": 0}}),
    refused("cap-too-small", "SizingInvalid", "SizingValid", **{f"{D}.capPerRank": "1Mi"}),
    refused("pod-over-node", "SizingInvalid", "SizingValid",
            **{f"{H}.hostMemoryPerRankGB": 900, f"{R}.nodeMemory": "64Gi"}),
    refused("no-device-pool", "SizingInvalid", "SizingValid",
            **{f"{H}.deviceKVTokens": DELETE, f"{R}.memFractionStatic": 0.01}),
]

BORDERLINE = [
    Case("name-52", _name(example(), "n" * 52), "accepted"),
    accepted("toleration-all", **{TOL: [{"operator": "Exists"}]}),
    accepted("toleration-seconds", **{TOL: [{"key": "gpu", "operator": "Exists", "effect": "NoExecute",
                                            "tolerationSeconds": 300}]}),
    accepted("selector-prefixed", **{f"{R}.nodeSelector": {"node.example.com/gpu-model": "H200"}}),
    accepted("image-port-registry", **{f"{R}.image": "localhost:5000/sglang@sha256:" + "ab" * 32}),
    accepted("image-mutable-tag", "ImageNotPinned", **{f"{R}.image": "registry.example.com/sglang:0.5.23"}),
    accepted("disk-less", **{D: {"enabled": False}}),
    accepted("disk-1pi", **{f"{D}.size": "1Pi"}),
    accepted("write-rate-1mi", **{f"{D}.writeBytesPerSecond": "1Mi"}),
    accepted("tp-4", **{f"{R}.tensorParallelSize": 4}),
    accepted("extra-unmanaged", **{f"{R}.extraArgs": ["--log-level", "info", "--enable-metrics-for-all-schedulers"]}),
]

CASES: list[Case] = SCHEMA + OPERATOR + BORDERLINE
for case in CASES:  # every case runs with one replica and the digest image unless it says otherwise
    if case.doc["spec"].get("replicas") == example()["spec"]["replicas"]:
        case.doc["spec"]["replicas"] = 1
    if case.doc["spec"].get("runtime", {}).get("image") == example()["spec"]["runtime"]["image"]:
        case.doc["spec"]["runtime"]["image"] = DIGEST
