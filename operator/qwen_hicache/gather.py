"""What one reconcile reads from the cluster, gathered once per pass (the planner's and executor's inputs).

Reads are few and fixed: the children by kind (one list of the server's Services, one get per single child),
one list of pods (serving and router pods together), one list of cache claims, and the node memory (cached in
`Kube`). Every pure reading of those objects (pod problems, disk usage from the sidecars) lives here too, so
the executor acts on what was gathered and the reconciler only sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import diskusage, engine, units
from .constants import CACHE_VOLUME, INSTANCE_LABEL, matches, owned_selector, router_selector, selector
from .drift import Key, Live, key_of  # noqa: F401 - re-exported
from .kube import KubeClient
from .observed import CRASH_LOOPING, POD_FAILING, PodProblem

Obj = dict[str, Any]
LISTED_KINDS = frozenset({"Service"})
"""Kinds a server owns several objects of: read with one list by the owned-object labels."""


Ref = tuple[str, str, str]
"""(apiVersion, kind, name) of a child to read."""


def ref_of(obj: Obj) -> Ref:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def children(kube: KubeClient, meta: Obj, refs: list[Ref], first: bool, always: frozenset[str] = frozenset()
             ) -> Live:  # fmt: skip
    """The live counterpart of every desired child, one read per kind. `first`: the resource was never
    reconciled, so it has no children to read (a new resource is applied at once), except those of the kinds in
    `always` (the serving workload: a same-named one left by a deleted resource must be seen)."""
    live = Live()
    if first:
        for _, kind, name in refs:
            if kind not in always:
                live.put((kind, name), None)
        refs = [r for r in refs if r[1] in always]
    by_kind: dict[tuple[str, str], set[str]] = {}
    for api_version, kind, name in refs:
        by_kind.setdefault((api_version, kind), set()).add(name)
    for (api_version, kind), names in by_kind.items():
        if kind in LISTED_KINDS and len(names) > 1:
            found = {o["metadata"]["name"]: o
                     for o in kube.list(api_version, kind, meta["namespace"], owned_selector(meta["name"]))}
            for name in names:
                live.put((kind, name), found.get(name))
        else:
            for name in sorted(names):
                live.put((kind, name), kube.get(api_version, kind, meta["namespace"], name))
    return live


@dataclass(frozen=True)
class Pods:
    """The server's pods, listed once: the serving pods and the router's."""

    serving: list[Obj]
    router: list[Obj]


def pods(kube: KubeClient, meta: Obj) -> Pods:
    """One list by the instance label, split by each side's selector."""
    name = meta["name"]
    found = kube.list("v1", "Pod", meta["namespace"], {INSTANCE_LABEL: name})
    serving, routing = selector(name), router_selector(name)
    return Pods([p for p in found if matches(p, serving)], [p for p in found if matches(p, routing)])


def serving_pods(kube: KubeClient, meta: Obj) -> list[Obj]:
    """The serving pods right now (re-read before a delete: the promise is checked on fresh facts)."""
    return kube.list("v1", "Pod", meta["namespace"], selector(meta["name"]))


def claims(kube: KubeClient, meta: Obj) -> list[Obj]:
    """The server's volume claims (the StatefulSet's, labelled like its pods)."""
    return kube.list("v1", "PersistentVolumeClaim", meta["namespace"], selector(meta["name"]))


def cache_claims(claims: list[Obj], name: str) -> list[Obj]:
    """The cache volumes among them (`hicache-<server>-<n>`)."""
    prefix = f"{CACHE_VOLUME}-{name}-"
    return [c for c in claims if c["metadata"]["name"].startswith(prefix)]


DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


def node_capacity(kube: KubeClient, raw_spec: Obj) -> tuple[int | None, int | None]:
    """From one list of the nodes matching the node selector: the smallest allocatable memory, and the most
    allocatable GPUs of any (a node without the resource counts 0); each None when unknown or unreadable."""
    runtime = raw_spec.get("runtime") or {}
    nodes = kube.list_nodes(runtime.get("nodeSelector") or {})
    allocatable = [(n.get("status") or {}).get("allocatable") or {} for n in nodes]
    sizes = [units.to_bytes(str(m)) for a in allocatable if (m := a.get("memory"))]
    gpu = str(runtime.get("gpuResourceName") or DEFAULT_GPU_RESOURCE)
    gpus = [int(a.get(gpu) or 0) if str(a.get(gpu) or "0").isdigit() else 0 for a in allocatable]
    return (min(sizes) if sizes else None), (max(gpus) if gpus else None)


def ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_ips(pods: list[Obj]) -> dict[str, str]:
    """Ready, non-terminating pods with an IP: name -> IP."""
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
            if ready(p) and (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")}


CRASH_LOOP = "CrashLoopBackOff"
MESSAGE_CHARS = 600  # the tail of a container's last message kept in a condition


def _detail(term: Obj) -> str:
    detail = (term.get("message") or term.get("reason") or "").strip()
    return f": {detail[-MESSAGE_CHARS:]}" if detail else ""


def pod_problems(pods: list[Obj]) -> tuple[PodProblem, ...]:
    """Init-container failures (e.g. the cache guard refusing a directory of another configuration) and
    containers in a crash loop, each with the container's last message (its log tail on an error exit)."""
    out = []
    for pod in pods:
        status, name = pod.get("status") or {}, pod["metadata"]["name"]
        for st in status.get("initContainerStatuses") or []:
            term = (st.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                out.append(PodProblem(POD_FAILING, f"pod {name}: init container {st['name']} exited "
                                                   f"{term['exitCode']}{_detail(term)}"))
        for st in status.get("containerStatuses") or []:
            if ((st.get("state") or {}).get("waiting") or {}).get("reason") == CRASH_LOOP:
                last = (st.get("lastState") or {}).get("terminated") or {}
                out.append(PodProblem(CRASH_LOOPING, f"pod {name}: container {st['name']} in a crash loop, restarted "
                                      f"{st.get('restartCount', 0)} times, last exit {last.get('exitCode', '?')}"
                                      f"{_detail(last)}"))
    return tuple(out)


def disk_usage(pods: list[Obj]) -> tuple[tuple[str, diskusage.DiskUsage | None], ...]:
    """Each running pod's disk tier as its cache-usage sidecar reports it (None when it does not answer)."""
    running = [(pod["metadata"]["name"], ip) for pod in pods if (ip := (pod.get("status") or {}).get("podIP"))]
    return tuple((name, engine.read_usage(ip)) for name, ip in sorted(running))
