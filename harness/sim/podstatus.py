"""SIMULATION ONLY: the pod status a kubelet would report, from the harness's view of the pod.

Shapes follow what ``kubectl get pods`` reads: phase, podIP(s), conditions (PodScheduled,
Initialized, ContainersReady, Ready), containerStatuses and initContainerStatuses, so a failing
init container shows as ``Init:Error`` and a running engine as ``Running`` with READY 0/1 or 1/1.
"""

from __future__ import annotations

import time
from typing import Any

from .kubelet import RUNTIME_CONTAINER, PodProcesses

Obj = dict[str, Any]
WAITING = {"waiting": {"reason": "PodInitializing"}}


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(ctype: str, ok: bool) -> Obj:
    return {"type": ctype, "status": "True" if ok else "False", "lastTransitionTime": _stamp()}


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


def _runtime_status(procs: PodProcesses, state: str, ready: bool, restarts: int) -> Obj:
    running = state == "running" and procs.proc is not None
    return {
        "name": RUNTIME_CONTAINER,
        "image": procs.container.get("image", ""),
        "ready": ready,
        "started": running,
        "restartCount": restarts,
        "state": {"running": {"startedAt": _stamp()}} if running else WAITING,
    }


def pod_status(procs: PodProcesses, state: str, ready: bool, phase: str, failure: Obj | None, restarts: int) -> Obj:
    """The whole status object, written with one merge patch of pods/status."""
    conditions = [("PodScheduled", True), ("Initialized", state == "running"), ("ContainersReady", ready),
                  ("Ready", ready)]  # fmt: skip
    status: Obj = {
        "phase": phase,
        "hostIP": "127.0.0.1",
        "podIP": procs.ip,
        "podIPs": [{"ip": procs.ip}],
        "conditions": [_condition(t, ok) for t, ok in conditions],
        "containerStatuses": [_runtime_status(procs, state, ready, restarts)],
    }
    init = _init_statuses(procs, state, failure)
    if init:
        status["initContainerStatuses"] = init
    return status
