"""The status schema generated from the typed model is served by the real API server (`kubectl explain`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from kubernetes import client

from harness.demo import install_crd
from harness.devcluster.cluster import DevCluster
from harness.devcluster.tools import ensure_kubectl


def test_kubectl_explain_documents_the_status(devcluster: DevCluster, kube_api: client.ApiClient,
                                              tmp_path: Path) -> None:
    install_crd(kube_api, timeout=60)  # create or replace: other tests of the session may have installed it
    kubectl, out = str(ensure_kubectl()), ""
    for _ in range(30):  # the OpenAPI document lags the CRD by a moment
        got = subprocess.run([kubectl, "explain", "qhc.status.restart", f"--cache-dir={tmp_path}"],
                             env=devcluster.env(), capture_output=True, text=True, timeout=60)
        out = got.stdout
        if got.returncode == 0 and "inFlight" in out:
            break
        time.sleep(1)
    assert "inFlight" in out and "results" in out and "phase" in out, out
