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
# The Lambda build (no default features: no serve, inject or webhook-config) compiles cleanly too.
cargo clippy --locked -p podmutator --no-default-features --bin podmutator -- -D warnings

step "cargo test"
cargo test --locked
# The saved fuzz inputs replay as ordinary tests (tests/fuzz_regressions.rs); the coverage-guided
# runs themselves are CI's (.ci/run), since building cargo-fuzz and its targets takes minutes.
