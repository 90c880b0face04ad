"""`python -m harness.devcluster build|up`: prepare the cache (setup/CI) or run a cluster by hand."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from . import DevCluster, DevClusterError, ensure_built, ensure_helm, ensure_kubectl, ensure_lws_built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.devcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build the control plane, etcd and LWS, fetch kubectl + helm into the cache")
    sub.add_parser("up", help="start a cluster, print its KUBECONFIG, run until interrupted")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            bins = ensure_built()
            print(f"control plane: {bins.apiserver.parent}")
            print(f"lws:           {ensure_lws_built().manager}")
            print(f"kubectl:       {ensure_kubectl()}\nhelm:          {ensure_helm()}")
        else:
            _up()
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _up() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so `finally` stops the servers
    with DevCluster() as cluster:
        print(f"export KUBECONFIG={cluster.kubeconfig}  # Ctrl-C stops the cluster", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    sys.exit(main())
