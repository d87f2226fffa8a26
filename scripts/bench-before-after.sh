#!/usr/bin/env bash
# Before/after of the admission bench in one run: two builds of benches/admission.rs (e.g. an
# older commit's in its own worktree and target dir, and this one), run back to back on the
# same machine state, each into its own criterion directory; prints the review medians of the
# cases both have and the ratio after/before. Only ratios taken here compare (the machine is
# shared); each bench also prints its own table against its floors.
#
#   BEFORE=/path/to/old/target/release/deps/admission-<hash> \
#   AFTER=target/release/deps/admission-<hash> scripts/bench-before-after.sh [criterion options]
#   CASES="b_task_3_k8s c_task_20_mixed" ...   # a subset
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${BEFORE:?set BEFORE to the older admission bench executable}"
: "${AFTER:?set AFTER to the newer admission bench executable}"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Case by case, before then after, so that a change in the machine's load between the two
# builds' runs weighs on one case, not on all of them.
CASES=${CASES:-a_bare b_task_3_k8s b_task_3_k8s_logged c_task_20_mixed c_task_20_embedded d_maximal_pod d_maximal_pod_mesh e_ten_thousand_containers}
for case in $CASES; do
	for side in before after; do
		exe=BEFORE
		[[ $side == after ]] && exe=AFTER
		# Each bench reads its fixtures relative to its own checkout (CARGO_MANIFEST_DIR at build).
		CRITERION_HOME=$OUT/$side "${!exe}" --bench "^$case/" "$@" >>"$OUT/$side.txt" 2>&1
	done
	echo "$case done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def medians(side, fn):
    d, res = os.path.join(out, side), {}
    for case in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        p = os.path.join(d, case, fn, "new", "estimates.json")
        if os.path.exists(p):
            res[case] = json.load(open(p))["median"]["point_estimate"]
    return res
b, a = medians("before", "review"), medians("after", "review")
bf, af = medians("before", "json_floor"), medians("after", "json_floor")
print()
print("review medians; 'normalised' divides each side by its own request floor (json_floor,")
print("measured beside it), which cancels most of a change in the machine's speed between the runs")
print("%-28s %12s %12s %13s %11s" % ("case", "before us", "after us", "after/before", "normalised"))
for case in sorted(set(b) & set(a)):
    norm = (a[case] / af[case]) / (b[case] / bf[case]) if case in af and case in bf else float("nan")
    print("%-28s %12.1f %12.1f %13.2f %11.2f" % (case, b[case] / 1e3, a[case] / 1e3, a[case] / b[case], norm))
PY
