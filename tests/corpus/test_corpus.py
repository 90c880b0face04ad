"""Over a hundred bad or borderline resources against the real API server with the operator running.

Every one is refused by the API server, or stored and refused by the operator with a specific condition
and Warning event and nothing applied, or (borderline but valid) applied in full and accepted by the API
server. The operator's log must not contain a single traceback or error over the whole corpus.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cases import CASES, Case
from kubehelpers import condition, eventually, get_server
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from qwen_hicache.constants import INSTANCE_LABEL, KIND
from qwen_hicache.spec import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration
BATCH = 13
"""Stored resources alive at once: bounds the operator's resync load on a 2-core CI machine."""


def _doc(case: Case, ns: str) -> dict:
    doc = copy.deepcopy(case.doc)
    doc["metadata"]["namespace"] = ns
    if not case.id.startswith("name-"):
        doc["metadata"]["name"] = case.id
    return doc


def _create(custom: client.CustomObjectsApi, doc: dict) -> dict:
    ns = doc["metadata"]["namespace"]
    return custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc, field_validation="Strict")


def test_corpus_is_large_and_covers_every_outcome() -> None:
    assert len(CASES) >= 100
    assert {c.expect for c in CASES} == {"api", "refused", "accepted"}
    assert len({c.id for c in CASES}) == len(CASES)


def test_api_server_refuses_schema_cases(crd: None, custom: client.CustomObjectsApi, namespace: str) -> None:
    failures = []
    for case in (c for c in CASES if c.expect == "api"):
        try:
            _create(custom, _doc(case, namespace))
            failures.append(f"{case.id}: accepted")
        except ApiException as err:
            if err.status not in (400, 422) or case.fragment not in (err.body or ""):
                failures.append(f"{case.id}: {err.status} {str(err.body)[:300]}")
    assert not failures, "\n".join(failures)
    assert not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]


def _observed(custom: client.CustomObjectsApi, ns: str, name: str) -> dict | None:
    obj = get_server(custom, ns, name)
    status = obj.get("status") or {}
    return obj if status.get("observedGeneration") == obj["metadata"]["generation"] and status.get("conditions") \
        else None


def _warnings(core: client.CoreV1Api, ns: str, name: str) -> set[str]:
    """Warnings about the resource itself: the control plane also warns about its children, which share its
    name (the API server's ClusterIP repair loop posted ClusterIPNotAllocated on a Service in a CI run)."""
    return {e.reason for e in core.list_namespaced_event(ns).items
            if e.involved_object.name == name and e.involved_object.kind == KIND and e.type == "Warning"}


def _children(kube_api: client.ApiClient, ns: str, name: str) -> list[str]:
    sel = f"{INSTANCE_LABEL}={name}"
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    return ([f"StatefulSet/{s.metadata.name}" for s in apps.list_namespaced_stateful_set(ns, label_selector=sel).items]
            + [f"Service/{s.metadata.name}" for s in core.list_namespaced_service(ns, label_selector=sel).items]
            + [f"PodDisruptionBudget/{b.metadata.name}" for b in
               client.PolicyV1Api(kube_api).list_namespaced_pod_disruption_budget(ns, label_selector=sel).items])


def _check_refused(case: Case, obj: dict, kube_api: client.ApiClient, ns: str) -> list[str]:
    name, core = obj["metadata"]["name"], client.CoreV1Api(kube_api)
    cond, degraded = condition(obj, case.condition) or {}, condition(obj, "Degraded") or {}
    out = []
    if (cond.get("status"), cond.get("reason")) != ("False", case.fragment):
        out.append(f"{case.condition}={cond.get('status')}/{cond.get('reason')}: {cond.get('message')}")
    if degraded.get("status") != "True":
        out.append(f"Degraded={degraded.get('status')}")
    try:
        eventually(lambda: case.fragment in _warnings(core, ns, name), timeout=20)
    except AssertionError:
        out.append(f"no Warning event {case.fragment}: {_warnings(core, ns, name)}")
    if children := _children(kube_api, ns, name):
        out.append(f"half-applied: {children}")
    return out


def _check_accepted(case: Case, obj: dict, kube_api: client.ApiClient, ns: str) -> list[str]:
    name, core = obj["metadata"]["name"], client.CoreV1Api(kube_api)
    out = [f"{t}={c.get('status')}/{c.get('reason')}: {c.get('message')}"
           for t in ("SpecValid", "SizingValid") if (c := condition(obj, t) or {}).get("status") != "True"]
    out += [f"{t} reason {c['reason']}: {c.get('message')}" for t in ("Ready", "Degraded")
            if (c := condition(obj, t) or {}).get("reason") in ("ApplyFailed", "PlanFailed")]
    children = set(_children(kube_api, ns, name))
    if children != {f"StatefulSet/{name}", f"Service/{name}", f"Service/{name}-headless",
                    f"PodDisruptionBudget/{name}"}:
        out.append(f"children: {sorted(children)}")
    try:
        eventually(lambda: set(case.warnings) <= _warnings(core, ns, name), timeout=20)
    except AssertionError:
        out.append(f"Warning events {_warnings(core, ns, name)}, expected {case.warnings}")
    if unexpected := _warnings(core, ns, name) - set(case.warnings):
        out.append(f"unexpected Warning events {unexpected}")
    try:  # the real StatefulSet controller must be able to create the pod (labels, names, volumes)
        eventually(lambda: core.read_namespaced_pod(f"{name}-0", ns), timeout=30)
    except AssertionError:
        out.append("the StatefulSet's pod was never created")
    failed = [e.message for e in core.list_namespaced_event(ns).items
              if e.involved_object.name == name and e.reason in ("FailedCreate", "FailedCreatePodSandBox")]
    if failed:
        out.append(f"the cluster refused a child: {failed}")
    return out


@pytest.mark.timeout(900)
def test_operator_refuses_or_applies_every_stored_case(
    operator_log: Any, kube_api: client.ApiClient, custom: client.CustomObjectsApi, namespace: str
) -> None:
    stored = [c for c in CASES if c.expect != "api"]
    failures: list[str] = []
    for start in range(0, len(stored), BATCH):
        batch = stored[start:start + BATCH]
        docs = [_doc(c, namespace) for c in batch]
        for doc in docs:
            _create(custom, doc)
        for case, doc in zip(batch, docs, strict=True):
            name = doc["metadata"]["name"]
            obj = eventually(lambda n=name: _observed(custom, namespace, n), timeout=60)
            check = _check_refused if case.expect == "refused" else _check_accepted
            failures += [f"{case.id}: {f}" for f in check(case, obj, kube_api, namespace)]
        for doc in docs:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc["metadata"]["name"])
    assert not failures, "\n".join(failures)
    assert not operator_log.bad, operator_log.report()
