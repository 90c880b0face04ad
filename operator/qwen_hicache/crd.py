"""Generate the CustomResourceDefinition from the typed spec, so the schema can never drift from Python.

Pydantic emits JSON Schema (2020-12); Kubernetes wants a structural OpenAPI v3.0 subset: no `$ref`, no
`anyOf` with null, no `title`, boolean `exclusiveMinimum`, no `additionalProperties: false` beside
`properties`, and object defaults in wire form (camelCase, no nulls).
"""

from __future__ import annotations

from typing import Any

import yaml

from . import spec as api
from .status_model import QwenHiCacheServerStatus

Schema = dict[str, Any]

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicasSummary",
     "description": "Ready/desired serving pods"},
    {"name": "TP", "type": "integer", "jsonPath": ".spec.runtime.tensorParallelSize"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodesPerReplica",
     "description": "Nodes per replica (a LeaderWorkerSet group each when above 1; empty: 1)"},
    {"name": "Host-GB/Rank", "type": "number", "jsonPath": ".status.launch.hostMemoryPerRankGB", "priority": 0},
    {"name": "Disk", "type": "string", "jsonPath": ".spec.hicache.disk.size"},
    {"name": "Cache", "type": "string", "jsonPath": ".status.cacheSummary",
     "description": "Fullest replica's disk tier vs its cap, warm/restarted pods of the last rollout, namespace age"},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
     "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _resolve(node: Any, defs: Schema) -> Any:
    """Inline `$ref`s and convert every JSON Schema construct Kubernetes does not accept."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    while "$ref" in node or "anyOf" in node:
        if "$ref" in node:
            target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
            node = {**target, **node}
        else:
            variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
            if len(variants) != 1:
                raise ValueError(f"cannot express a union of {len(variants)} types in a structural schema")
            node = {**variants[0], **node}
    out: Schema = {}
    for key, value in node.items():
        if key in ("title", "$defs") or (key == "additionalProperties" and value is False):
            continue
        if key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _resolve(value, defs)
        elif key == "exclusiveMinimum":
            out.update(minimum=value, exclusiveMinimum=True)
        elif key == "exclusiveMaximum":
            out.update(maximum=value, exclusiveMaximum=True)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    return _fix_default(out)


def _fix_default(node: Schema) -> Schema:
    """Drop null defaults; an object's default is rebuilt from its properties' (already converted) defaults,
    because the server checks CEL rules against the default exactly as written."""
    if "default" not in node:
        return node
    if node["default"] is None or (node.get("type") == "object" and node.get("required")):
        del node["default"]
    elif node.get("type") == "object" and "properties" in node:
        node["default"] = {k: v["default"] for k, v in node["properties"].items() if "default" in v}
    return node


def openapi_schema(model: type[api.ApiModel]) -> Schema:
    """Structural OpenAPI v3 schema for a pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _resolve(raw, raw.get("$defs", {}))


STATUS_SCHEMA: Schema = openapi_schema(QwenHiCacheServerStatus)
"""Structural, generated from status_model: `kubectl explain qhc.status` documents it, unknown keys are pruned."""


def build_crd() -> Schema:
    """The complete CRD object."""
    root = {
        "type": "object",
        "description": "A SGLang serving deployment of a hybrid Qwen model with the hierarchical KV cache.",
        "required": ["spec"],
        "x-kubernetes-validations": api.NAME_RULES,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(api.QwenHiCacheServerSpec),
            "status": STATUS_SCHEMA,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}", "labels": {"app.kubernetes.io/part-of": "qwen-hicache"}},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "listKind": f"{api.KIND}List",
                "categories": ["all", "qwenhicache"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed under `crds/`."""
    header = "# Generated by `qwen-hicache crd` from operator/qwen_hicache/spec.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
