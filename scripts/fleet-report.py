#!/usr/bin/env python3
"""Turns the fleet simulation's JSON lines into docs/scale.md's results table and two SVG plots.

    fleet-report.py RESULTS.jsonl DOC.md PLOT_PREFIX

Rewrites only the text between the `<!-- fleet-sim:begin -->` and `<!-- fleet-sim:end -->`
markers of DOC.md, and writes PLOT_PREFIX-throttles.svg and PLOT_PREFIX-misses.svg. Standard
library only: the plots are hand-written SVG.
"""

import json
import os
import sys
from collections import defaultdict

BEGIN = "<!-- fleet-sim:begin -->"
END = "<!-- fleet-sim:end -->"
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def fail(msg):
    print(f"fleet-report: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    runs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not a JSON line ({e})")
    if not runs:
        fail(f"{path}: no runs (did the simulation fail?)")
    return runs


def api_cell(run, op):
    a = run["apis"].get(op)
    if not a:
        return "–"
    return f"{a['calls']:,} ({a['peak_per_s']:,} / {a['mean_per_s']:,.0f})"


def pod_fetch_cell(run):
    """Reference delivery: of the admitted pods' own fetches, how many failed (and were
    throttled); the kubelet retries those after its back-off, the pod waiting in Init."""
    if not run.get("pod_fetches"):
        return "–"
    return f"**{run['pod_fetch_failed']:,}** ({run['pod_fetch_throttled']:,})"


def table(runs, command):
    ops = sorted({op for r in runs for op in r["apis"]})
    head = [
        "strategy",
        "pods",
        "pods/s",
        "instances (max)",
        "throttles",
        "deadline misses (failed / late / refused)",
        "p50 ms",
        "p99 ms",
    ] + [f"{op} calls (peak/s / mean/s)" for op in ops] + [
        "pods' own fetches failed (throttled)",
        "pod fetch p50 / p99 ms",
        "cost $",
        "cost $ per 10k pods",
    ]
    r0 = runs[0]
    scale = r0.get("scale", 1)
    scaled = (
        f" Run at 1/{scale} scale: {scale}× fewer pods and instances against every quota divided "
        f"by {scale}; counts, rates and cost below are the measured ones times {scale}."
        if scale > 1
        else ""
    )
    lines = [
        f"Measured by `{command}`; service latency {r0['service_ms']} ms a call, "
        f"cold start {r0.get('init_ms', 0)} ms before the instance builds, "
        f"deadline {r0['deadline_ms']} ms (`embedded.deadlineMs`), "
        f"burst length {r0['seconds']:g} s.{scaled}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in sorted(runs, key=lambda r: (r["strategy"], r["pods"])):
        cells = [
            f"`{r['strategy']}`",
            f"{r['pods']:,}",
            f"{r['pods_per_s']:,.0f}",
            f"{r['instances']} ({r['max_instances']})",
            f"{r['throttles']:,}",
            f"**{r['misses']:,}** ({r['failed']} / {r['late']} / {r['refused']})",
            f"{r['p50_ms']:,.0f}",
            f"{r['p99_ms']:,.0f}",
        ] + [api_cell(r, op) for op in ops] + [
            pod_fetch_cell(r),
            (
                f"{r['pod_fetch_p50_ms']:,.0f} / {r['pod_fetch_p99_ms']:,.0f}"
                if r.get("pod_fetches")
                else "–"
            ),
            f"{r['cost_usd']:.4f}",
            f"{r['cost_usd'] * 10_000 / max(r['pods'], 1):.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    health = max(r["max_dispatch_lag_ms"] for r in runs)
    rss = max(r["peak_rss_mb"] for r in runs)
    lines += [
        "",
        f"Simulator health: the latest arrival was dispatched {health:,.0f} ms after its "
        f"trace time (latencies are measured from the trace time, so lag counts against the "
        f"deadline); peak memory {rss:,.0f} MB for the whole fleet.",
    ]
    return "\n".join(lines)


def svg(runs, metric, title, path):
    w, h, left, right, top, bottom = 640, 380, 70, 170, 40, 50
    pw, ph = w - left - right, h - top - bottom
    series = defaultdict(list)
    for r in runs:
        series[r["strategy"]].append((r["pods_per_s"], r[metric]))
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    xmax = max(xs) * 1.05 or 1
    ymax = max(max(ys) * 1.1, 1)

    def sx(x):
        return left + pw * x / xmax

    def sy(y):
        return top + ph - ph * y / ymax

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
        f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">burst size (pods per second)</text>',
    ]
    for i in range(6):
        xv, yv = xmax * i / 5, ymax * i / 5
        out.append(
            f'<text x="{sx(xv):.1f}" y="{top + ph + 16}" text-anchor="middle">{xv:,.0f}</text>'
        )
        out.append(
            f'<text x="{left - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:,.0f}</text>'
        )
        out.append(
            f'<line x1="{left}" y1="{sy(yv):.1f}" x2="{left + pw}" y2="{sy(yv):.1f}" stroke="#ddd"/>'
        )
    for i, (name, pts) in enumerate(sorted(series.items())):
        c = COLOURS[i % len(COLOURS)]
        pts.sort()
        path_d = " ".join(
            f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for j, (x, y) in enumerate(pts)
        )
        out.append(f'<path d="{path_d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>')
        ly = top + 10 + 18 * i
        out.append(
            f'<line x1="{left + pw + 15}" y1="{ly}" x2="{left + pw + 35}" y2="{ly}" stroke="{c}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + pw + 40}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    if len(sys.argv) != 5:
        fail("usage: fleet-report.py RESULTS.jsonl DOC.md PLOT_PREFIX COMMAND")
    results, doc, prefix, command = sys.argv[1:]
    runs = load(results)
    with open(doc) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        fail(f"{doc}: needs the markers {BEGIN} and {END} around the results")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    name = os.path.basename(prefix)
    body = table(runs, command) + (
        f"\n\n![throttles against burst size]({name}-throttles.svg)\n"
        f"![deadline misses against burst size]({name}-misses.svg)"
    )
    with open(doc, "w") as f:
        f.write(before + BEGIN + "\n" + body + "\n" + END + after)
    svg(runs, "throttles", "ThrottlingException answers per burst", prefix + "-throttles.svg")
    svg(runs, "misses", "Admissions failed, late or refused per burst", prefix + "-misses.svg")


if __name__ == "__main__":
    main()
