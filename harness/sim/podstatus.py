"""SIMULATION ONLY: the pod status a kubelet would report, from the harness's view of the pod.

Shapes follow what ``kubectl get pods`` and controllers read: phase, hostIP, podIP(s), startTime,
conditions (PodScheduled, Initialized, ContainersReady, Ready), containerStatuses (state, lastState with
the last exit code and message, restartCount, CrashLoopBackOff/ErrImagePull waiting reasons) and
initContainerStatuses, so a failing init container shows as ``Init:Error``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .kubelet import PodProcesses

Obj = dict[str, Any]
WAITING = {"waiting": {"reason": "PodInitializing"}}


def stamp(epoch: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass
class ContainerState:
    """What the kubelet knows of one container: restarts, its last termination, why it waits."""

    restarts: int = 0
    started_at: float | None = None
    waiting: tuple[str, str] | None = None  # (reason, message)
    last_terminated: Obj | None = None
    history: list[int] = field(default_factory=list)


def _condition(ctype: str, ok: bool) -> Obj:
    return {"type": ctype, "status": "True" if ok else "False", "lastTransitionTime": stamp()}


def _init_state(name: str, state: str, failure: Obj | None) -> Obj:
    if failure is not None and failure["name"] == name:
        return {"terminated": {k: failure[k] for k in ("exitCode", "reason", "message")}}
    if state in ("running", "terminating") or failure is not None:
        return {"terminated": {"exitCode": 0, "reason": "Completed"}}  # failures stop at the first one
    return WAITING


def _init_statuses(procs: PodProcesses, state: str, failure: Obj | None) -> list[Obj]:
    out = []
    for c in procs.spec.get("initContainers") or []:
        st = _init_state(c["name"], state, failure)
        ok = st.get("terminated", {}).get("exitCode") == 0
        out.append({"name": c["name"], "image": c.get("image", ""), "ready": ok, "restartCount": 0, "state": st})
    return out


def _container_status(c: Obj, procs: PodProcesses, cs: ContainerState, state: str, ready: bool) -> Obj:
    proc = procs.procs.get(c["name"])
    running = state == "running" and proc is not None and proc.poll() is None and cs.waiting is None
    if running:
        st: Obj = {"running": {"startedAt": stamp(cs.started_at)}}
    elif cs.waiting is not None:
        st = {"waiting": {"reason": cs.waiting[0], "message": cs.waiting[1]}}
    else:
        st = WAITING
    out = {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": "",
        "ready": running and ready,
        "started": running,
        "restartCount": cs.restarts,
        "state": st,
    }
    if cs.last_terminated is not None:
        out["lastState"] = {"terminated": cs.last_terminated}
    return out


def pod_status(procs: PodProcesses, state: str, ready: bool, phase: str, failure: Obj | None,
               containers: dict[str, ContainerState], started: float) -> Obj:  # fmt: skip
    """The whole status object, written with one merge patch of pods/status."""
    conditions = [("PodScheduled", True), ("Initialized", state == "running"), ("ContainersReady", ready),
                  ("Ready", ready)]  # fmt: skip
    status: Obj = {
        "phase": phase,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": procs.ip,
        "podIPs": [{"ip": procs.ip}],
        "startTime": stamp(started),
        "conditions": [_condition(t, ok) for t, ok in conditions],
        "containerStatuses": [
            _container_status(c, procs, containers.setdefault(c["name"], ContainerState()), state, ready)
            for c in procs.containers
        ],
    }
    init = _init_statuses(procs, state, failure)
    if init:
        status["initContainerStatuses"] = init
    return status
