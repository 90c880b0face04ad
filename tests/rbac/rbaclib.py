"""A small RBAC authorizer over the rules a chart installed, for checking recorded API calls offline.

The local API server enforces no RBAC, so the operator's calls are recorded (DevCluster request log)
and judged here with the RBAC semantics that matter for this chart: a RoleBinding grants its rules in
its namespace only; a ClusterRoleBinding grants its ClusterRole's rules everywhere, cluster-scoped
resources included.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from kubernetes import client

# What every authenticated user may GET without any chart rule: Kubernetes' default `system:discovery`
# and `system:public-info-viewer` ClusterRoles (bound to system:authenticated).
DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/version", "/version/",
                  "/openapi", "/openapi/*")


@dataclass(frozen=True)
class Call:
    """One API call as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with "/subresource" when there is one
    namespace: str  # "" for a cluster-scoped resource or an all-namespaces list/watch

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster scope)"
        return f"{self.verb} {self.group or 'core'}/{self.resource}{where}"


@dataclass(frozen=True)
class Grant:
    """One (verb, group, resource) a rule allows, in one namespace ("" = every namespace and cluster scope)."""

    verb: str
    group: str
    resource: str
    namespace: str

    @property
    def key(self) -> str:
        """Scope-free name used in the justification list, e.g. `apps/statefulsets get`."""
        return f"{self.group or 'core'}/{self.resource} {self.verb}"


Recorded = tuple[set[Grant], set[Call], set[str]]
"""What one operator run was granted, the resource calls it made, and the non-resource URLs it fetched."""


def calls_from(requests: list[dict[str, Any]]) -> tuple[set[Call], set[str]]:
    """Resource calls and non-resource URLs (query string dropped) from DevCluster.requests()."""
    calls, urls = set(), set()
    for r in requests:
        if r["resource"]:
            resource = r["resource"] + (f"/{r['subresource']}" if r["subresource"] else "")
            calls.add(Call(r["verb"], r["apiGroup"], resource, r["namespace"]))
            if r["verb"] == "patch" and r["code"] == 201:  # a server-side apply that created the object:
                calls.add(Call("create", r["apiGroup"], resource, r["namespace"]))  # authorized as create too
        else:
            urls.add(r["uri"].split("?", 1)[0])
    return calls, urls


def grants_for(api: client.ApiClient, namespace: str, service_account: str) -> set[Grant]:
    """Everything the installed (Cluster)RoleBindings grant to system:serviceaccount:<namespace>:<name>."""
    rbac = client.RbacAuthorizationV1Api(api)

    def bound(binding: Any) -> bool:
        return any(s.kind == "ServiceAccount" and s.name == service_account and s.namespace == namespace
                   for s in binding.subjects or [])

    grants: set[Grant] = set()
    for crb in filter(bound, rbac.list_cluster_role_binding().items):
        grants |= _expand(rbac.read_cluster_role(crb.role_ref.name).rules, "")
    for rb in filter(bound, rbac.list_role_binding_for_all_namespaces().items):
        ns = rb.metadata.namespace
        role = (rbac.read_namespaced_role(rb.role_ref.name, ns) if rb.role_ref.kind == "Role"
                else rbac.read_cluster_role(rb.role_ref.name))
        grants |= _expand(role.rules, ns)
    return grants


def _expand(rules: list[Any] | None, namespace: str) -> set[Grant]:
    return {Grant(v, g, r, namespace) for rule in rules or [] for g in rule.api_groups or []
            for r in rule.resources or [] for v in rule.verbs}


def rule_keys(docs: list[dict[str, Any]]) -> set[str]:
    """`Grant.key`s of every rule in rendered (Cluster)Roles, scope ignored."""
    return {Grant(v, g, r, "").key for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def allowed(call: Call, grants: set[Grant]) -> bool:
    """Whether RBAC would allow `call` (no wildcards to handle: the chart test forbids them)."""
    return any(g.verb == call.verb and g.group == call.group and g.resource == call.resource
               and (g.namespace == "" or g.namespace == call.namespace) for g in grants)


def used(grant: Grant, calls: set[Call]) -> bool:
    """Whether some recorded call needed this grant."""
    return any(allowed(c, {grant}) for c in calls if c.namespace == grant.namespace or grant.namespace == "")


def needs_no_rbac(url: str) -> bool:
    """Non-resource URLs every authenticated user may GET (discovery, health, version)."""
    return any(fnmatch.fnmatchcase(url, pattern) for pattern in DISCOVERY_URLS)
