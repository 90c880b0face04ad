"""The status schema generated from the typed model is served by the real API server (`kubectl explain`)."""

from __future__ import annotations

import subprocess

from harness.devcluster.cluster import DevCluster
from harness.devcluster.tools import ensure_kubectl


def test_kubectl_explain_documents_the_status(devcluster: DevCluster) -> None:
    kubectl = str(ensure_kubectl())
    env = devcluster.env()
    subprocess.run([kubectl, "apply", "--server-side", "-f", "crds/qwenhicacheservers.qwenhicache.io.yaml"],
                   check=True, env=env, capture_output=True, timeout=60)
    subprocess.run([kubectl, "wait", "--for=condition=Established", "crd/qwenhicacheservers.qwenhicache.io",
                    "--timeout=60s"], check=True, env=env, capture_output=True, timeout=90)
    out = ""
    for _ in range(30):  # the OpenAPI document lags the CRD by a moment
        got = subprocess.run([kubectl, "explain", "qhc.status.restart"], env=env, capture_output=True, text=True,
                             timeout=60)
        out = got.stdout
        if got.returncode == 0 and "inFlight" in out:
            break
        subprocess.run(["sleep", "1"], check=True)
    assert "inFlight" in out and "results" in out and "phase" in out, out
