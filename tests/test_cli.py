"""The `qwen-hicache` command line, run as a user would (a subprocess, no cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from resources import EXAMPLE, ROOT, variant

REQUIRED_SIZING_KEYS = {"hostKVTokensPerRank", "hostMambaSlotsPerRank", "hostBytesPerRank", "podMemoryLimitBytes",
                        "shmBytes", "diskCapBytesPerRank"}


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qwen_hicache.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_crd_prints_the_committed_crd() -> None:
    out = cli("crd")
    assert out.returncode == 0
    assert out.stdout == (ROOT / "crds" / "qwenhicacheservers.qwenhicache.io.yaml").read_text()


def test_render_prints_a_statefulset_with_gpus_hicache_flags_and_a_cache_claim() -> None:
    out = cli("render", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    sts = next(d for d in yaml.safe_load_all(out.stdout) if d["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    for flag in ("--enable-hierarchical-cache", "--hicache-size", "--hicache-storage-backend", "--tp-size"):
        assert flag in container["args"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "hicache"


def test_size_json_has_the_documented_keys_and_the_table_explains_terms() -> None:
    out = cli("size", str(EXAMPLE), "-o", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= REQUIRED_SIZING_KEYS
    assert (data["hostKVTokensPerRank"], data["hostMambaSlotsPerRank"]) == (2_143_040, 467)
    table = cli("size", str(EXAMPLE)).stdout
    for term in ("hostPools", "runtimeReserve", "pleTable", "margin", "shmBytes", "diskCapBytesPerRank"):
        assert term in table


def test_impossible_resource_is_refused_with_the_numbers(tmp_path: Path) -> None:
    doc = variant(**{"spec.runtime.nodeMemory": "120Gi",
                     "spec.hicache.disk": {"enabled": True, "size": "100Gi", "capPerRank": "200Gi"}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = cli("size", str(path))
    assert out.returncode == 2
    assert "SizingInvalid" in out.stderr and "120Gi allocatable" in out.stderr
    assert "capPerRank" in out.stderr
    assert cli("render", str(path)).stdout == ""


def test_invalid_spec_names_the_field() -> None:
    doc = variant(**{"spec.runtime.pageSize": 48})
    out = cli("render", "-", stdin=yaml.safe_dump(doc))
    assert out.returncode == 2 and "spec.runtime.pageSize" in out.stderr and "power of two" in out.stderr
