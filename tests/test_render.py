"""Golden renders: a change in what the operator would apply is always a visible, reviewed diff.

Regenerate after a deliberate change with `UPDATE_GOLDEN=1 pytest tests/test_render.py` (and bump
RENDER_VERSION when the pod template changes, so running pods are not rolled by an operator upgrade).
"""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from qwen_hicache.cli import offline_meta
from qwen_hicache.plan import objects, plan
from qwen_hicache.render import RENDER_VERSION_ANNOTATION
from resources import VARIANTS, example, variant

GOLDEN = Path(__file__).parent / "golden"



def _render(doc: dict) -> list[dict]:
    p = plan(offline_meta(doc), doc["spec"])
    assert not p.blocked, p.problems
    return objects(p)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_render_matches_golden(name: str) -> None:
    text = yaml.safe_dump_all(_render(VARIANTS[name]), sort_keys=False, width=120)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text, f"render of {name} changed; review and UPDATE_GOLDEN=1 if intended"


def _sts(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "StatefulSet")


def test_statefulset_requests_gpus_memory_and_the_disk_tier() -> None:
    doc = example()
    p = plan(offline_meta(doc), doc["spec"])
    sts = _sts(objects(p))
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["limits"]["memory"] == str(p.sizing.wire()["podMemoryLimitBytes"])
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": str(p.sizing.wire()["shmBytes"])}
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == str(p.sizing.wire()["diskVolumeBytes"])
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == str(p.sizing.wire()["diskCapBytesPerRank"])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    fp = env["QWEN_HICACHE_FINGERPRINT"]
    assert env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == f"{mounts['hicache']['mountPath']}/{fp}"
    assert env["QWEN_HICACHE_ADMIN_API_KEY"] == {"secretKeyRef": {"name": "flash-next-admin", "key": "api-key"}}
    assert "--admin-api-key=$(QWEN_HICACHE_ADMIN_API_KEY)" in container["args"]  # one argument: see launch.ADMIN
    guard = pod["initContainers"][0]
    assert guard["volumeMounts"] == [{"name": "hicache", "mountPath": mounts["hicache"]["mountPath"]}]
    assert container["lifecycle"]["preStop"]["exec"]["command"][:2] == ["python3", "-c"]
    drain = int(env["QWEN_HICACHE_DRAIN_SECONDS"]) + int(env["QWEN_HICACHE_FLUSH_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > drain
    assert mounts["model"]["readOnly"] is True
    assert sts["spec"]["template"]["metadata"]["annotations"][RENDER_VERSION_ANNOTATION]


def test_every_object_is_owned_and_labelled() -> None:
    for obj in _render(example()):
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["kind"] == "QwenHiCacheServer"
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/instance"] == "flash-next"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "qwen-hicache-operator"


def test_rendered_builtins_validate_against_kubernetes_schemas() -> None:
    for doc in VARIANTS.values():
        for obj in _render(doc):
            if obj["kind"] == "LeaderWorkerSet":
                continue  # not a builtin: its pod templates are validated in test_render_lws
            for version in ("1.31", "1.35"):
                kubernetes_validate.validate(obj, version, strict=True)


def test_disk_tier_off_renders_no_claim_and_no_storage_flags() -> None:
    doc = variant(**{"spec.hicache.disk": {"enabled": False}})
    sts = _sts(_render(doc))
    assert "volumeClaimTemplates" not in sts["spec"]
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--hicache-storage-backend" not in args


def _pdb(doc: dict) -> dict:
    return next(o for o in _render(doc) if o["kind"] == "PodDisruptionBudget")


@pytest.mark.parametrize(("replicas", "max_unavailable", "allowed"), [(1, 1, 1), (2, 1, 1), (3, 5, 2), (5, 2, 2)])
def test_disruption_budget_matches_the_rollout_budget(replicas: int, max_unavailable: int, allowed: int) -> None:
    from qwen_hicache.rollout import allowed_down

    doc = variant(**{"spec.replicas": replicas, "spec.rollout": {"maxUnavailable": max_unavailable}})
    pdb = _pdb(doc)
    assert pdb["spec"]["maxUnavailable"] == allowed == allowed_down(max_unavailable, replicas)
    assert pdb["spec"]["selector"]["matchLabels"] == _sts(_render(doc))["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a broken pod never blocks its fix
