#!/usr/bin/env bash
# Size of the deployable Lambda artefact: `cargo lambda build --release --output-format zip` for
# x86_64 and arm64 (cross-compiled with zig), each at the release profile's opt-level (3) and at
# opt-level "s" (set with CARGO_PROFILE_RELEASE_OPT_LEVEL, Cargo.toml untouched). Prints the
# bootstrap binary and the zip size per build. Target (reported, not asserted): zip < 5 MB.
#
#   CARGO_TARGET_DIR=/work/target-bench scripts/bench-size.sh
#   COMBOS="3:x86_64" scripts/bench-size.sh              # one build (opt-level:arch ...)
#
# Every build is a full LTO build (~3-8 min each on 2 cores). Zips land in
# $TARGET_DIR/lambda-size/<opt>-<arch>/podmutator/bootstrap.zip. Exits non-zero only when a
# build fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh

COMBOS=${COMBOS:-3:x86_64 3:arm64 s:x86_64 s:arm64}
# A smoke run: the first combination, in the dev profile.
release=--release
bench_quick && COMBOS=${COMBOS%% *} && release=
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET_DIR/lambda-size
LIMIT=5000000

# cargo lambda and zig come from the pinned tools venv; zig is found through `python3 -m ziglang`.
PATH="$(scripts/tools.sh path bin):$PATH"
export PATH
if [[ " $COMBOS " == *":arm64 "* ]] && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
	echo "== rustup target add aarch64-unknown-linux-gnu" >&2
	rustup target add aarch64-unknown-linux-gnu >&2
fi

rows=()
for combo in $COMBOS; do
	opt=${combo%%:*}
	arch=${combo#*:}
	dir=$OUT/$opt-$arch
	rm -rf "$dir"
	flag=--x86-64
	[[ $arch == arm64 ]] && flag=--arm64
	echo "== opt-level=$opt $arch: cargo lambda build ${release:---profile dev} --locked --output-format zip $flag" >&2
	t0=$SECONDS
	if ! CARGO_PROFILE_RELEASE_OPT_LEVEL=$opt cargo lambda build $release --locked \
		--output-format zip "$flag" --bin podmutator --lambda-dir "$dir" >&2; then
		echo "bench-size: FAILED: build opt-level=$opt $arch" >&2
		exit 1
	fi
	zip=$(find "$dir" -name bootstrap.zip | head -1)
	if [[ ! -f $zip ]]; then
		echo "bench-size: FAILED: no bootstrap.zip under $dir" >&2
		exit 1
	fi
	bin_bytes=$(unzip -l "$zip" | awk '$4 == "bootstrap" {print $1}')
	zip_bytes=$(stat -c %s "$zip")
	rows+=("$arch|$opt|$bin_bytes|$zip_bytes|$((SECONDS - t0))")
	echo "   -> bootstrap $bin_bytes B, zip $zip_bytes B, built in $((SECONDS - t0)) s" >&2
done

echo
echo "Lambda artefact (cargo lambda build --release --output-format zip); target: zip < 5 MB"
printf '%-8s %-9s %14s %12s %12s %8s %7s\n' arch opt-level "bootstrap B" "zip B" "zip MB" target build
for r in "${rows[@]}"; do
	IFS='|' read -r arch opt bin zip secs <<<"$r"
	met=met
	((zip < LIMIT)) || met=MISSED
	printf '%-8s %-9s %14s %12s %12s %8s %6ss\n' "$arch" "$opt" "$bin" "$zip" \
		"$(awk -v z="$zip" 'BEGIN {printf "%.2f", z / 1e6}')" "$met" "$secs"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
