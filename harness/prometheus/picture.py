"""Draw the HiCache dashboard from a real Prometheus run against the stand-ins: docs/dashboard.png.

    .venv/bin/pip install matplotlib   # only this script needs it
    python -m harness.prometheus.picture [--seconds 150] [--out docs/dashboard.png]

Grafana cannot be installed here, so the panels are drawn with matplotlib from `query_range` results of
the dashboard's own PromQL (Grafana's variables substituted: all namespaces and servers, 15 s rate
windows, the run's range for `$__range`). The scenario: traffic on two TP-2 engine stand-ins whose
device and host tiers overflow (so prompts come back from disk), a rolling restart (qwen-1 warm, qwen-0
cold, which pauses the rollout), more traffic, a retried restart of qwen-0 (warm) and a few failing
reconciles. Times are seconds, not the hours of a real fleet.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness.prometheus import dashboard
from harness.prometheus.stand import Stand, grafana_expr

REPO = Path(__file__).resolve().parents[2]


def run_scenario(stand: Stand, seconds: float) -> tuple[float, float]:
    start = time.time()
    unit = seconds / 10
    stand.reconciles(30)
    stand.traffic(3 * unit)
    stand.rollout("r1", cold_pods=("qwen-0",))
    stand.traffic(2 * unit)
    for _ in range(3):
        stand.reconciles(4, errors=1)
        stand.traffic(unit / 3)
    stand.rollout("r2", only=("qwen-0",))  # the admin retries: qwen-0 kept its pages this time
    stand.traffic(2 * unit)
    time.sleep(3)
    return start, time.time()


def _series(stand: Stand, expr: str, start: float, end: float, span: str) -> list[tuple[str, list, list]]:
    out = []
    for r in stand.query_range(grafana_expr(expr, "15s", span), start, end, 2):
        xs = [float(t) - start for t, _ in r["values"]]
        ys = [float(v) for _, v in r["values"]]
        out.append((r["metric"], xs, ys))
    return out


def _legend(fmt: str, labels: dict) -> str:
    import re

    return re.sub(r"\{\{(\w+)\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def draw(stand: Stand, start: float, end: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard.PANELS
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(16, 3.1 * rows), facecolor="#111217")
    span = f"{int(end - start) + 5}s"
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_facecolor("#181b1f")
        ax.set_title(panel.title, color="#d8d9da", fontsize=10, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        if panel.kind == "bargauge":
            names, values = [], []
            for expr, fmt in panel.targets:
                for labels, _, ys in _series(stand, expr, end - 1, end, span):
                    names.append(_legend(fmt, labels))
                    values.append(ys[-1] if ys else 0)
            ax.barh(names, values, color="#5794f2")
            for i, v in enumerate(values):
                text = f" {v:.0%}" if panel.unit == "percentunit" else f" {v:.3g}"
                ax.text(v, i, text, va="center", color="#d8d9da", fontsize=7)
            ax.invert_yaxis()
        else:
            stacks = []
            for expr, fmt in panel.targets:
                for labels, xs, ys in _series(stand, expr, start, end, span):
                    stacks.append((_legend(fmt, labels), xs, ys))
            if panel.stack and stacks:
                base: dict[float, float] = {}
                for name, xs, ys in stacks:
                    lows = [base.get(x, 0.0) for x in xs]
                    highs = [lo + y for lo, y in zip(lows, ys, strict=True)]
                    ax.fill_between(xs, lows, highs, alpha=0.5, label=name, step="post")
                    base.update(zip(xs, highs, strict=True))
            else:
                for name, xs, ys in stacks:
                    ax.plot(xs, ys, label=name, linewidth=1.2)
            if not stacks:
                ax.text(0.5, 0.5, "no data (created on first event)", transform=ax.transAxes, ha="center",
                        color="#8e8e8e")
            if panel.unit == "percentunit":
                ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
            ax.set_xlabel("seconds", color="#8e8e8e", fontsize=7)
            ax.set_xlim(0, end - start)
            if stacks:
                ax.legend(fontsize=6, facecolor="#181b1f", labelcolor="#d8d9da", ncol=2, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Qwen HiCache — rendered from Prometheus query results of the stand-ins (harness.prometheus.picture)",
                 color="#d8d9da", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=150)
    p.add_argument("--out", type=Path, default=REPO / "docs/dashboard.png")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="qhc-picture-") as tmp, Stand(Path(tmp)) as stand:
        start, end = run_scenario(stand, args.seconds)
        draw(stand, start, end, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
