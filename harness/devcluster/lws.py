"""The real LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0) run by the local control plane, out of cluster.

What a cluster's LWS install does, made to work without in-cluster networking:

- both CRDs from the module's `config/crd/bases` (the manager always starts a DisaggregatedSet controller and
  exits after two minutes without its CRD; the chart's copies add a conversion webhook no Service reaches);
- the manager's ClusterRole (`config/rbac/role.yaml`) bound to its own client-certificate user, so RBAC is
  enforced for it as for an in-cluster service account;
- a Configuration with leader election off, its internal cert management off (it would need a Service the API
  server can reach) and the secure metrics server off; the webhook server on 127.0.0.1 with a serving
  certificate signed by the harness CA;
- the module's webhook configurations (`config/webhook/manifests.yaml` with its kustomize patches: the pod
  webhooks only see pods carrying `leaderworkerset.sigs.k8s.io/name`), each client config turned into a
  `url:` on that server with the CA bundle. The pod webhook is what gives LWS pods their index labels and the
  LWS_* env, so it cannot be left out; `failurePolicy: Fail` as upstream.

The functions here build those objects from the module's files; `DevCluster` installs them and runs the manager.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from .build import LwsBuild

Obj = dict[str, Any]
LWS_USER = "lws-controller-manager"
CRDS = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
)
_PATCHES = {  # kustomize patches of config/webhook, by the configuration they target
    "MutatingWebhookConfiguration": "config/webhook/mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "config/webhook/validating-patch.yaml",
}
_PREFIX = "lws-"  # config/default's namePrefix
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 2.8 MB: libyaml parses them in 0.4 s, not 4


def crds(lws: LwsBuild) -> list[Obj]:
    return [yaml.load(lws.file(path).read_text(), Loader=_LOADER) for path in CRDS]


def cluster_role(lws: LwsBuild) -> Obj:
    """The manager's ClusterRole as the module ships it, renamed as config/default names it."""
    role = yaml.safe_load(lws.file("config/rbac/role.yaml").read_text())
    role["metadata"] = {"name": _PREFIX + role["metadata"]["name"]}
    return role


def role_binding(role: Obj, user: str = LWS_USER) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role["metadata"]["name"]},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def webhook_configurations(lws: LwsBuild, base_url: str, ca_pem: bytes) -> list[Obj]:
    """The module's webhook configurations with its patches applied, each client config a `url:` under
    `base_url` (the webhook server) that the API server verifies with `ca_pem`."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(lws.file("config/webhook/manifests.yaml").read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        for op in yaml.safe_load(lws.file(_PATCHES[doc["kind"]]).read_text()):
            _apply_replace(doc, op)
        doc["metadata"] = {"name": _PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": bundle}
        out.append(doc)
    return out


def _apply_replace(doc: Obj, op: Obj) -> None:
    """One JSON-patch `replace` of the kind config/webhook's patches use (`/webhooks/<n>`)."""
    if op.get("op") != "replace":
        raise ValueError(f"unsupported patch op {op.get('op')!r} in the LWS webhook patches")
    *parents, last = [p for p in op["path"].split("/") if p]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = op["value"]
    else:
        node[last] = op["value"]


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> Obj:
    """The manager's `config.lws.x-k8s.io/v1alpha1` Configuration for running outside the cluster."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
    }
