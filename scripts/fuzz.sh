#!/usr/bin/env bash
# Fuzzes podmutator with cargo-fuzz (libFuzzer) for a bounded time per target.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]     default: 30 s each, all targets
#
# Targets (fuzz/fuzz_targets/): review, codec, lambda_event, handler. The oracles are in
# fuzz/src/harness.rs; a failed oracle, a panic, a timeout (-timeout, 10 s) or running out of
# memory is a crash: its input is saved under fuzz/artifacts/<target>/ and the script exits 1
# after running the remaining targets. Inputs slower than 100 ms (measured twice) are saved under
# fuzz/slow/<target>/ and listed; they fail the run only with FUZZ_FAIL_ON_SLOW=1. Turn a finding
# into a case of tests/fuzz_regressions.rs (copy the input to fuzz/regressions/<target>/).
#
# cargo-fuzz is installed pinned into the git-ignored .tools/ on first use. It needs nightly
# features, which the stable toolchain provides with RUSTC_BOOTSTRAP=1 (set here only).
#
# Environment:
#   FUZZ_SANITIZER      none (default: the crate forbids unsafe code) or address
#   FUZZ_TARGET_DIR     build directory (default fuzz/target, git-ignored)
#   FUZZ_TOOLS_DIR      where cargo-fuzz is installed (default .tools)
#   FUZZ_PROFILE        release (default: ~10,000 runs/s, a 6-minute build here) or dev (debug
#                       assertions on, ~450 runs/s, a 2-minute build: what scripts/test.sh runs)
#   FUZZ_JOBS           parallel fuzzing processes per target (default 1)
#   FUZZ_FAIL_ON_SLOW   1: slow units fail the run too
# The working corpora (fuzz/corpus/<target>, git-ignored) grow across runs; checked-in seeds are
# in fuzz/seeds/<target>, and the fixtures (events/, tests/fixtures/) are read as seeds too.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(review codec lambda_event handler)

die() {
	echo "fuzz.sh: error: $*" >&2
	exit 2
}

SECONDS_PER_TARGET=${1:-30}
[[ $SECONDS_PER_TARGET =~ ^[1-9][0-9]*$ ]] || die "seconds-per-target must be a positive integer, got '$SECONDS_PER_TARGET'"
shift $(($# > 0 ? 1 : 0))
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
	[[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || die "unknown target '$t' (targets: ${ALL_TARGETS[*]})"
done

TOOLS_DIR=${FUZZ_TOOLS_DIR:-$ROOT/.tools}
CARGO_FUZZ_ROOT=$TOOLS_DIR/cargo-fuzz-$CARGO_FUZZ_VERSION
TARGET_DIR=${FUZZ_TARGET_DIR:-$ROOT/fuzz/target}
SANITIZER=${FUZZ_SANITIZER:-none}
JOBS=${FUZZ_JOBS:-1}
SLOW_DIR=$ROOT/fuzz/slow
LOG_DIR=$ROOT/fuzz/artifacts/logs

if [[ ! -x $CARGO_FUZZ_ROOT/bin/cargo-fuzz ]]; then
	echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT"
	cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$CARGO_FUZZ_ROOT"
fi
export PATH="$CARGO_FUZZ_ROOT/bin:$PATH"
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

fuzz_flags=(--sanitizer "$SANITIZER" --target-dir "$TARGET_DIR")
case ${FUZZ_PROFILE:-release} in
release) ;;
dev) fuzz_flags+=(--dev) ;;
*) die "FUZZ_PROFILE must be release or dev, got '$FUZZ_PROFILE'" ;;
esac

echo "== building the fuzz targets (profile: ${FUZZ_PROFILE:-release}, sanitizer: $SANITIZER)"
cargo fuzz build "${fuzz_flags[@]}"

# Seed directories per target (libFuzzer reads them recursively and never writes to them).
seeds() {
	case $1 in
	review) echo tests/fixtures/reviews tests/fixtures/bad-input ;;
	lambda_event) echo events ;;
	esac
	for dir in "fuzz/seeds/$1" "fuzz/regressions/$1"; do
		[[ -d $dir ]] && echo "$dir"
	done
	return 0
}

max_len() {
	case $1 in
	review | lambda_event) echo 16384 ;;
	handler) echo 8192 ;;
	codec) echo 4096 ;;
	esac
}

mkdir -p "$LOG_DIR"
rm -rf "$SLOW_DIR"
crashed=()
summary=()
for t in "${TARGETS[@]}"; do
	corpus=fuzz/corpus/$t
	mkdir -p "$corpus" "fuzz/artifacts/$t"
	log=$LOG_DIR/$t.log
	mapfile -t seed_dirs < <(seeds "$t" | tr ' ' '\n')
	echo "== fuzzing $t for ${SECONDS_PER_TARGET}s (log: ${log#"$ROOT"/})"
	args=(
		-max_total_time="$SECONDS_PER_TARGET"
		-timeout=10
		-rss_limit_mb=4096
		-max_len="$(max_len "$t")"
		-dict="fuzz/dicts/$t.dict"
		-print_final_stats=1
	)
	if [[ $JOBS -gt 1 ]]; then
		args+=(-fork="$JOBS")
	fi
	status=0
	PODMUTATOR_FUZZ_SLOW_DIR=$SLOW_DIR cargo fuzz run "${fuzz_flags[@]}" "$t" "$corpus" "${seed_dirs[@]}" -- "${args[@]}" \
		>"$log" 2>&1 || status=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
	cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
	ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
	corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
	line=$(printf '%-13s %s  execs %s  exec/s %s  cov %s  ft %s  corpus %s' \
		"$t" "$([[ $status -eq 0 ]] && echo ok || echo "CRASH (exit $status)")" \
		"${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")
	summary+=("$line")
	if [[ $status -ne 0 ]]; then
		crashed+=("$t")
		echo "   crash in $t; the failure (full log: ${log#"$ROOT"/}):"
		grep -E -A4 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | grep -v '^ *[0-9]*: ' | head -n 30 | cut -c1-600 | sed 's/^/   | /'
		ls -1 "fuzz/artifacts/$t" | sed 's/^/   artifact: /'
	fi
done

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
slow_units=()
if [[ -d $SLOW_DIR ]]; then
	mapfile -t slow_units < <(find "$SLOW_DIR" -type f | sort)
fi
if [[ ${#slow_units[@]} -gt 0 ]]; then
	echo "slow units (over 100 ms twice):"
	printf '  %s\n' "${slow_units[@]#"$ROOT"/}"
fi
if [[ ${#crashed[@]} -gt 0 ]]; then
	echo "fuzz.sh: crashes in: ${crashed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
	exit 1
fi
if [[ ${#slow_units[@]} -gt 0 && ${FUZZ_FAIL_ON_SLOW:-0} == 1 ]]; then
	echo "fuzz.sh: slow units found (FUZZ_FAIL_ON_SLOW=1)" >&2
	exit 1
fi
echo "fuzz.sh: no crashes"
