"""`helm install` into the real control plane (the operator runs as the chart's pod), the operator reconciling a
server created from chart values, `helm upgrade` (a new operator pod, no serving pod restarted), then `helm
uninstall`: the operator and its RBAC go, the CRD and the cache volumes stay."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart.chartlib import CHART, EXAMPLES
from installlib import OPERATOR_NS, WORKLOAD_NS, admin_api, audited_cluster, install, running_operator
from kubehelpers import eventually
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from qwen_hicache.spec import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration


def _gone(read: object, *args: str) -> bool:
    try:
        read(*args)  # type: ignore[operator]
    except ApiException as err:
        return err.status == 404
    return False


def test_helm_install_reconcile_uninstall_keeps_cache_volumes(tmp_path: Path) -> None:
    with audited_cluster(tmp_path) as (cluster, sim):
        api = admin_api(cluster)
        inst = install((cluster, sim), values=[str(EXAMPLES / "helm-values-server.yaml")],
                       sets=[f"servers[0].namespace={WORKLOAD_NS}", "servers[0].spec.hicache.disk.enabled=true",
                             "servers[0].spec.hicache.disk.size=200Gi"])  # a cache volume to keep
        status = inst.helm("status", "qwen-hicache-operator", "-n", OPERATOR_NS)
        assert "STATUS: deployed" in status and "watching all namespaces" in status  # NOTES.txt rendered
        apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
        name = "flash-next-1gpu"
        with running_operator(inst) as op:
            sts = eventually(lambda: apps.read_namespaced_stateful_set(name, WORKLOAD_NS))
            assert sts.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
            claims = [f"hicache-{name}-0"]
            sim.wait_ready(WORKLOAD_NS, name, 1, timeout=120)  # the server's pod runs: reconciled end to end
            eventually(lambda: core.read_namespaced_persistent_volume_claim(claims[0], WORKLOAD_NS).metadata
                       .annotations.get(f"{GROUP}/fingerprint"))
            assert "qwen_hicache_reconcile_duration_seconds" in op.get(op.metrics)[1]
            # helm upgrade: the operator pod is replaced (Recreate), the serving pod is not touched (OnDelete)
            server_pod = f"{name}-0"
            inst.helm("upgrade", "qwen-hicache-operator", str(CHART), "-n", OPERATOR_NS, "--reuse-values",
                      "--set", "operator.verbose=true", "--wait", "--timeout", "120s")
            new = eventually(lambda: [p for p in core.list_namespaced_pod(OPERATOR_NS).items
                                      if p.metadata.name != op.name and p.status.phase == "Running"], timeout=120)
            assert "--verbose" in new[0].spec.containers[0].args
            custom.patch_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, name,
                                                  {"metadata": {"labels": {"touched": "after-upgrade"}}})
            eventually(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, name)
                                .get("status") or {}).get("observedGeneration"))  # the new operator serves it
            assert sim.record(WORKLOAD_NS, server_pod).incarnations == 1  # no GPU pod restarted by the upgrade
            # docs/install.md's order: servers first, while the operator still runs (its resync timer holds a
            # Kopf finalizer on each server, which only a running operator removes), then the operator
            custom.delete_namespaced_custom_object(GROUP, VERSION, WORKLOAD_NS, PLURAL, name)
            eventually(lambda: _gone(custom.get_namespaced_custom_object, GROUP, VERSION, WORKLOAD_NS, PLURAL, name))
            inst.helm("uninstall", "qwen-hicache-operator", "-n", OPERATOR_NS, "--wait", "--timeout", "60s")
        deployment = inst.service_account  # the Deployment, ServiceAccount and ClusterRole share the fullname
        assert _gone(apps.read_namespaced_deployment, deployment, OPERATOR_NS)
        assert _gone(core.read_namespaced_service_account, deployment, OPERATOR_NS)
        assert _gone(client.RbacAuthorizationV1Api(api).read_cluster_role, deployment)
        assert _gone(custom.get_namespaced_custom_object, GROUP, VERSION, WORKLOAD_NS, PLURAL, name)
        eventually(lambda: _gone(apps.read_namespaced_stateful_set, name, WORKLOAD_NS))  # owner-reference GC
        kept = {c.metadata.name for c in core.list_namespaced_persistent_volume_claim(WORKLOAD_NS).items}
        assert kept == {*claims, "qwen-weights"}, "helm uninstall must never delete cache volumes"
        client.ApiextensionsV1Api(api).read_custom_resource_definition(f"{PLURAL}.{GROUP}")  # helm keeps crds/
