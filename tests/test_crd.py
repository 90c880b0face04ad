"""The committed CRD is exactly what the typed spec generates, and it is a valid structural schema."""

from __future__ import annotations

import json

import yaml
from qwen_hicache.crd import build_crd, crd_yaml, openapi_schema
from qwen_hicache.spec import QwenHiCacheServerSpec
from resources import ROOT

CRD_FILE = ROOT / "crds" / "qwenhicacheservers.qwenhicache.io.yaml"


def test_committed_crd_matches_the_typed_spec() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ drifted from spec.py: run `make crds` and commit"


def _walk(node: object):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_schema_is_structural() -> None:
    text = json.dumps(build_crd())
    for forbidden in ('"$ref"', '"anyOf"', '"title"', '"const"', '"$defs"'):
        assert forbidden not in text
    for node in _walk(build_crd()["spec"]["versions"][0]["schema"]):
        assert not ("properties" in node and "additionalProperties" in node)
        assert node.get("default", 0) is not None


def test_every_spec_field_is_documented() -> None:
    def check(node: dict, path: str) -> None:
        for name, prop in node.get("properties", {}).items():
            assert prop.get("description"), f"{path}.{name} has no description"
            check(prop, f"{path}.{name}")
            if "items" in prop:
                check(prop["items"], f"{path}.{name}[]")

    check(openapi_schema(QwenHiCacheServerSpec), "spec")


def test_object_defaults_match_pydantic_defaults() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    hicache_default = spec["properties"]["hicache"]["default"]
    minimal = {
        "model": {"weights": {"claimName": "w"}, "servedName": "m", "revision": "abcdef0"},
        "runtime": {"image": "img"},
    }
    assert hicache_default == QwenHiCacheServerSpec.model_validate(minimal).hicache.wire()


def test_names_and_printer_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "QwenHiCacheServer", "qwenhicacheservers", ["qhc"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Ready", "Replicas", "TP", "Nodes", "Age"}
