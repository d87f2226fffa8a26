#!/usr/bin/env bash
# Fleet simulation (issue 17): bursts of pod admissions over many independent webhook instances
# (as Lambda runs them) against a Secrets Manager that enforces AWS's request quotas. Runs
# benches/fleet.rs, which starts moto (127.0.0.1, pinned by scripts/tools.sh) and the quota proxy
# itself and stops them when it ends, then writes the results table into docs/scale.md (between
# its fleet-sim markers) and the plots docs/scale-throttles.svg and docs/scale-misses.svg.
#
#   scripts/fleet-sim.sh --full     # the figures in docs/scale.md: 1,000..20,000 pods over 30 s,
#                                   # up to 1,000 instances, run at 1/50 scale (see SCALE)
#   scripts/fleet-sim.sh            # a quick look: 500..2,000 pods over 10 s, 200 instances
#   STRATEGIES=parallel,parallel:16 scripts/fleet-sim.sh --full
#
# Environment: STRATEGIES (default batch,parallel,hybrid,parallel:16,reference,reference-batch,
# reference-list: the last three are embedded.delivery: reference, names resolved with
# DescribeSecret (shipped) and the pods fetching with parallel GetSecretValue or with
# BatchGetSecretValue, or names resolved with ListSecrets; `name:N` also sets
# embedded.maxCallsInFlightPerAdmission to N), PODS (comma list), SECONDS_PER_BURST, INSTANCES,
# SCALE (run 1/SCALE of the fleet against every quota divided by SCALE; default 50 with --full,
# else 20: two shared cores cannot drive 10,000 calls a second through a thousand SDK clients),
# INIT_MS (modelled Lambda cold start, default 200), SERVICE_MS (modelled latency of one
# Secrets Manager call, default 20), PROFILE (cargo profile, default dev: the profile the tests
# build, so no second build of the dependencies), RESULTS (keep the raw JSON lines there),
# CARGO_TARGET_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

FULL=0
for arg in "$@"; do
	case $arg in
	--full) FULL=1 ;;
	-h | --help)
		sed -n '2,23p' "$0"
		exit 0
		;;
	*)
		echo "fleet-sim.sh: unknown argument '$arg' (expected --full)" >&2
		exit 2
		;;
	esac
done

# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
# A smoke run (BENCH_QUICK=1): two strategies, one small burst of a second, the report written
# to a temporary copy of docs/scale.md.
DOC_DIR=docs
if bench_quick; then
	: "${STRATEGIES:=batch,reference}" "${PODS:=500}" "${SECONDS_PER_BURST:=1}" "${INSTANCES:=100}"
	DOC_DIR=$(mktemp -d)
	trap 'rm -rf "$DOC_DIR"' EXIT
	cp docs/scale.md "$DOC_DIR/"
fi

STRATEGIES=${STRATEGIES:-batch,parallel,hybrid,parallel:16,reference,reference-batch,reference-list}
if ((FULL)); then
	PODS=${PODS:-1000,2500,5000,10000,20000}
	SECONDS_PER_BURST=${SECONDS_PER_BURST:-30}
	INSTANCES=${INSTANCES:-1000}
	SCALE=${SCALE:-50}
	COMMAND="scripts/fleet-sim.sh --full"
else
	PODS=${PODS:-500,1000,2000}
	SECONDS_PER_BURST=${SECONDS_PER_BURST:-10}
	INSTANCES=${INSTANCES:-200}
	SCALE=${SCALE:-20}
	COMMAND="scripts/fleet-sim.sh"
fi
INIT_MS=${INIT_MS:-200}
SERVICE_MS=${SERVICE_MS:-20}
PROFILE=${PROFILE:-dev}
COMMAND="STRATEGIES=$STRATEGIES SCALE=$SCALE $COMMAND"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

# moto's executable, installed if missing: a missing tool is an error, not a skip.
scripts/tools.sh path moto_server >/dev/null
PYTHON=$(scripts/tools.sh path python)

RESULTS=${RESULTS:-$(mktemp -t fleet-sim.XXXXXX.jsonl)}
echo "fleet-sim.sh: strategies $STRATEGIES, pods $PODS over ${SECONDS_PER_BURST}s, up to $INSTANCES instances, 1/$SCALE scale; raw results in $RESULTS" >&2
BIN=$(cargo build --profile "$PROFILE" --locked --bench fleet --message-format=json-render-diagnostics |
	"$PYTHON" -c 'import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "fleet" and m.get("executable")]
print(exe[-1] if exe else "")')
[[ -n $BIN ]] || {
	echo "fleet-sim.sh: error: cargo built no fleet bench executable" >&2
	exit 1
}
"$BIN" --strategies "$STRATEGIES" --pods "$PODS" --seconds "$SECONDS_PER_BURST" \
	--instances "$INSTANCES" --scale "$SCALE" --init-ms "$INIT_MS" --service-ms "$SERVICE_MS" |
	tee "$RESULTS"

"$PYTHON" scripts/fleet-report.py "$RESULTS" "$DOC_DIR/scale.md" "$DOC_DIR/scale" "$COMMAND"
echo "fleet-sim.sh: wrote $DOC_DIR/scale.md, $DOC_DIR/scale-throttles.svg, $DOC_DIR/scale-misses.svg" >&2
