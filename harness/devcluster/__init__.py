"""A real local Kubernetes API server (1.36 apiserver code + etcd) for tests and the demo.

    from harness.devcluster import DevCluster
    with DevCluster() as cluster:          # builds once per machine (2-5 min cold), then ~1-2 s
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)

There is no scheduler, kubelet or controller (pods never run); owner-reference and namespace
garbage collection are approximated by a 1 s loop inside the server (see main.go).
"""

from .build import (
    BuildError,
    DevClusterError,
    apiserver_path,
    default_cache_dir,
    ensure_built,
    etcd_path,
    source_hash,
)
from .cluster import DevCluster, free_ports, make_certs, write_kubeconfig
from .tools import ensure_helm, ensure_kubectl

__all__ = [
    "BuildError",
    "DevCluster",
    "DevClusterError",
    "apiserver_path",
    "default_cache_dir",
    "ensure_built",
    "ensure_helm",
    "ensure_kubectl",
    "etcd_path",
    "free_ports",
    "make_certs",
    "source_hash",
    "write_kubeconfig",
]
