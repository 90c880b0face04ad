"""Start a real Kubernetes 1.36 control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, with fresh certificates, service-account signing keys, RBAC and the default admission chain;
and the real LeaderWorkerSet controller (v0.9.0) with its CRDs and webhooks (harness.devcluster.lws).

Only the node side is simulated (harness.sim: kubelet stand-in and volume provisioner).

Servers never outlive their owner: they get PR_SET_PDEATHSIG (when started from the main thread,
since the signal follows the forking *thread*), and a detached watchdog kills them and removes
the run directory once the owning process is gone or `max_lifetime_s` has passed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml

from harness.deathsig import die_with_parent

from . import lws as lws_setup
from .build import Binaries, DevClusterError, Log, LwsBuild, ensure_built, ensure_lws_built, tail

SUPERVISED = ("kube-controller-manager", "kube-scheduler", "lws-manager")
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP, first of SERVICE_CIDR
ISSUER = "https://kubernetes.default.svc.cluster.local"
STORAGE_CLASS = "local-dir"
PROVISIONER = "qwen-hicache.io/local-dir"
# The components, in start order; each gets its own client certificate (user from CN, groups from O).
_COMPONENT_USERS = {
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
}
_SERVER_SANS = ("IP:127.0.0.1", f"IP:{SERVICE_IP}", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local")  # fmt: skip
_NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
# Metadata level: who (user, groups, user agent) did what (verb, group, resource, subresource,
# namespace, name) and the response code, without request or response bodies.
_AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""
_STORAGE_CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": PROVISIONER,
    "reclaimPolicy": "Delete",
    "volumeBindingMode": "Immediate",
    "allowVolumeExpansion": True,
}
# Runs detached; argv: owner pid, deadline (epoch s), run dir. Kills every process whose command
# line names the run dir (so no pid list, and no pid-reuse accidents), then removes the dir.
_WATCHDOG = """
import os, shutil, signal, sys, time
owner, deadline, run_dir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
while os.getppid() == owner and time.time() < deadline:
    time.sleep(0.5)
def servers():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and run_dir.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                yield int(pid)
        except OSError:
            pass
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in servers():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(2)
shutil.rmtree(run_dir, ignore_errors=True)
"""


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, namespace: str = "default") -> Path:
    """A kubeconfig that verifies the server against `ca` (no insecure-skip-tls-verify)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin", "namespace": namespace}}],
        "current-context": "local",
        "users": [{"name": "admin", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def make_certs(run_dir: Path) -> None:
    """CA, the API server's serving cert, client certs for admin and the components, service-account keys."""
    (run_dir / "san.ext").write_text(f"subjectAltName={','.join(_SERVER_SANS)}\n")
    ca = ["-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=qwen-hicache-dev-ca"]
    _openssl("req", "-x509", *_NEW_KEY, "-days", "7", *ca, cwd=run_dir)
    sign_cert(run_dir, "server", "/CN=kube-apiserver", ["-extfile", "san.ext"])
    sign_cert(run_dir, "admin", "/O=system:masters/CN=admin")
    for name, subject in _COMPONENT_USERS.items():
        sign_cert(run_dir, name, subject)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key", cwd=run_dir)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=run_dir)


def sign_cert(run_dir: Path, name: str, subject: str, extra: list[str] | None = None) -> tuple[Path, Path]:
    """A key and a certificate `name`.{key,crt} in `run_dir`, signed by its CA; returns (crt, key).

    For client certificates the API server takes the user from CN and the groups from each O.
    """
    _openssl("req", *_NEW_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=run_dir)
    sign = ["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "7", *(extra or [])]
    _openssl("x509", "-req", "-in", f"{name}.csr", *sign, "-out", f"{name}.crt", cwd=run_dir)
    return run_dir / f"{name}.crt", run_dir / f"{name}.key"


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise DevClusterError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()}")


class DevCluster:
    """A throwaway real Kubernetes control plane on 127.0.0.1 (etcd, apiserver, controller-manager, scheduler,
    and the LeaderWorkerSet controller unless `lws=False`).

    Use as a context manager, or call start()/stop(). After start(): `.server`, `.kubeconfig` (admin, in
    `system:masters`), `add_user()` for any other identity (RBAC is enforced for it). No node exists until a
    kubelet stand-in registers one (harness.sim.cluster.SimCluster).
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        cache_dir: Path | str | None = None,
        startup_timeout_s: float = 90.0,
        max_lifetime_s: float = 8 * 3600,
        request_log: bool = False,
        node_monitor_grace_s: int = 40,
        toleration_seconds: int = 5,
        lws: bool = True,
        log: Log = print,
    ) -> None:
        """`request_log=True` audits every API request (see `requests()`); off by default because the log grows
        with every watch event and only RBAC tests need it. `node_monitor_grace_s` and `toleration_seconds`
        shorten the node lifecycle controller's grace period (50 s) and the default NoExecute tolerations
        (300 s) so node-loss tests finish sooner; the grace period still outlasts an API server restart under
        load (chaos tests: 15-20 s on 2 cores), as the real one does, so a restart alone never marks the nodes
        and their pods NotReady.
        `lws=False` leaves out the LeaderWorkerSet controller (its CRDs, webhooks and manager).
        Everything else runs with the components' defaults."""
        self._binaries, self._cache_dir = binaries, cache_dir
        self.request_log = request_log
        self.node_monitor_grace_s, self.toleration_seconds = node_monitor_grace_s, toleration_seconds
        self.startup_timeout_s, self.max_lifetime_s, self._log = startup_timeout_s, max_lifetime_s, log
        self.run_dir: Path | None = None
        self.server = ""
        self.api_port = 0
        self.startup_seconds = 0.0
        self._ports: tuple[int, int] = (0, 0)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._cmds: dict[str, list[str]] = {}
        self._supervisor: threading.Thread | None = None
        self._unsupervise = threading.Event()
        self._supervising = threading.Lock()  # a component stopped on purpose is never started again meanwhile
        self._bins: Binaries | None = None
        self.lws, self.lws_webhook_port = lws, 0
        self._lws: LwsBuild | None = None

    # ---- public ----

    @property
    def kubeconfig(self) -> Path:
        return self._dir / "kubeconfig"

    @property
    def ca_cert(self) -> Path:
        return self._dir / "ca.crt"

    @property
    def client_cert(self) -> tuple[Path, Path]:
        return self._dir / "admin.crt", self._dir / "admin.key"

    @property
    def audit_log(self) -> Path:
        return self._dir / "audit.log"

    def add_user(self, user: str, groups: tuple[str, ...] = (), namespace: str = "default") -> Path:
        """A kubeconfig authenticating as `user` in `groups` with a fresh client certificate from the CA.

        RBAC is enforced: the identity can do exactly what its (cluster) role bindings allow.
        """
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        # `/` and `,` are special in an openssl -subj string; service account names never contain them.
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        cert, key = sign_cert(self._dir, stem, subject)
        return write_kubeconfig(self._dir / f"{stem}.kubeconfig", self.server, self.ca_cert, cert, key, namespace)

    def requests(self, user: str | None = None) -> list[dict[str, Any]]:
        """Every API request the server has completed (or started streaming, for watches), oldest first.

        One dict per request: user, groups, userAgent, verb, apiGroup, apiVersion, resource, subresource,
        namespace, name, uri, code. Non-resource requests (`/api`, `/healthz`) have resource "" and the
        path in `uri`. Needs `DevCluster(request_log=True)`.
        """
        if not self.request_log:
            raise DevClusterError("DevCluster(request_log=True) is needed for requests()")
        by_id: dict[str, dict[str, Any]] = {}
        for line in self.audit_log.read_text().splitlines() if self.audit_log.exists() else ():
            event = json.loads(line)
            who = event.get("user") or {}
            if user is not None and who.get("username") != user:
                continue
            ref = event.get("objectRef") or {}
            by_id[event["auditID"]] = {  # a watch logs ResponseStarted, then ResponseComplete: keep one
                "user": who.get("username", ""),
                "groups": who.get("groups", []),
                "userAgent": event.get("userAgent", ""),
                "verb": event.get("verb", ""),
                "apiGroup": ref.get("apiGroup", ""),
                "apiVersion": ref.get("apiVersion", ""),
                "resource": ref.get("resource", ""),
                "subresource": ref.get("subresource", ""),
                "namespace": ref.get("namespace", ""),
                "name": ref.get("name", ""),
                "uri": event.get("requestURI", ""),
                "code": (event.get("responseStatus") or {}).get("code", 0),
            }
        return list(by_id.values())

    def env(self) -> dict[str, str]:
        """Environment additions for subprocesses (kubectl, helm, an operator) to use this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def start(self) -> DevCluster:
        """Start all four components on fresh loopback ports; returns once the control plane serves."""
        if self.run_dir is not None:
            raise DevClusterError("DevCluster already started")
        self._bins = self._binaries or ensure_built(self._cache_dir, self._log)
        self._lws = ensure_lws_built(self._cache_dir, self._log) if self.lws else None
        self.run_dir = Path(tempfile.mkdtemp(prefix="qwen-hicache-kube-"))
        started = time.monotonic()
        try:
            make_certs(self._dir)
            (self._dir / "audit-policy.yaml").write_text(_AUDIT_POLICY)
            self._start_watchdog()
            self._start_servers()
            self._install_storage_class()
            lws_started = time.monotonic()
            if self._lws is not None:
                self._start_lws(self._lws)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        lws = f" (LeaderWorkerSet controller: {time.monotonic() - lws_started:.1f}s of it)" if self._lws else ""
        self._log(
            f"devcluster: Kubernetes control plane {self.server} up in {self.startup_seconds:.1f}s{lws}; "
            f"KUBECONFIG={self.kubeconfig}"
        )
        return self

    def restart_apiserver(self, down_seconds: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM), stay down `down_seconds`, start it again on the same port; for chaos
        tests. Clients see connection errors meanwhile; etcd keeps every object."""
        self._stop_proc("kube-apiserver")
        time.sleep(down_seconds)
        self._spawn("kube-apiserver", self._apiserver_cmd(*self._ports))
        self._wait_ok("/readyz", time.monotonic() + self.startup_timeout_s)

    def stop_lws(self) -> None:
        """Stop the LeaderWorkerSet manager (SIGTERM) and keep it stopped (the supervisor restarts only what runs
        under it) until `start_lws`: what LWS misses while it is away, it never sees as an event. Its webhooks stay
        registered (failurePolicy Fail, as upstream), so meanwhile the API server refuses every create of a pod
        carrying the LWS name label, the worker StatefulSets' included."""
        if self._lws is None:
            raise DevClusterError("this cluster runs no LeaderWorkerSet controller (DevCluster(lws=False))")
        with self._supervising:
            self._stop_proc("lws-manager")

    def start_lws(self) -> None:
        """Start the LeaderWorkerSet manager again, as it ran (same configuration, ports and certificate); returns
        once its webhook server answers. It then lists everything afresh, as after a pod restart."""
        with self._supervising:
            if "lws-manager" in self._procs:
                raise DevClusterError("the LeaderWorkerSet manager is running")
            self._spawn("lws-manager", self._cmds["lws-manager"])
        self._wait_webhook_server(time.monotonic() + self.startup_timeout_s)

    def stop(self) -> None:
        """Stop every component and remove the run directory; safe to call more than once."""
        self._unsupervise.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
            self._supervisor = None
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        for name in ("lws-manager", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop_proc(name)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # ---- internals ----

    @property
    def _dir(self) -> Path:
        if self.run_dir is None:
            raise DevClusterError("DevCluster is not started")
        return self.run_dir

    def _start_servers(self) -> None:
        assert self._bins is not None
        deadline = time.monotonic() + self.startup_timeout_s
        for attempt in range(3):  # a free port can be taken by someone else before we bind it
            etcd_port, peer_port, api_port = free_ports(3)
            self._ports, self.api_port = (etcd_port, api_port), api_port
            self.server = f"https://127.0.0.1:{api_port}"
            self._spawn("etcd", self._etcd_cmd(etcd_port, peer_port))
            self._spawn("kube-apiserver", self._apiserver_cmd(etcd_port, api_port))
            try:
                self._wait_ok("/readyz", deadline)
                break
            except DevClusterError as exc:
                if attempt == 2 or "address already in use" not in str(exc):
                    raise
                for name in ("kube-apiserver", "etcd"):
                    self._stop_proc(name)
                shutil.rmtree(self._dir / "etcd", ignore_errors=True)
        write_kubeconfig(self.kubeconfig, self.server, self.ca_cert, *self.client_cert)
        for name in _COMPONENT_USERS:
            crt, key = self._dir / f"{name}.crt", self._dir / f"{name}.key"
            write_kubeconfig(self._dir / f"{name}.kubeconfig", self.server, self.ca_cert, crt, key)
        self._spawn("kube-controller-manager", self._controller_manager_cmd())
        self._spawn("kube-scheduler", self._scheduler_cmd())
        self._unsupervise.clear()
        self._supervisor = threading.Thread(target=self._supervise, name="devcluster-supervisor", daemon=True)
        self._supervisor.start()
        # the controller manager's root-CA publisher and service-account controller have run: it is working
        self._wait_ok("/api/v1/namespaces/default/configmaps/kube-root-ca.crt", deadline)
        self._wait_ok("/api/v1/namespaces/default/serviceaccounts/default", deadline)

    # fmt: off
    def _etcd_cmd(self, port: int, peer: int) -> list[str]:
        assert self._bins is not None
        client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        return [
            str(self._bins.etcd), "--data-dir", str(self._dir / "etcd"), "--name", "default",
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync", "--log-level", "warn",
            "--listen-metrics-urls", "",
        ]

    def _apiserver_cmd(self, etcd_port: int, port: int) -> list[str]:
        assert self._bins is not None
        d = self._dir
        return [
            str(self._bins.apiserver), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(port),
            "--tls-cert-file", str(d / "server.crt"), "--tls-private-key-file", str(d / "server.key"),
            "--client-ca-file", str(self.ca_cert), "--authorization-mode", "RBAC",
            "--service-account-issuer", ISSUER, "--service-account-key-file", str(d / "sa.pub"),
            "--service-account-signing-key-file", str(d / "sa.key"), "--service-cluster-ip-range", SERVICE_CIDR,
            "--default-not-ready-toleration-seconds", str(self.toleration_seconds),
            "--default-unreachable-toleration-seconds", str(self.toleration_seconds),
            "--profiling=false", "--cert-dir", str(d / "certs"),
            *(self._audit_flags() if self.request_log else []),
        ]

    def _controller_manager_cmd(self) -> list[str]:
        assert self._bins is not None
        d, kubeconfig = self._dir, str(self._dir / "kube-controller-manager.kubeconfig")
        return [
            str(self._bins.controller_manager), "--kubeconfig", kubeconfig, "--leader-elect=false",
            "--secure-port", "0", "--use-service-account-credentials", "--root-ca-file", str(self.ca_cert),
            "--service-account-private-key-file", str(d / "sa.key"), "--service-cluster-ip-range", SERVICE_CIDR,
            "--node-monitor-period", "1s", "--node-monitor-grace-period", f"{self.node_monitor_grace_s}s",
            "--profiling=false",
        ]

    def _scheduler_cmd(self) -> list[str]:
        assert self._bins is not None
        return [
            str(self._bins.scheduler), "--kubeconfig", str(self._dir / "kube-scheduler.kubeconfig"),
            "--leader-elect=false", "--secure-port", "0", "--profiling=false",
        ]

    def _audit_flags(self) -> list[str]:
        # blocking mode: an event is on disk before the response is sent, so a test reads it at once
        return [
            "--audit-policy-file", str(self._dir / "audit-policy.yaml"), "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json", "--audit-log-mode", "blocking", "--audit-log-maxsize", "0",
        ]
    # fmt: on

    def _install_storage_class(self) -> None:
        """The cluster's default StorageClass, served by the harness's provisioner (like a cloud's default)."""
        body = json.dumps(_STORAGE_CLASS).encode()
        self._request("POST", "/apis/storage.k8s.io/v1/storageclasses", body)

    def _start_lws(self, build: LwsBuild) -> None:
        """CRDs, RBAC, a serving certificate, the manager, then the webhooks pointing at it (harness.devcluster.lws).

        Order matters: the manager's informers need both CRDs; the webhooks (failurePolicy Fail) are registered
        only once the server answers, or every LWS pod create would fail."""
        deadline = time.monotonic() + self.startup_timeout_s
        d = self._dir
        crds = lws_setup.crds(build)
        for crd in crds:
            self._create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        role = lws_setup.cluster_role(build)
        self._create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
        self._create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", lws_setup.role_binding(role))
        kubeconfig = self.add_user(lws_setup.LWS_USER)
        (d / "lws-san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        crt, key = sign_cert(d, "lws-webhook", "/CN=lws-webhook-service", ["-extfile", "lws-san.ext"])
        certs = d / "lws-certs"
        certs.mkdir()
        crt.rename(certs / "tls.crt")
        key.rename(certs / "tls.key")
        for name in (c["metadata"]["name"] for c in crds):
            self._wait_established(name, deadline)
        self.lws_webhook_port, health_port = free_ports(2)
        config = d / "lws-config.yaml"
        config.write_text(yaml.safe_dump(lws_setup.configuration(self.lws_webhook_port, health_port, certs)))
        self._spawn("lws-manager", [str(build.manager), "--config", str(config), "--kubeconfig", str(kubeconfig),
                                    "--leader-elect=false", "--zap-devel=false"])  # fmt: skip
        self._wait_webhook_server(deadline)
        base = f"https://127.0.0.1:{self.lws_webhook_port}"
        for hooks in lws_setup.webhook_configurations(build, base, self.ca_cert.read_bytes()):
            self._create(f"/apis/admissionregistration.k8s.io/v1/{hooks['kind'].lower()}s", hooks)

    def _wait_established(self, crd: str, deadline: float) -> None:
        while True:
            code, body = self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conds = (json.loads(body).get("status") or {}).get("conditions") or [] if code == 200 else []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                return
            if time.monotonic() > deadline:
                raise DevClusterError(f"CRD {crd} not Established after {self.startup_timeout_s:.0f}s")
            time.sleep(0.25)  # each answer is the whole 1.3 MB CRD

    def _wait_webhook_server(self, deadline: float) -> None:
        """Until the manager's webhook server serves its pod webhook over TLS verified with the harness CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        url = f"https://127.0.0.1:{self.lws_webhook_port}/mutate--v1-pod"
        review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode()
        while True:
            req = urllib.request.Request(url, data=review, method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # registered (a review without a request is refused, but by the handler)
                    return
            except (urllib.error.URLError, OSError):
                pass
            self._check_alive()
            if time.monotonic() > deadline:
                raise DevClusterError(f"the LWS webhook server did not come up in {self.startup_timeout_s:.0f}s"
                                      f"{self._log_tails()}")  # fmt: skip
            time.sleep(0.1)

    def _supervise(self) -> None:
        """What a kubelet does for the control plane's static pods: a component that exits starts again. The
        scheduler exits on purpose when its cache turns inconsistent (seen after an API server restart in the
        middle of a binding); a control plane without a restart would schedule nothing from then on."""
        while not self._unsupervise.wait(1.0):
            for name in SUPERVISED:
                with self._supervising:
                    proc = self._procs.get(name)
                    if proc is not None and proc.poll() is not None:
                        self._log(f"devcluster: {name} exited with {proc.returncode}; starting it again")
                        if (out := self._logs.pop(name, None)) is not None:
                            out.close()
                        self._spawn(name, self._cmds[name])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        self._cmds[name] = cmd
        out = open(self._dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in _stop_proc
        self._logs[name] = out
        main = threading.current_thread() is threading.main_thread()  # the signal follows the forking thread
        self._procs[name] = subprocess.Popen(
            die_with_parent(cmd) if main else cmd,
            cwd=self._dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _start_watchdog(self) -> None:
        deadline = time.time() + self.max_lifetime_s
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(deadline), str(self._dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait_ok(self, path: str, deadline: float) -> None:
        while not self._get_ok(path):
            self._check_alive()
            if time.monotonic() > deadline:
                raise DevClusterError(f"control plane not ready ({path}) after {self.startup_timeout_s:.0f}s"
                                      f"{self._log_tails()}")  # fmt: skip
            time.sleep(0.1)

    def _request(self, method: str, path: str, body: bytes | None = None) -> int:
        return self._call(method, path, body)[0]

    def _call(self, method: str, path: str, body: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
        """(status, body) of one API request as the admin; status 0 when the server cannot be reached."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(*map(str, self.client_cert))
        req = urllib.request.Request(self.server + path, data=body, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def _create(self, path: str, obj: dict[str, Any]) -> None:
        code, body = self._call("POST", path, json.dumps(obj).encode(), timeout=30)
        if code != 201:
            raise DevClusterError(f"creating {obj['kind']} {obj['metadata']['name']} failed ({code}): {body[:500]!r}")

    def _get_ok(self, path: str) -> bool:
        return self._request("GET", path) == 200

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise DevClusterError(f"{name} exited with status {proc.returncode} during startup{self._log_tails()}")

    def _log_tails(self) -> str:
        return "".join(f"\n--- {n}.log (last lines) ---\n{tail(self._dir / f'{n}.log', 20)}" for n in self._procs)

    def _stop_proc(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out = self._logs.pop(name, None)
        if out is not None:
            out.close()
