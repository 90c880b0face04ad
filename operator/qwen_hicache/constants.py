"""Names several modules share: the API's identity, label and annotation keys, the labels, selectors and owner
reference every owned object carries, and the in-pod scripts (a leaf: imports nothing of the package)."""

from __future__ import annotations

from importlib import resources

GROUP = "qwenhicache.io"
VERSION = "v1alpha1"
KIND = "QwenHiCacheServer"
PLURAL = "qwenhicacheservers"
SINGULAR = "qwenhicacheserver"
SHORT_NAMES = ["qhc"]
API_VERSION = f"{GROUP}/{VERSION}"

MANAGER = "qwen-hicache-operator"  # the one server-side-apply field manager, also the managed-by label value

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_OF_LABEL = "app.kubernetes.io/part-of"

ANNOTATION_PREFIX = GROUP
HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/desired-hash"
RENDER_VERSION_ANNOTATION = f"{ANNOTATION_PREFIX}/render-version"
RENDER_VERSION = "8"
"""The pod template's rendering (render.py): bumped when it changes, shown in status.launch."""
CONFIG_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/config-hash"
RESTART_ANNOTATION = f"{ANNOTATION_PREFIX}/restart"
FINGERPRINT_ANNOTATION = f"{ANNOTATION_PREFIX}/fingerprint"
"""On each cache volume claim: the cache namespace its pods read now (claims outlive the resource)."""
PREVIOUS_FINGERPRINTS_ANNOTATION = f"{ANNOTATION_PREFIX}/previous-fingerprints"
"""On each cache volume claim: earlier namespaces still kept on it, newest first, comma-separated."""

LWS_PREFIX = "leaderworkerset.sigs.k8s.io"
"""The labels LWS puts on a multi-node server's pods and claims (render_lws renders, group_rollout reads them)."""
LWS_NAME_LABEL = f"{LWS_PREFIX}/name"
GROUP_INDEX_LABEL = f"{LWS_PREFIX}/group-index"
WORKER_INDEX_LABEL = f"{LWS_PREFIX}/worker-index"
REVISION_LABEL = f"{LWS_PREFIX}/template-revision-hash"


def standard_labels(app: str, instance: str, component: str) -> dict[str, str]:
    """The app.kubernetes.io labels every owned object carries (server and router objects alike)."""
    return {NAME_LABEL: app, INSTANCE_LABEL: instance, COMPONENT_LABEL: component, MANAGED_BY_LABEL: MANAGER}


SERVER_APP, ROUTER_APP = "qwen-hicache-server", "qwen-hicache-router"
CACHE_VOLUME = "hicache"
"""The cache volume's name in the pod template; the StatefulSet names each claim `hicache-<server>-<n>`."""
PRESTOP_RECORD = ".qwen-hicache-prestop.json"
"""The last preStop's outcome, at the cache volume's root (every namespace's pods share it); its outcomes are
status_model.OUTCOMES. The preStop writes it (podlifecycle), its environment names it (launch)."""
JIT_CACHE_DIR = ".jit"
"""At the cache volume's root: the runtime's compile caches, one directory per namespace (launch points them there,
cache-guard prunes those of removed namespaces, the usage sidecar counts them apart from old namespaces)."""


def admin_secret_name(name: str) -> str:
    """The Secret holding a server's runtime admin key (guards /flush_cache and storage clear)."""
    return f"{name}-admin"


def labels(name: str) -> dict[str, str]:
    """Labels on every object of a server's serving side; the first two select its pods."""
    return standard_labels(SERVER_APP, name, "server")


def selector(name: str) -> dict[str, str]:
    """Stable pod selector (StatefulSet selectors are immutable: never add to this)."""
    return {k: v for k, v in labels(name).items() if k in (NAME_LABEL, INSTANCE_LABEL)}


def router_labels(name: str) -> dict[str, str]:
    """Labels on the router objects. Another name label than the serving pods': their selector (name and
    instance) must never match a router pod, or the StatefulSet and the rollout would count it."""
    return standard_labels(ROUTER_APP, name, "router")


def router_selector(name: str) -> dict[str, str]:
    """Router pods only (the serving pods' selector has no component key, so it never matches these)."""
    return {k: v for k, v in router_labels(name).items() if k in (NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL)}


def owned_selector(name: str) -> dict[str, str]:
    """Everything the operator made for one server, serving side and router alike (one list per kind)."""
    return {INSTANCE_LABEL: name, MANAGED_BY_LABEL: MANAGER}


def matches(obj: dict, wanted: dict[str, str]) -> bool:
    """Whether an object's labels include every label of `wanted`."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in wanted.items())


def owner_reference(meta: dict) -> dict:
    """Controller reference to the resource, so the garbage collector removes children with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_script(name: str) -> str:
    """The text of `pod_scripts/<name>`: code that runs inside a pod (preStop, cache guard, disk-usage sidecar),
    kept as real files so ruff and the tests read them; rendered into the pod spec byte for byte."""
    return resources.files(__package__).joinpath("pod_scripts", name).read_text()
