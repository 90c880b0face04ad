"""The chart with the real helm binary: lint, render, offline schema validation, CRD identity, bad values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart.chartlib import (
    BUNDLE,
    CHART,
    EXAMPLES,
    NAMESPACE,
    VALUES_FILES,
    bundle_text,
    helm_run,
    render,
    template_args,
)
from qwen_hicache.crd import crd_yaml

KUBE_VERSIONS = ["1.31", "1.35"]  # oldest and newest the validator knows that the chart's kubeVersion covers
CUSTOM_GROUPS = ("qwenhicache.io/", "monitoring.coreos.com/")  # no published schema; the CRDs validate them
VALUE_SETS = [(), *((v,) for v in VALUES_FILES)]
VALUE_IDS = ["defaults", *(v.stem for v in VALUES_FILES)]


def _kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_helm_lint_is_clean(values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE, *(a for v in values for a in ("-f", str(v)))]
    out = helm_run(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_every_rendered_builtin_object_is_valid(values: tuple[Path, ...], version: str) -> None:
    docs = render(*values, include_crds=True)
    builtins = [d for d in docs if not d["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert "Deployment" in _kinds(builtins) and "CustomResourceDefinition" in _kinds(builtins)
    for doc in builtins:
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the field path on error


def test_validation_catches_a_broken_object() -> None:
    """The validator above is not a no-op: a misspelled field in the Deployment fails it."""
    deployment = _one(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)


def test_chart_crd_is_the_generated_one() -> None:
    shown = helm_run("show", "crds", str(CHART)).stdout
    # crds/ holds a symlink to the generated file, so it cannot drift; this catches a copy replacing it
    assert shown.removeprefix("---\n").strip() == crd_yaml().strip(), "the chart's CRD differs from `qwen-hicache crd`"
    (crd,) = [d for d in render(include_crds=True) if d["kind"] == "CustomResourceDefinition"]
    assert crd == yaml.safe_load(crd_yaml())


def test_kubectl_bundle_is_generated_from_the_chart() -> None:
    assert BUNDLE.read_text() == bundle_text(), "stale bundle: run `python tests/chart/chartlib.py` and commit"


def test_operator_deployment_defaults() -> None:
    docs = render()
    dep = _one(docs, "Deployment")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert "--standalone" in container["args"] and "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--metrics-port=9090" in container["args"]
    assert not any(a.startswith("--namespace") for a in container["args"])  # cluster-wide by default
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]
    assert _one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == pod["serviceAccountName"]
    assert "ServiceMonitor" not in _kinds(docs) and "QwenHiCacheServer" not in _kinds(docs)


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_rbac_has_no_wildcards_and_reads_no_secrets(values: tuple[Path, ...]) -> None:
    rules = _rules(render(*values))
    assert rules
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        if "secrets" in rule["resources"]:
            assert set(rule["verbs"]) <= {"create"}, f"the operator must never read secrets: {rule}"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_namespace_scoped_mode_grants_roles_only() -> None:
    docs = render(EXAMPLES / "helm-values-namespaced.yaml")
    roles = [d for d in docs if d["kind"] == "Role"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert {r["metadata"]["namespace"] for r in roles} == {"inference-a", "inference-b"}
    assert {b["metadata"]["namespace"] for b in bindings} == {"inference-a", "inference-b"}
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(_kinds(docs))
    args = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=inference-a", "--namespace=inference-b"]
    cluster_wide = render()
    assert sorted(map(str, roles[0]["rules"])) == sorted(map(str, _one(cluster_wide, "ClusterRole")["rules"]))


def test_node_sizing_check_adds_only_node_reads() -> None:
    docs = render(EXAMPLES / "helm-values-namespaced.yaml", sets=("nodeSizingCheck.enabled=true",))
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    env = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "QWEN_HICACHE_NODE_SIZING_CHECK", "value": "true"} in env


def test_monitoring_values_add_a_service_monitor_and_pin_the_digest() -> None:
    docs = render(EXAMPLES / "helm-values-monitoring.yaml")
    monitor = _one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = _one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    image = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert "@sha256:" in image and ":0.1.0" not in image


def test_prometheus_rule_points_every_alert_at_its_runbook() -> None:
    base = "https://wiki.example.com/qhc/runbooks.md"
    rule = _one(render(EXAMPLES / "helm-values-monitoring.yaml", sets=(f"prometheusRule.runbookBaseURL={base}",)),
                "PrometheusRule")  # fmt: skip
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["annotations"]["runbook_url"] == f"{base}#{r['alert'].lower()}" for r in alerts)
    default = _one(render(EXAMPLES / "helm-values-monitoring.yaml"), "PrometheusRule")
    urls = {r["annotations"]["runbook_url"] for g in default["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert all(u.startswith("https://github.com/qwen-hicache/qwen-hicache-operator/blob/main/docs/runbooks.md#")
               for u in urls)  # fmt: skip


def test_servers_from_values_match_the_single_gpu_example() -> None:
    example = yaml.safe_load((EXAMPLES / "qwenhicache-single-gpu.yaml").read_text())
    server = _one(render(EXAMPLES / "helm-values-server.yaml"), "QwenHiCacheServer")
    assert server["apiVersion"] == example["apiVersion"]
    assert server["metadata"]["name"] == example["metadata"]["name"]
    assert server["spec"] == example["spec"], "examples/helm-values-server.yaml drifted from the single-GPU example"


BAD_VALUES = [
    ("unknown-key", ("replicaCount=2",), "additional properties 'replicaCount' not allowed"),
    ("pull-policy", ("image.pullPolicy=Sometimes",), "/image/pullPolicy"),
    ("digest-format", ("image.digest=latest",), "/image/digest"),
    ("namespace-name", ("watch.namespaces={Team_A}",), "/watch/namespaces/0"),
    ("workers-zero", ("operator.workers=0",), "/operator/workers"),
    ("resync-string", ("operator.resyncSeconds=soon",), "/operator/resyncSeconds"),
    ("privileged-port", ("metrics.port=80",), "/metrics/port"),
    ("scrape-interval", ("metrics.serviceMonitor.interval=often",), "interval"),
    ("root", ("podSecurityContext.runAsNonRoot=false",), "runAsNonRoot"),
    ("writable-root", ("securityContext.readOnlyRootFilesystem=false",), "readOnlyRootFilesystem"),
    ("escalation", ("securityContext.allowPrivilegeEscalation=true",), "allowPrivilegeEscalation"),
    ("no-requests", ("resources.requests=null",), "resources"),
    ("server-without-spec", ("servers[0].name=x",), "spec"),
    ("same-ports", ("metrics.port=8080",), "health.port and metrics.port must differ"),
]


@pytest.mark.parametrize(("case", "sets", "fragment"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_rejected(case: str, sets: tuple[str, ...], fragment: str) -> None:
    res = helm_run(*template_args(sets=sets), check=False)
    assert res.returncode != 0, f"{case}: helm accepted {sets}"
    assert fragment in res.stderr, res.stderr
