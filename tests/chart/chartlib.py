"""Render the chart with the real helm binary; write or check the `kubectl apply -f` bundle.

Run `python tests/chart/chartlib.py` after changing the chart or the CRD to regenerate
examples/install/qwen-hicache-operator.yaml (a test fails while it is stale).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "qwen-hicache-operator"
EXAMPLES = ROOT / "examples"
BUNDLE = EXAMPLES / "install" / "qwen-hicache-operator.yaml"
VALUES_FILES = sorted(EXAMPLES.glob("helm-values-*.yaml"))
RELEASE, NAMESPACE = "qwen-hicache-operator", "qwen-hicache-system"
Obj = dict[str, Any]


@functools.cache
def helm() -> str:
    from harness.devcluster import ensure_helm

    return str(ensure_helm())


def helm_run(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """helm with `args`; stderr is kept (helm logs an INFO line for the chart's CRD symlink there)."""
    res = subprocess.run([helm(), *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{res.stdout}{res.stderr}")
    return res


def template_args(values: tuple[Path, ...] = (), sets: tuple[str, ...] = (), namespace: str = NAMESPACE) -> list[str]:
    """`helm template` arguments for the chart with these values files and --set strings."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    return args


def render(
    *values: Path, sets: tuple[str, ...] = (), include_crds: bool = False, namespace: str = NAMESPACE
) -> list[Obj]:
    """Every object `helm template` renders, in order."""
    args = template_args(values, sets, namespace) + (["--include-crds"] if include_crds else [])
    return [d for d in yaml.safe_load_all(helm_run(*args).stdout) if d]


def bundle_text() -> str:
    """The `kubectl apply -f` bundle: the namespace, the CRD and the chart's objects with default values."""
    rendered = helm_run(*template_args(), "--include-crds").stdout
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return (
        "# qwen-hicache operator, cluster-wide, for `kubectl apply --server-side -f` (no helm needed).\n"
        "# Generated from charts/qwen-hicache-operator with default values by `python tests/chart/chartlib.py`;\n"
        "# do not edit. For namespace-scoped mode or other settings, use the chart (docs/install.md).\n"
        "---\n" + yaml.safe_dump(namespace, sort_keys=False) + rendered
    )


if __name__ == "__main__":
    BUNDLE.parent.mkdir(parents=True, exist_ok=True)
    BUNDLE.write_text(bundle_text())
    print(f"wrote {BUNDLE.relative_to(ROOT)}", file=sys.stderr)
