#!/usr/bin/env bash
# Instructions per review, counted by callgrind, for the cases of benches/admission.rs plus the
# bare pod and the 2,000-container pod, each against its unselected twin (the same review with
# the selector label removed), through the Lambda transport's path (an ALB event's bytes,
# `transport::lambda::handle`, the reply's bytes). Each case runs under
# `valgrind --tool=callgrind` for N and 2N reviews; the difference over N is the count per
# review, start-up excluded. Prints a table: instructions per review, the twin's, their ratio,
# memcpy's share, wall-clock per review for scale and each review's peak memory (native runs;
# not with --check), and the issue's targets met or missed. Counts do not depend on the machine's load.
#
#   scripts/bench-instructions.sh                   # builds the harness, measures every case
#   scripts/bench-instructions.sh --check           # fails when a case's ratio, or its or its
#                                                   # twin's instructions per review, is more
#                                                   # than 10% above benches/instructions-baseline.json
#   scripts/bench-instructions.sh --write-baseline  # measures and writes that baseline
#   scripts/bench-instructions.sh --cases b_task_3_k8s,wide_2000 --keep /tmp/prof
#   BIN=<built harness> scripts/bench-instructions.sh   # skips the build
#
# The harness is benches/instructions.rs, built in the `instructions` profile (the release
# profile with symbols, Cargo.toml) without default features, as the Lambda zip is. Profiles
# kept with --keep read with `callgrind_annotate <file>`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

die() {
	echo "bench-instructions: FAILED: $*" >&2
	exit 1
}
command -v valgrind >/dev/null || die "valgrind is not installed (apt-get install valgrind)"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate is not installed"

if [[ -z ${BIN:-} ]]; then
	echo "== cargo build --profile instructions --no-default-features --bench instructions" >&2
	BIN=$(cargo build --locked --profile instructions --no-default-features --bench instructions \
		--message-format=json-render-diagnostics |
		python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "instructions" and m.get("executable"):
        print(m["executable"])')
fi
[[ -n $BIN && -x $BIN ]] || die "no harness binary (${BIN:-none})"
exec python3 scripts/bench/instructions.py --bin "$BIN" \
	--baseline benches/instructions-baseline.json "$@"
