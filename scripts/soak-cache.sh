#!/usr/bin/env bash
# Cache soak: refreshes 9,000 ids (half 1 KiB values, half not found) ROUNDS times (default 300)
# on the real clock and prints, every 25 rounds, the refreshes so far, the cache's own entry
# count and weight, and the process's RSS. A bounded cache prints flat entries, weight and RSS
# after the first rounds. Figures are reported, not asserted (the bound itself is asserted by
# the unit test `refreshing_9000_ids_100_times_holds_9000_entries` in crates/aws/src/secretsmanager.rs).
#
#   scripts/soak-cache.sh [ROUNDS]
#   PROFILE=release scripts/soak-cache.sh 1000     # optimised build (full LTO: minutes)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
args=(--example cache_soak --locked)
if [[ "${PROFILE:-dev}" == release ]]; then
	args+=(--release)
fi
exec cargo run -q "${args[@]}" -- "${1:-300}"
