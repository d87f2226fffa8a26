#!/usr/bin/env bash
# Before/after of the admission bench in one run: two builds of benches/admission.rs (e.g. an
# older commit's in its own worktree and target dir, and this one), run back to back on the
# same machine state, each into its own criterion directory; prints the review medians of the
# cases both have and the ratio after/before. Only ratios taken here compare (the machine is
# shared); each bench also prints its own table against its floors.
#
#   BEFORE=/path/to/old/target/release/deps/admission-<hash> \
#   AFTER=target/release/deps/admission-<hash> scripts/bench-before-after.sh [criterion filter]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${BEFORE:?set BEFORE to the older admission bench executable}"
: "${AFTER:?set AFTER to the newer admission bench executable}"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for side in before after; do
	exe=BEFORE
	[[ $side == after ]] && exe=AFTER
	echo "== $side: ${!exe}"
	# Each bench reads its fixtures relative to its own checkout (CARGO_MANIFEST_DIR at build).
	CRITERION_HOME=$OUT/$side "${!exe}" --bench "$@" | tee "$OUT/$side.txt" | grep -E '^[a-e]_|^case|^admission' || true
	echo "load after $side: $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def medians(side):
    d, res = os.path.join(out, side), {}
    for case in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        p = os.path.join(d, case, "review", "new", "estimates.json")
        if os.path.exists(p):
            res[case] = json.load(open(p))["median"]["point_estimate"]
    return res
b, a = medians("before"), medians("after")
print()
print("%-28s %14s %14s %10s" % ("case (review median)", "before us", "after us", "after/before"))
for case in sorted(set(b) & set(a)):
    print("%-28s %14.1f %14.1f %10.2f" % (case, b[case] / 1e3, a[case] / 1e3, a[case] / b[case]))
PY
