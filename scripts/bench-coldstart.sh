#!/usr/bin/env bash
# Cold start of the release binary as a Lambda function, against a loopback Lambda Runtime API
# (scripts/bench/runtime_api.py, Python stdlib, 127.0.0.1 only): process start -> first
# response for one invocation of events/apigw-http-mutate.json, over STARTS starts (median, p90,
# max), the peak RSS of each start (VmHWM right after the response, cross-checked by 3 starts
# under `/usr/bin/time -v`), a warm-invocation figure, and `podmutator --version` as the exec
# floor. Prints a table. Targets (reported in the README, never asserted here):
# median < 30 ms, peak RSS < 32 MB.
#
#   scripts/bench-coldstart.sh                 # builds target/release/podmutator first
#   CARGO_TARGET_DIR=/work/target-bench scripts/bench-coldstart.sh
#   BIN=target/lambda/podmutator/bootstrap STARTS=50 scripts/bench-coldstart.sh   # no build
#
# Exits non-zero only when a start fails (crash, error report, timeout, wrong answer).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

STARTS=${STARTS:-20}
WARM=${WARM:-50}
EVENT=${EVENT:-events/apigw-http-mutate.json}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PYTHON=${PYTHON:-python3}

if [[ -z ${BIN:-} ]]; then
	echo "== cargo build --release --locked --bin podmutator (target dir $TARGET_DIR)" >&2
	cargo build --release --locked --bin podmutator >&2
	BIN=$TARGET_DIR/release/podmutator
fi
[[ -x $BIN ]] || {
	echo "bench-coldstart: $BIN is not an executable" >&2
	exit 2
}

# GNU time for the peak-RSS cross-check (Debian package `time`).
if [[ ! -x /usr/bin/time ]]; then
	echo "== installing Debian's time package (for time -v)" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time; } >&2 ||
		echo "bench-coldstart: could not install time; VmHWM alone gives the peak RSS" >&2
fi
TIME_V=()
[[ -x /usr/bin/time ]] && TIME_V=(--time-v /usr/bin/time)

echo "== machine"
echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "rustc: $(rustc -V)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "binary: $BIN ($(stat -c %s "$BIN") bytes)"
# The events' paths carry no token: the default run serves without one (http.pathTokenDisabled).
export PODMUTATOR_CONFIG="${PODMUTATOR_CONFIG:-{\"http\": {\"pathTokenDisabled\": true}}}"
echo "event: $EVENT; config: ${PODMUTATOR_CONFIG_FILE:-defaults (K8s manager, metrics and info logs on, stdout to /dev/null)} + $PODMUTATOR_CONFIG"
echo
"$PYTHON" scripts/bench/runtime_api.py --binary "$BIN" --event "$EVENT" --starts "$STARTS" --warm "$WARM" \
	--json "${JSON_OUT:-/dev/null}" "${TIME_V[@]}" && rc=0 || rc=$?
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "targets: median start->first response < 30 ms; peak RSS < 32 MB (reported, not asserted)"
exit "$rc"
