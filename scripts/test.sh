#!/usr/bin/env bash
# The one test command (README "Test", and what .ci/run calls): installs the pinned tools the
# tests need, then runs formatting, lints and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

step "pinned test tools (scripts/tools.sh install)"
scripts/tools.sh install

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --all-targets --locked -- -D warnings
# CI (.ci/run) also lints the Lambda build (no default features), whose other feature set has
# most dependencies checked a second time.

step "cargo test"
cargo test --locked --no-run
# The moto scenarios (one test) spend most of their ~4 minutes in the AWS provider's fixed waits,
# not on the CPU, and libtest, which starts tests in name order, would start them nearly last. So
# they start first, in a second run beside everything else; their output follows the rest's.
slow=terraform_apply::terraform_against_moto_alb_http_api_eks_network_the_examples_and_a_rotation
slow_log=$(mktemp)
trap 'kill "${slow_pid:-}" 2>/dev/null || true; rm -f "$slow_log"' EXIT
cargo test --locked --test integration -- --exact "$slow" >"$slow_log" 2>&1 &
slow_pid=$!
rest_status=0
cargo test --locked -- --skip "$slow" || rest_status=$?
slow_status=0
wait "$slow_pid" || slow_status=$?
cat "$slow_log"
if ((rest_status != 0 || slow_status != 0)); then
	echo "cargo test failed (exit $rest_status; the moto scenarios: exit $slow_status)" >&2
	exit 1
fi
grep -q '^test result: ok\. 1 passed' "$slow_log" ||
	{ echo "scripts/test.sh names a test that does not exist: $slow" >&2; exit 1; }
# The saved fuzz inputs replay as ordinary tests (tests/fuzz_regressions.rs); the coverage-guided
# runs themselves are CI's (.ci/run), since building cargo-fuzz and its targets takes minutes.
