#!/usr/bin/env python3
"""Instructions per review under callgrind, each case against its unselected twin.

Driven by scripts/bench-instructions.sh (which builds the harness, benches/instructions.rs, and
passes it as --bin). For every case and its twin (the same review with the selector label
removed) the harness runs under `valgrind --tool=callgrind` for N and 2N reviews; the difference
divided by N is the marginal count per review, start-up excluded. memcpy's share is the same
difference taken over the functions named memcpy/memmove (callgrind_annotate, exclusive counts).
Wall-clock per review (native runs, same marginal method) is printed for scale, never checked,
and so is each review's peak memory: what the first review of a native run adds to the resident
set at its peak (VmHWM after it, the mark reset after set-up, minus VmRSS before it).

  --check           compare with the baseline; exit 1 when a case's ratio, or its or its twin's
                    instructions per review, is more than --tolerance (10%) above it
  --write-baseline  write the measured figures as the new baseline
  --cases a,b       only these cases (default: all the harness lists)
Python standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Reviews per callgrind run (N; the second run has 2N), sized for about 10-100 M instructions
# of marginal work per case.
ITERS = {
    "bare": 40,
    "a_bare": 40,
    "b_task_3_k8s": 30,
    "b_task_3_k8s_logged": 30,
    "c_task_20_mixed": 8,
    "c_task_20_embedded": 8,
    "d_maximal_pod": 8,
    "d_maximal_pod_mesh": 8,
    "f_images_builder_10": 30,
    "f_images_rules_10": 30,
    "wide_2000": 2,
}
# Cases whose review is already unselected: no twin.
NO_TWIN = {"bare", "a_bare"}
# The targets (issue 39): ratio to the twin.
RATIO_TARGETS = {
    "b_task_3_k8s": 1.3,
    "c_task_20_mixed": 2.5,
    "c_task_20_embedded": 3.0,
    "wide_2000": 2.0,
}
WIDE_CONTAINERS = 2000
PER_CONTAINER_TARGET = 2000  # instructions per container, the wide pod unselected
MEMCPY_TARGET = 0.10
MEMCPY = re.compile(r"\b_*(mem(cpy|move)[A-Za-z0-9_]*)\b")


def total_of(out):
    """The instructions a callgrind profile counted in all."""
    totals = [l for l in Path(out).read_text().splitlines() if l.startswith(("totals:", "summary:"))]
    if not totals:
        sys.exit(f"bench-instructions: FAILED: no totals in {out}")
    return int(totals[-1].split()[1])


def callgrind(binary, case, n, out_dir):
    """(total Ir, memcpy Ir) of one run of `case` for `n` reviews."""
    out = Path(out_dir) / f"{case.replace(':', '.')}.{n}.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        binary,
        case,
        str(n),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench-instructions: FAILED: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    total = total_of(out)
    memcpy = 0
    annotate = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in annotate.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(\([\d.]+%\)\s+)?(\S.*)$", line)
        if m and MEMCPY.search(m.group(3)) and "PROGRAM TOTALS" not in line:
            memcpy += int(m.group(1).replace(",", ""))
    return total, memcpy, out


def marginal(binary, case, n, out_dir):
    """Instructions per review, memcpy's share of them, and the 2N run's profile."""
    t1, m1, _ = callgrind(binary, case, n, out_dir)
    t2, m2, out = callgrind(binary, case, 2 * n, out_dir)
    per = (t2 - t1) / n
    share = (m2 - m1) / (t2 - t1) if t2 > t1 else 0.0
    return per, share, out


def wall_us(binary, case, n):
    """Microseconds per review, native, the same marginal method (best of 3 each)."""

    def best(k):
        times = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([binary, case, str(k)], check=True, capture_output=True)
            times.append(time.perf_counter() - started)
        return min(times)

    k = n * 10
    return max(best(2 * k) - best(k), 0.0) / k * 1e6


def peak_kib(binary, case):
    """What one review adds to the resident set at its peak (KiB), native: the harness resets
    the high-water mark after set-up and reads VmHWM after the first review."""
    proc = subprocess.run([binary, case, "0"], check=True, capture_output=True, text=True)
    m = re.search(r"peak RSS \+(\d+) KiB", proc.stderr)
    if not m:
        sys.exit(f"bench-instructions: FAILED: no peak RSS from {case}: {proc.stderr[-2000:]}")
    return int(m.group(1))


def measure(binary, cases, out_dir, wall):
    rows = {}
    for case in cases:
        n = ITERS.get(case, 10)
        per, share, out = marginal(binary, case, n, out_dir)
        row = {"instructions": round(per), "memcpy_share": round(share, 4)}
        if wall:
            row["wall_us"] = round(wall_us(binary, case, n), 1)
            row["peak_kib"] = peak_kib(binary, case)
        if case not in NO_TWIN:
            tper, tshare, _ = marginal(binary, f"{case}:twin", n, out_dir)
            row["twin"] = round(tper)
            row["twin_memcpy_share"] = round(tshare, 4)
            row["ratio"] = round(per / tper, 3)
            if wall:
                row["twin_wall_us"] = round(wall_us(binary, f"{case}:twin", n), 1)
                row["twin_peak_kib"] = peak_kib(binary, f"{case}:twin")
        rows[case] = row
        print(f"  {case}: {row} ({out.name})", file=sys.stderr, flush=True)
    return rows


def verdicts(case, row):
    out = []
    if case in RATIO_TARGETS:
        t = RATIO_TARGETS[case]
        out.append(f"ratio ≤ {t}: {'met' if row['ratio'] <= t else 'MISSED'}")
    if case == "wide_2000":
        per = row["twin"] / WIDE_CONTAINERS
        met = per <= PER_CONTAINER_TARGET
        out.append(
            f"unselected {per:,.0f}/container ≤ {PER_CONTAINER_TARGET:,}: "
            f"{'met' if met else 'MISSED'}"
        )
    shares = [row["memcpy_share"], row.get("twin_memcpy_share", 0.0)]
    if max(shares) >= MEMCPY_TARGET:
        out.append("memcpy < 10%: MISSED")
    return "; ".join(out)


def table(rows):
    wall = any("wall_us" in r for r in rows.values())
    head = "| case | instructions / review | twin | ratio | memcpy (case / twin) |"
    rule = "|---|---:|---:|---:|---:|"
    if wall:
        head += " µs / review (case / twin) | peak RSS + KiB (case / twin) |"
        rule += "---:|---:|"
    print(head + " targets |")
    print(rule + "---|")
    for case, r in rows.items():
        twin = f"{r['twin']:,}" if "twin" in r else ""
        # From the counts, not the rounded ratio (7.1853 printed 7.18 from 7.185).
        ratio = f"{r['instructions'] / r['twin']:.2f}×" if "twin" in r else ""
        memcpy = f"{r['memcpy_share']:.1%}"
        if "twin_memcpy_share" in r:
            memcpy += f" / {r['twin_memcpy_share']:.1%}"
        line = f"| {case} | {r['instructions']:,} | {twin} | {ratio} | {memcpy} |"
        if wall:
            w = f"{r.get('wall_us', 0):,.1f}"
            if "twin_wall_us" in r:
                w += f" / {r['twin_wall_us']:,.1f}"
            peak = f"{r.get('peak_kib', 0):,}"
            if "twin_peak_kib" in r:
                peak += f" / {r['twin_peak_kib']:,}"
            line += f" {w} | {peak} |"
        print(line + f" {verdicts(case, r)} |")


def check(rows, baseline, tolerance):
    failures = []
    for case, base in baseline["cases"].items():
        if case not in rows:
            continue
        got = rows[case]
        for key in ("ratio", "instructions", "twin"):
            if key in base and key in got and got[key] > base[key] * (1 + tolerance):
                failures.append(
                    f"{case}: {key} {got[key]:,} against the baseline's {base[key]:,} "
                    f"(+{got[key] / base[key] - 1:.1%}, tolerance {tolerance:.0%})"
                )
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--baseline", required=True)
    p.add_argument("--check", action="store_true")
    p.add_argument("--write-baseline", action="store_true")
    p.add_argument("--cases", default="")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--no-wall", action="store_true")
    p.add_argument("--keep", help="keep the callgrind profiles in this directory")
    a = p.parse_args()

    listed = subprocess.run(
        [a.bin, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    cases = [c for c in a.cases.split(",") if c] or listed
    unknown = set(cases) - set(listed)
    if unknown:
        sys.exit(f"bench-instructions: no such case: {', '.join(sorted(unknown))}")

    started = time.monotonic()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        rows = measure(a.bin, cases, a.keep, wall=not (a.no_wall or a.check))
        kept = f"; profiles in {a.keep}"
    else:
        with tempfile.TemporaryDirectory(prefix="bench-instructions.") as out_dir:
            rows = measure(a.bin, cases, out_dir, wall=not (a.no_wall or a.check))
        kept = " (--keep <dir> keeps the profiles)"
    print(f"\n{len(cases)} cases in {time.monotonic() - started:.0f} s{kept}\n")
    table(rows)

    if a.write_baseline:
        kept = {
            c: {k: r[k] for k in ("instructions", "twin", "ratio") if k in r}
            for c, r in rows.items()
        }
        Path(a.baseline).write_text(
            json.dumps(
                {
                    "about": "instructions per review under callgrind "
                    "(scripts/bench-instructions.sh); --check fails above these by more "
                    "than the tolerance",
                    "tolerance": a.tolerance,
                    "cases": kept,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"\nwrote {a.baseline}")
    if a.check:
        baseline = json.loads(Path(a.baseline).read_text())
        tolerance = baseline.get("tolerance", a.tolerance)
        failures = check(rows, baseline, tolerance)
        if failures:
            print("\nbench-instructions: FAILED against " + a.baseline, file=sys.stderr)
            for f in failures:
                print("  " + f, file=sys.stderr)
            sys.exit(1)
        print(f"\nbench-instructions: every case within {tolerance:.0%} of {a.baseline}")


if __name__ == "__main__":
    main()
