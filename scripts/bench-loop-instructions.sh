#!/usr/bin/env bash
# The fixed cost of an invocation, in instructions, through the whole Lambda loop: the release
# binary as Lambda runs it (against a loopback Runtime API, 127.0.0.1 only), under
# `valgrind --tool=callgrind`, for N and 2N invocations of the bare pod's ALB event; the
# difference over N is the count per invocation. Three configurations (logs and EMF line, logs
# only, neither) and the instruction harness's count for the same event break it down into the
# Runtime API client, the event/review/reply path, the EMF line and the log lines. Prints a
# table; exits non-zero only on a wrong answer or a crash. The counts move by up to 2% from run
# to run (the loop's socket reads and timers), unlike the harness's.
#
#   scripts/bench-loop-instructions.sh                 # builds both binaries, N=50
#   N=100 scripts/bench-loop-instructions.sh --keep /tmp/loop   # keep the profiles
#
# Both are built in the `instructions` profile without default features, as the Lambda zip is.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

die() {
	echo "bench-loop-instructions: FAILED: $*" >&2
	exit 1
}
command -v valgrind >/dev/null || die "valgrind is not installed (apt-get install valgrind)"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate is not installed"

echo "== cargo build --profile instructions --no-default-features --bin podmutator --bench instructions" >&2
built=$(cargo build --locked --profile instructions --no-default-features --bin podmutator --bench instructions \
	--message-format=json-render-diagnostics |
	python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("podmutator", "instructions"):
        print(m["target"]["name"], m["executable"])')
BIN=$(awk '$1 == "podmutator" { print $2 }' <<<"$built")
HARNESS=$(awk '$1 == "instructions" { print $2 }' <<<"$built")
[[ -x $BIN && -x $HARNESS ]] || die "missing binaries: ${built:-none}"

# The harness's bare case: the K8s manager, no path token.
exec python3 scripts/bench/loop_instructions.py --binary "$BIN" --harness "$HARNESS" --case bare \
	--config '{"webhook": {"secretManagerTypes": ["K8s"]}, "http": {"pathTokenDisabled": true}}' \
	-n "${N:-50}" "$@"
