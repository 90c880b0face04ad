"""`make demo` (`python -m harness.demo`): the whole flow on one machine, on a real Kubernetes control plane.

Real: Kubernetes 1.36.3 (kube-apiserver with RBAC and the default admission chain, kube-controller-manager with
the StatefulSet, garbage-collector, PV, endpoint and node-lifecycle controllers, kube-scheduler) and etcd 3.6.8,
the operator (Kopf, server-side apply, status, events, the rollout), kubectl, the cache-guard and preStop
scripts, and the disk tier's file code (SGLang's own HiCacheFile, patched). Simulated by `harness.sim`: the
kubelet (nodes, pods as local processes) and the volume provisioner, and the engine (a GPU-free stand-in
speaking the runtime's HTTP contract).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from qwen_hicache import units
from qwen_hicache.crd import build_crd
from qwen_hicache.render import MANAGER, labels
from qwen_hicache.spec import GROUP, PLURAL, VERSION

from harness.polling import wait_for


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def install_crd(api: client.ApiClient, crd: dict[str, Any] | None = None, timeout: float = 30) -> None:
    """Create or replace a CRD (by default the generated one) and wait until the server serves it."""
    crd = crd or build_crd()
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as err:
        if err.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in (got.status.conditions or []))

    wait_for(established, f"CRD {crd['metadata']['name']} to be Established", timeout)


def apply_resource(api: client.ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply a QwenHiCacheServer as a user would with `kubectl apply --server-side`."""
    ns = doc["metadata"].setdefault("namespace", "default")
    custom = client.CustomObjectsApi(api)
    return custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, doc["metadata"]["name"], doc,
        field_manager="demo-user", force=True,
        _content_type="application/apply-patch+yaml",
    )


def wait_for_status(api: client.ApiClient, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """Wait until the operator has observed the current generation."""

    def observed() -> dict[str, Any] | None:
        obj = _server(api, ns, name)
        status = obj.get("status") or {}
        ok = status.get("observedGeneration") == obj["metadata"]["generation"] and status.get("conditions")
        return obj if ok else None

    return wait_for(observed, f"the operator's status for {ns}/{name}", timeout)


def _readable(quantities: dict[str, str] | None) -> dict[str, str]:
    """Sizes for people (`168Gi`, not `180388626432`); CPU and GPU counts as they are."""
    return {k: units.binary(v) if k in ("memory", "storage", "ephemeral-storage") else v
            for k, v in (quantities or {}).items()}


def describe_children(api: client.ApiClient, ns: str, name: str) -> str:
    """A short, readable summary of what the operator created."""
    sel = ",".join(f"{k}={v}" for k, v in labels(name).items() if k != "app.kubernetes.io/component")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    lines = []
    for sts in apps.list_namespaced_stateful_set(ns, label_selector=sel).items:
        c = sts.spec.template.spec.containers[0]
        lines.append(f"StatefulSet/{sts.metadata.name}: replicas={sts.spec.replicas} "
                     f"updateStrategy={sts.spec.update_strategy.type} image={c.image}")
        lines.append(f"  resources: requests={_readable(c.resources.requests)} limits={_readable(c.resources.limits)}")
        lines.append(f"  command: {' '.join(c.command + c.args)}")
        lines.append(f"  env: {[(e.name, e.value) for e in c.env or []]}")
        for t in sts.spec.volume_claim_templates or []:
            lines.append(f"  volumeClaimTemplate {t.metadata.name}: {_readable(t.spec.resources.requests)} "
                         f"retention={sts.spec.persistent_volume_claim_retention_policy.when_deleted}")
    for svc in core.list_namespaced_service(ns, label_selector=sel).items:
        lines.append(f"Service/{svc.metadata.name}: clusterIP={svc.spec.cluster_ip} "
                     f"ports={[p.port for p in svc.spec.ports]}")
    return "\n".join(lines)


def kubectl_get(kubeconfig: Path, ns: str, what: str = "qhc") -> str:
    """`kubectl get <what>` with the real kubectl binary (for qhc: the printer columns)."""
    from harness.devcluster import ensure_kubectl

    out = subprocess.run(
        [str(ensure_kubectl(log=say)), "--kubeconfig", str(kubeconfig), "-n", ns, "get", what, "-o", "wide"],
        capture_output=True, text=True, timeout=60,
    )
    return out.stdout + out.stderr


def _server(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == ctype), {})


def warm_rolling_restart(api: client.ApiClient, sim: Any, ns: str, name: str, replicas: int) -> dict[str, Any]:
    """Let the harness run the pods, then ask for a restart and wait for the verified warm rollout."""
    sim.wait_ready(ns, name, replicas, timeout=120)
    wait_for(lambda: _condition(_server(api, ns, name), "Ready").get("status") == "True", "Ready=True")
    say(f"{replicas} pods Ready (engine stand-ins on {', '.join(sim.pod_ip(ns, p) for p in sim.ready_pods(ns, name))})")
    say("requesting a cache-aware rolling restart: spec.restart=demo-1")
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"restart": "demo-1"}})

    def finished() -> dict[str, Any] | None:
        obj = _server(api, ns, name)
        rs = (obj.get("status") or {}).get("restart") or {}
        return obj if rs.get("id", "").endswith("/demo-1") and rs.get("phase") in ("Complete", "Paused") else None

    return wait_for(finished, "the rolling restart to finish", timeout=600, interval=0.5)


class RoutedConversations:
    """Conversations sent through the server's router (the real smg, run by the kubelet stand-in)."""

    SYSTEM = ("You are the support assistant of a large online shop; answer briefly and politely. " * 12)[:900]

    def __init__(self, api: client.ApiClient, sim: Any, ns: str, name: str, replicas: int) -> None:
        self.api, self.sim, self.ns, self.name, self.replicas = api, sim, ns, name, replicas
        self.texts = [f"{self.SYSTEM}\nuser-{c:03d}: my order {c * 7919} has not arrived, what now?" for c in range(8)]

    def _router_ip(self) -> str | None:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(self.ns,
                                                              label_selector="app.kubernetes.io/component=router")
        for pod in pods.items:
            ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
            if ready and pod.status.pod_ip and not pod.metadata.deletion_timestamp:
                return pod.status.pod_ip
        return None

    def landings(self, when: str) -> list[int]:
        from qwen_hicache.router import router_workers

        from harness.sim.routerlab import landing_replicas

        ip = wait_for(self._router_ip, "a ready router pod", timeout=120)
        names = {f"{self.name}-{i}": "ready" for i in range(self.replicas)}
        wait_for(lambda: router_workers(ip, 8000) == names, "every pod routable by name", timeout=120)
        engines = [f"http://{self.sim.pod_ip(self.ns, f'{self.name}-{i}')}:30000" for i in range(self.replicas)]
        model = _server(self.api, self.ns, self.name)["spec"]["model"]["servedName"]
        landed = landing_replicas(f"http://{ip}:8000", model, self.texts, engines)
        say(f"{len(landed)} conversations through the router {when}: replica of each = {landed}")
        return landed


def report_restart(obj: dict[str, Any], sim: Any, ns: str) -> None:
    """What proves the restart was warm: per-pod storage hits, preStop flushes, one restart per pod."""
    rs = obj["status"]["restart"]
    say(f"rollout {rs['phase']}: started {rs['started']}, finished {rs.get('finished', '-')}")
    for r in rs.get("results", []):
        rec = sim.record(ns, r["pod"])
        flushed = any("flush: 200" in out for out in rec.prestop_output)
        print(f"  {r['pod']}: warm={r['warm']} storageTokens={r['storageTokens']} "
              f"timeToReady={r['timeToReadySeconds']}s preStopFlushed={flushed} incarnations={rec.incarnations}")
    warm = _condition(obj, "CacheWarm")
    print(f"  CacheWarm={warm.get('status')} ({warm.get('reason')}): {warm.get('message')}")


def run_demo(example: Path, keep_seconds: float = 0) -> int:
    """Start everything, apply the example, show a warm rolling restart, print what happened, stop everything."""
    import tempfile

    from harness.devcluster import DevCluster
    from harness.inprocess import operator_thread
    from harness.sim.cluster import SimCluster
    from harness.sim.routerpod import RouterPods

    doc = yaml.safe_load(example.read_text())
    ns, name = doc["metadata"].get("namespace", "default"), doc["metadata"]["name"]
    say("starting a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler;"
        " the first run builds them from the Go module proxy: a few minutes)")
    with DevCluster(log=say) as cluster, tempfile.TemporaryDirectory(prefix="qwen-hicache-demo-") as work:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        say(f"control plane at {cluster.server} (up in {cluster.startup_seconds:.1f}s); installing the CRD")
        install_crd(api)
        say("registering two simulated 8-GPU nodes (kubelet stand-ins running the engine stand-in with the real "
            "SGLang HiCacheFile disk tier) and the volume provisioner; volumes under " + work)
        with SimCluster(api, Path(work) / "volumes", ns, log=lambda m: None) as sim, RouterPods(api, sim.root):
            sim.weights_claim(ns)
            say(f"starting the operator ({MANAGER}, Kopf, standalone)")
            with operator_thread():
                say(f"applying {example}")
                apply_resource(api, doc)
                obj = wait_for_status(api, ns, name)
                say("what the operator created:")
                print(describe_children(api, ns, name))
                sim.wait_ready(ns, name, doc["spec"].get("replicas", 1), timeout=180)
                say("kubectl get nodes,pods,pvc -o wide (scheduled by the real scheduler, claims bound by the real "
                    "PV controller):")
                print(kubectl_get(cluster.kubeconfig, ns, "nodes,pods,pvc"))
                say("kubectl get qhc -o wide:")
                print(kubectl_get(cluster.kubeconfig, ns))
                say("status:")
                print(yaml.safe_dump(obj["status"], sort_keys=False, width=120))
                replicas = doc["spec"].get("replicas", 1)
                routed = RoutedConversations(api, sim, ns, name, replicas) if replicas > 1 else None
                before = routed.landings("before the rollout") if routed else None
                obj = warm_rolling_restart(api, sim, ns, name, replicas)
                report_restart(obj, sim, ns)
                if routed:
                    sim.wait_ready(ns, name, replicas, timeout=120)
                    after = routed.landings("after the rollout")
                    same = sum(a == b for a, b in zip(before, after, strict=True))
                    say(f"{same} of {len(before)} conversations landed on the same replica before and after the "
                        "rolling restart (the router's prefix_hash ring is built from the pods' stable names)")
                say("kubectl get qhc -o wide:")
                print(kubectl_get(cluster.kubeconfig, ns))
                say("status.restart and status.cache:")
                print(yaml.safe_dump({k: obj["status"][k] for k in ("restart", "cache")}, sort_keys=False,
                                     width=120))
                if keep_seconds:
                    say(f"keeping the cluster up for {keep_seconds:.0f}s (KUBECONFIG={cluster.kubeconfig})")
                    time.sleep(keep_seconds)
    say("done: the control plane, etcd, the node stand-ins and the operator have stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harness.demo", description=run_demo.__doc__)
    ap.add_argument("--example", default=str(Path("examples/qwenhicache.yaml")))
    ap.add_argument("--keep", type=float, default=0, help="seconds to keep the cluster up at the end")
    args = ap.parse_args(argv)
    return run_demo(Path(args.example), keep_seconds=args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
