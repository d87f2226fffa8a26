# Sourced by the bench scripts. `BENCH_QUICK=1` makes each a smoke run of itself, which is how
# CI runs docs/performance.md's commands as written (.ci/run): binaries from the dev profile (the
# test build's, so nothing new is built for them), the fewest rounds, the first architecture
# only. Every step still runs and every answer is still checked; no figure it prints measures
# anything. Unset, the scripts build in the release profile and measure.
bench_quick() { [[ ${BENCH_QUICK:-} == 1 ]]; }
if bench_quick; then
	BENCH_PROFILE=dev
	BENCH_PROFILE_DIR=debug
else
	BENCH_PROFILE=release
	BENCH_PROFILE_DIR=release
fi
