"""`qwen-hicache`: print the CRD, render or size a resource offline, or run the operator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from .spec import API_VERSION, KIND

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def load_resources(path: str) -> list[dict[str, Any]]:
    """Every QwenHiCacheServer document in a YAML file (other kinds are ignored)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    found = [d for d in docs if d.get("kind") == KIND and d.get("apiVersion") == API_VERSION]
    if not found:
        raise SystemExit(f"error: {path} has no {API_VERSION} {KIND} document")
    return found


def offline_meta(doc: dict[str, Any]) -> dict[str, Any]:
    """Metadata as the API server would complete it (the uid is a placeholder offline)."""
    meta = doc.get("metadata") or {}
    if not meta.get("name"):
        raise SystemExit("error: the resource has no metadata.name")
    return {"name": meta["name"], "namespace": meta.get("namespace", "default"), "uid": PLACEHOLDER_UID}


def cmd_crd(_: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _plan_or_exit(doc: dict[str, Any]) -> Any:
    from .plan import plan

    p = plan(offline_meta(doc), doc.get("spec") or {})
    for prob in p.problems:
        level = "error" if prob.blocking else "warning"
        print(f"{level}: {doc['metadata']['name']}: {prob.reason}: {prob.message}", file=sys.stderr)
    return p


def cmd_render(args: argparse.Namespace) -> int:
    from .plan import objects

    failed = False
    for doc in load_resources(args.file):
        p = _plan_or_exit(doc)
        failed |= p.blocked
        if rendered := objects(p):
            sys.stdout.write(yaml.safe_dump_all(rendered, sort_keys=False, width=120))
    return 2 if failed else 0


def cmd_size(args: argparse.Namespace) -> int:
    import json

    from .sizing_report import render_table

    failed = False
    for doc in load_resources(args.file):
        p = _plan_or_exit(doc)
        failed |= p.blocked
        if p.sizing is None:
            continue
        if args.output == "json":
            print(json.dumps(p.sizing.explicit(), indent=2))
        else:
            print(render_table(p.sizing, title=doc["metadata"]["name"]))
    return 2 if failed else 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the operator; the chart's Deployment runs exactly this (see charts/qwen-hicache-operator)."""
    import kopf

    from .handlers import register
    from .settings import Settings, SettingsError

    try:
        register(Settings.load())
    except SettingsError as err:
        raise SystemExit(f"error: {err}") from None
    kopf.configure(verbose=args.verbose)
    if args.metrics_port:
        from .metrics import start_metrics_server

        start_metrics_server(args.metrics_port, addr=args.metrics_address)
    kopf.run(
        standalone=args.standalone,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qwen-hicache", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the CustomResourceDefinition").set_defaults(fn=cmd_crd)
    r = sub.add_parser("render", help="print the objects the operator would apply (no cluster)")
    r.add_argument("file", help="YAML with a QwenHiCacheServer ('-' for stdin)")
    r.set_defaults(fn=cmd_render)
    s = sub.add_parser("size", help="print host RAM, pod memory, shm and disk sizing (no cluster)")
    s.add_argument("file", help="YAML with a QwenHiCacheServer ('-' for stdin)")
    s.add_argument("-o", "--output", choices=["table", "json"], default="table")
    s.set_defaults(fn=cmd_size)
    o = sub.add_parser("run", help="run the operator (Kopf)")
    o.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    o.add_argument("--standalone", action="store_true", help="no Kopf peering (exactly one operator)")
    o.add_argument("--liveness", default=None, help="health endpoint, e.g. http://0.0.0.0:8080/healthz")
    o.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port (0: off)")
    o.add_argument("--metrics-address", default="0.0.0.0", help="address for --metrics-port")
    o.add_argument("-v", "--verbose", action="store_true")
    o.set_defaults(fn=cmd_run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
