#!/usr/bin/env bash
# The one test command (README "Test", and what .ci/run calls): installs the pinned tools the
# tests need while formatting and lints run, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

# The pinned test tools install while fmt and clippy run (only the tests need them); their output
# is shown when they are done, and a failed install stops the run there.
tools_log=$(mktemp)
scripts/tools.sh install >"$tools_log" 2>&1 &
tools_pid=$!
trap 'kill "$tools_pid" 2>/dev/null || true; rm -f "$tools_log"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --all-targets --locked -- -D warnings
# The Lambda build (no default features: no serve, inject or webhook-config) compiles cleanly too.
cargo clippy --locked -p podmutator --no-default-features --bin podmutator -- -D warnings

step "pinned test tools (scripts/tools.sh install)"
tools_status=0
wait "$tools_pid" || tools_status=$?
cat "$tools_log"
if ((tools_status != 0)); then
	echo "scripts/tools.sh install failed (exit $tools_status): the tests cannot run without the tools" >&2
	exit "$tools_status"
fi

step "cargo test"
cargo test --locked --no-run
# The moto scenarios (one test) spend most of their ~4 minutes in the AWS provider's fixed waits,
# not on the CPU, and libtest, which starts tests in name order, would start them nearly last. So
# they start first, in a second run beside everything else; their output follows the rest's.
slow=terraform_apply::terraform_against_moto_alb_http_api_eks_network_the_examples_and_a_rotation
slow_log=$(mktemp)
trap 'kill "$tools_pid" "${slow_pid:-}" 2>/dev/null || true; rm -f "$tools_log" "$slow_log"' EXIT
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
