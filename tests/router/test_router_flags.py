"""Every flag the operator renders for `smg launch` is one the installed smg accepts: parsed by smg's own
argument parser and validated by its own checks (an smg upgrade that renames or drops a flag fails here)."""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path

import pytest
from qwen_hicache import render_router
from qwen_hicache.spec import RouterSpec
from smg.router_args import RouterArgs

from harness.sim.routerlab import lab_spec

smg_version = version("smg")  # the distribution (smg.version.__version__ still says 1.1.0 in 1.13.0)


def _parse(args: list[str]) -> RouterArgs:
    parser = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(parser)
    ns, unknown = parser.parse_known_args(args)
    assert not unknown, f"smg {smg_version} does not know {unknown}"
    router_args = RouterArgs.from_cli_args(ns)
    router_args._validate_router_args()
    return router_args


@pytest.mark.parametrize("policy", RouterSpec.model_fields["policy"].annotation.__args__)
def test_rendered_flags_parse_with_the_installed_smg(policy: str) -> None:
    spec = lab_spec(3, policy=policy, prefixTokens=300, loadFactor=1.5)
    parsed = _parse(render_router.router_args(spec))
    assert parsed.policy == policy
    assert parsed.discovery_provider == "file"
    assert parsed.discovery_file == f"{render_router.MANIFEST_DIR}/{render_router.MANIFEST_KEY}"
    if policy == "prefix_hash":
        assert (parsed.prefix_token_count, parsed.prefix_hash_load_factor) == (300, 1.5)


def test_the_pinned_smg_is_the_one_rendered() -> None:
    assert smg_version == render_router.SMG_VERSION
    images = Path(render_router.__file__).resolve().parents[2] / "images" / "router"
    assert f"smg=={smg_version}" in (images / "Dockerfile").read_text()
    assert f"smg=={smg_version} --hash=sha256:" in (images / "requirements.lock").read_text()


def test_deployment_probes_and_ports_name_what_the_container_serves() -> None:
    spec = lab_spec(2)
    meta = {"name": "chat", "namespace": "lab", "uid": "u"}
    dep = render_router.get_router_deployment(meta, spec, {"uid": "u"})
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False  # file discovery reads no API: no RBAC, no token
    assert {p["name"] for p in c["ports"]} == {"http", "metrics"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["volumeMounts"][0]["mountPath"] == render_router.MANIFEST_DIR
    assert pod["volumes"][0]["configMap"]["name"] == render_router.manifest_name("chat")
