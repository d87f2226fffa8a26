#!/usr/bin/env bash
# Time budgets of the bad-input corpus (tests/fixtures/bad-input/), in release, one case at a
# time: every case must be answered within 100 ms (or its own `budgetMs`, for the missed targets
# the README reports), best of three runs. Prints the slowest cases and exits non-zero when one
# is over its budget.
#
# Not part of scripts/test.sh: a debug build on a shared 2-core machine gives no steady
# milliseconds, so `cargo test` bounds the same cases by counted work instead (allocations and
# bytes allocated, linear in the bytes in and out; tests/bad_input.rs, tests/fuzz_regressions.rs).
# Run it on a quiet machine:
#
#   scripts/bench-bad-input.sh
#   BAD_INPUT_ONLY=huge/ scripts/bench-bad-input.sh     # one category (substring of <category>/<name>)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
# A smoke run (BENCH_QUICK=1): the test build, every case answered, the budgets not checked.
release=(--release)
bench_quick && release=()
exec cargo test "${release[@]}" --locked --test integration -- \
	--ignored --exact bad_input::release_timings --test-threads=1 --nocapture
