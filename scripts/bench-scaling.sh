#!/usr/bin/env bash
# How admission time grows: against the number of secrets (1 -> 1,000), of containers
# (1 -> 10,000) and the review's size (1 kB -> 1.5 MB, etcd's limit), each point the median
# of at least 7 admissions in process (benches/admission.rs, ADMISSION_SCALING=1), beside its
# floor. Writes docs/scaling.csv and draws docs/scaling.svg (log-log, scripts/bench/plot_scaling.py,
# Python stdlib). One command:
#
#   scripts/bench-scaling.sh
#   BENCH=path/to/admission-<hash> scripts/bench-scaling.sh    # no build
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TARGET_DIR=$TARGET_DIR
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
# A smoke run (BENCH_QUICK=1): `cargo bench`'s own build of the bench, the curves written to a
# temporary directory rather than over docs/.
profile=release
OUT_DIR=$ROOT/docs
if bench_quick; then
	profile=bench
	OUT_DIR=$(mktemp -d)
	trap 'rm -rf "$OUT_DIR"' EXIT
fi

if [[ -z ${BENCH:-} ]]; then
	echo "== cargo build --profile $profile --locked --bench admission (target dir $TARGET_DIR)" >&2
	BENCH=$(cargo build --profile "$profile" --locked --bench admission --message-format=json-render-diagnostics |
		python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "admission" and m.get("executable"):
        print(m["executable"])')
fi
[[ -x ${BENCH:-} ]] || {
	echo "bench-scaling: no admission bench executable (${BENCH:-none})" >&2
	exit 1
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
ADMISSION_SCALING=1 "$BENCH" --bench >"$OUT_DIR/scaling.csv"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
column -s, -t <"$OUT_DIR/scaling.csv"
python3 scripts/bench/plot_scaling.py "$OUT_DIR/scaling.csv" "$OUT_DIR/scaling.svg"
echo "wrote $OUT_DIR/scaling.csv and $OUT_DIR/scaling.svg"
