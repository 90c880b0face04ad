"""The chaos suite's instruments: an invariant sampler that polls pods continuously, and the operator as a
process a test can SIGKILL.

Invariants (issue 14), checked on every sample, per server:

- availability: `down = desired - Ready non-terminating pods` (desired: `spec.replicas`, but not above the count
  last seen all Ready, so pods a scale-up is still creating are not "down") never exceeds the rollout's
  budget `max(1, min(maxUnavailable, desired - 1))`, and never reaches `desired` when `desired > 1`. Over the
  budget, the pod that went down last is to blame: when it is one the test deleted itself (`external()`), the
  test broke the budget, not the operator (a pod the operator takes down while another is away still counts).
- one restart per pod per target: a pod already running the server's current target is never deleted (only
  outdated pods are restarted, so a second restart for one target shows as exactly this); the tests also
  count every incarnation the kubelet stand-in ran.
- no false pause: `status.restart` Paused with `ColdStart` while the pod's disk tier (the engine stand-in's
  own /sim/info) holds pages and the pod is not cold.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from qwen_hicache import rollout
from qwen_hicache.plan import parse_spec
from qwen_hicache.spec import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
ENGINE_PORT = 30000


@dataclass
class Violation:
    at: float
    server: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"+{self.at:.2f}s {self.server}: {self.kind}: {self.detail}"


@dataclass
class _Pod:
    uid: str
    target: str
    ready: bool
    terminating: bool


@dataclass
class _Track:
    """What the sampler remembers about one server."""

    settled: int = 0
    pods: dict[int, _Pod] = field(default_factory=dict)
    external: dict[int, str] = field(default_factory=dict)  # ordinal -> uid a test deleted
    deleted: set[str] = field(default_factory=set)
    down_since: float | None = None
    down_at: dict[int, float] = field(default_factory=dict)  # ordinal -> first sample seen down
    pauses: list[Obj] = field(default_factory=list)
    max_down: int = 0


class Sampler:
    """Polls the servers' pods and status every `interval` s in a thread; `violations` lists what broke."""

    def __init__(self, api: client.ApiClient, namespace: str, servers: list[str], interval: float = 0.15,
                 pod_ip: Callable[[str], str | None] | None = None) -> None:
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.namespace, self.interval, self.pod_ip = namespace, interval, pod_ip or (lambda _pod: None)
        self.tracks = {name: _Track() for name in servers}
        self.violations: list[Violation] = []
        self.samples = self.gaps = 0
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def external(self, pod: str) -> str:
        """Delete `pod` as someone else would (not the operator); its absence is the test's, not a violation."""
        server, ordinal = _split(pod)
        live = self.core.read_namespaced_pod(pod, self.namespace)
        with self._lock:
            self.tracks[server].external[ordinal] = live.metadata.uid
        self.core.delete_namespaced_pod(pod, self.namespace, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=live.metadata.uid)))
        return live.metadata.uid

    def report(self) -> str:
        lines = [f"{self.samples} samples, {self.gaps} gaps (API unreachable)"]
        for name, t in self.tracks.items():
            lines.append(f"  {name}: most down at once {t.max_down}, pauses {[p.get('reason') for p in t.pauses]}")
        return "\n".join([*lines, *map(str, self.violations[:20])])

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
                self.samples += 1
            except Exception:  # noqa: BLE001 - the API server may be down on purpose: a gap, not a failure
                self.gaps += 1
            self._stop.wait(self.interval)

    def _sample(self) -> None:
        raw = self.core.list_namespaced_pod(self.namespace, _preload_content=False, _request_timeout=5)
        pods = json.loads(raw.data)["items"]
        servers = {name: self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                             _request_timeout=5)
                   for name in self.tracks}
        now = time.monotonic() - self._t0
        with self._lock:
            for name, server in servers.items():
                mine = {}
                for p in pods:
                    if (m := re.fullmatch(rf"{re.escape(name)}-(\d+)", p["metadata"]["name"])) is not None:
                        mine[int(m.group(1))] = p
                self._check(name, server, mine, now)

    def _check(self, name: str, server: Obj, pods: dict[int, Obj], now: float) -> None:
        t, spec = self.tracks[name], server.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        target = rollout.target_of(parse_spec(spec))
        seen = {i: _view(p) for i, p in pods.items()}
        self._deletions(name, t, seen, target, replicas, now)
        up = {i for i, p in seen.items() if p.ready and not p.terminating and i < replicas}
        for i in [i for i, uid in t.external.items() if i in up and seen[i].uid != uid]:
            del t.external[i]  # the test's victim is back
        if len(up) == replicas:
            t.settled = replicas
        desired = min(replicas, t.settled)
        down = {i for i in range(desired) if i not in up}
        t.down_at = {i: t.down_at.get(i, now) for i in down}
        t.max_down = max(t.max_down, len(down))
        budget = max(1, min(int((spec.get("rollout") or {}).get("maxUnavailable", 1)), desired - 1))
        over = len(down) > budget or (desired > 1 and len(down) >= desired)
        # Over budget: whoever went down last made it so; a pod the test deleted itself excuses the operator.
        last = max(down, key=lambda i: (t.down_at[i], i in t.external)) if down else None
        if over and last not in t.external:
            t.down_since = now if t.down_since is None else t.down_since
            self._violate(now, name, "availability", f"{len(down)} of {desired} down (budget {budget}), "
                          f"for {now - t.down_since:.2f}s; down={sorted(down)} external={sorted(t.external)}")
        else:
            t.down_since = None
        t.pods = seen
        self._pause(name, t, (server.get("status") or {}).get("restart") or {}, now)

    def _deletions(self, name: str, t: _Track, seen: dict[int, _Pod], target: str, replicas: int,
                   now: float) -> None:
        """A pod deleted (terminating, or gone/replaced unseen) that already ran the current target."""
        for i, before in t.pods.items():
            after = seen.get(i)
            gone = after is None or after.uid != before.uid or after.terminating
            if not gone or before.uid in t.deleted:
                continue
            t.deleted.add(before.uid)
            if before.target == target and i < replicas and t.external.get(i) != before.uid:
                self._violate(now, name, "second restart", f"pod {name}-{i} uid {before.uid[:8]} already ran "
                              f"target {target} and was deleted")

    def _pause(self, name: str, t: _Track, rs: Obj, now: float) -> None:
        if rs.get("phase") != "Paused":
            return
        key = {"id": rs.get("id"), "reason": rs.get("reason")}
        if key in [{"id": p.get("id"), "reason": p.get("reason")} for p in t.pauses]:
            return
        t.pauses.append(dict(rs))
        if rs.get("reason") != "ColdStart":
            return
        pod = next((e["pod"] for e in rs.get("inFlight") or []), "")
        info = engine_info(self.pod_ip(pod)) if pod else None
        if info is not None and not info.get("cold") and info.get("disk_files", 0) > 0:
            self._violate(now, name, "false pause", f"ColdStart for {pod} whose disk tier holds "
                          f"{info['disk_files']} page files (not cold): {rs.get('message')}")

    def _violate(self, now: float, name: str, kind: str, detail: str) -> None:
        last = next((v for v in reversed(self.violations) if v.server == name and v.kind == kind), None)
        if last is not None and kind == "availability" and now - last.at < 1.0:
            self.violations[self.violations.index(last)] = Violation(last.at, name, kind, detail)  # one per episode
            return
        self.violations.append(Violation(now, name, kind, detail))


def _split(pod: str) -> tuple[str, int]:
    server, ordinal = pod.rsplit("-", 1)
    return server, int(ordinal)


def _view(pod: Obj) -> _Pod:
    view = rollout.PodView.from_pod(pod)
    return _Pod(view.uid, view.target, view.ready, bool(pod["metadata"].get("deletionTimestamp")))


def engine_info(ip: str | None) -> Obj | None:
    """The engine stand-in's own window (/sim/info), or None when it does not answer."""
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:{ENGINE_PORT}/sim/info", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def server_doc(name: str, namespace: str, replicas: int, max_unavailable: int = 1) -> Obj:
    """The shipped example, fast to roll in the harness (short request drain, 2-minute pod timeout)."""
    import copy

    from resources import example

    doc = copy.deepcopy(example())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["replicas"] = replicas
    doc["spec"]["runtime"]["maxRequestSeconds"] = 5
    doc["spec"]["rollout"] = {"podTimeoutSeconds": 120, "maxUnavailable": max_unavailable}
    return doc


class Fleet:
    """Servers of one namespace: create, patch, wait for rollouts (a thin layer over the API)."""

    def __init__(self, api: client.ApiClient, namespace: str, sim: Any) -> None:
        self.custom, self.namespace, self.sim = client.CustomObjectsApi(api), namespace, sim

    def get(self, name: str) -> Obj:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def patch(self, name: str, spec: Obj) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def up(self, name: str, replicas: int, timeout: float = 240) -> None:
        """Create `name` (unless it exists) and wait until all its pods are Ready and no rollout runs."""
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                        server_doc(name, self.namespace, replicas))
        except client.ApiException as err:
            if err.status != 409:
                raise
        self.sim.wait_ready(self.namespace, name, replicas, timeout=timeout)

    def restart(self, name: str) -> str:
        """A new `spec.restart` value (a fresh rollout); the value."""
        value = f"r{time.time_ns() % 10**10}"
        self.patch(name, {"restart": value})
        return value

    def restart_status(self, name: str) -> Obj:
        return (self.get(name).get("status") or {}).get("restart") or {}

    def wait_phase(self, name: str, value: str, phases: tuple[str, ...] = ("Complete", "Paused"),
                   timeout: float = 240) -> Obj:
        """Wait until the rollout for restart `value` reaches one of `phases`; its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                rs = self.restart_status(name)
                if rs.get("id", "").endswith(f"/{value}") and rs.get("phase") in phases:
                    return rs
            except Exception:  # noqa: BLE001 - the API server may be restarting
                pass
            time.sleep(0.2)
        raise AssertionError(f"{name}: rollout {value} not {phases} within {timeout}s: {self.restart_status(name)}")

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 0.05) -> Any:
        """Poll `check` fast (a chaos trigger must hit a step that lasts a fraction of a second)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if got := check():
                    return got
            except Exception:  # noqa: BLE001 - keep polling
                pass
            time.sleep(interval)
        raise AssertionError(f"not reached within {timeout}s: {what}")

    def incarnations(self, name: str, replicas: int) -> dict[str, int]:
        return {f"{name}-{i}": self.sim.record(self.namespace, f"{name}-{i}").incarnations for i in range(replicas)}
