"""Names several modules share: the API's identity, label and annotation keys (a leaf: imports nothing)."""

from __future__ import annotations

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
CONFIG_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/config-hash"
RESTART_ANNOTATION = f"{ANNOTATION_PREFIX}/restart"
FINGERPRINT_ANNOTATION = f"{ANNOTATION_PREFIX}/fingerprint"
"""On each cache volume claim: the cache namespace its pods read now (claims outlive the resource)."""
PREVIOUS_FINGERPRINTS_ANNOTATION = f"{ANNOTATION_PREFIX}/previous-fingerprints"
"""On each cache volume claim: earlier namespaces still kept on it, newest first, comma-separated."""
FINGERPRINT_ANNOTATION = f"{ANNOTATION_PREFIX}/fingerprint"


def standard_labels(app: str, instance: str, component: str) -> dict[str, str]:
    """The app.kubernetes.io labels every owned object carries (server and router objects alike)."""
    return {NAME_LABEL: app, INSTANCE_LABEL: instance, COMPONENT_LABEL: component, MANAGED_BY_LABEL: MANAGER}
