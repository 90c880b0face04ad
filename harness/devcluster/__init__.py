"""A real local Kubernetes 1.36 control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
and the real LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0).

    from harness.devcluster import DevCluster
    with DevCluster() as cluster:          # builds once per machine (about 6 min cold), then a few seconds
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)

No node exists until harness.sim's kubelet stand-in registers one; that and the volume provisioner are the
only simulated parts.
"""

from .build import (
    Binaries,
    BuildError,
    DevClusterError,
    LwsBuild,
    binaries,
    cache_root,
    default_cache_dir,
    ensure_built,
    ensure_lws_built,
    file_lock,
    lws_build,
    source_hash,
)
from .cluster import PROVISIONER, STORAGE_CLASS, DevCluster, free_ports, make_certs, write_kubeconfig
from .tools import ensure_helm, ensure_kubectl

__all__ = [
    "PROVISIONER",
    "STORAGE_CLASS",
    "Binaries",
    "BuildError",
    "DevCluster",
    "DevClusterError",
    "LwsBuild",
    "binaries",
    "cache_root",
    "default_cache_dir",
    "ensure_built",
    "ensure_helm",
    "ensure_kubectl",
    "ensure_lws_built",
    "file_lock",
    "free_ports",
    "lws_build",
    "make_certs",
    "source_hash",
    "write_kubeconfig",
]
