#!/usr/bin/env bash
# Load test of the HTTPS server (`podmutator serve`) with wrk on this machine: keep-alive,
# CONNECTIONS connections, DURATION seconds, POSTing the Flyte task review
# (tests/fixtures/reviews/flyte-task-k8s-env.json) to /mutate--v1-pod. Reports requests/s,
# p50/p90/p99 latency, errors, and the server's RSS before and after TOTAL admissions (the
# measured run plus as many further wrk runs as it takes to get there).
#
# In the same run, on the same server and connection count, two more measured runs of DURATION
# seconds each: the same review with the pod's selector label switched off (same size, parsed and
# allowed, no mutation: the parse-and-allow floor; target: admission >= 0.8 of it) and
# GET /healthz (the transport's ceiling). A table prints the three side by side with the ratios.
#
# The server gets a temp certDir with localCert (a CA and certificate generated on start), the
# K8s secret manager, and its default logging (one JSON audit line + one EMF metrics line per
# admission) to /dev/null. It listens on 127.0.0.1 only (`http.listenAddress`).
#
#   CARGO_TARGET_DIR=/work/target-bench scripts/bench-load.sh
#   DURATION=10 TOTAL=100000 scripts/bench-load.sh        # a quick run
#   BIN=path/to/podmutator scripts/bench-load.sh          # no build
#
# Exits non-zero only on a real failure: the server crashing or failing to start or stop
# cleanly, a wrong answer, or any wrk error (connect/read/write/timeout/non-2xx). Targets are
# reported, not asserted.
# shellcheck disable=SC2154 # R_* variables are assigned by printf -v in run_wrk
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
bench_quick && : "${DURATION:=1}" "${CONNECTIONS:=4}" "${TOTAL:=200}"

DURATION=${DURATION:-60}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
TOTAL=${TOTAL:-1000000}
REVIEW=${REVIEW:-tests/fixtures/reviews/flyte-task-k8s-env.json}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

die() {
	echo "bench-load: FAILED: $*" >&2
	exit 1
}

if ! command -v wrk >/dev/null 2>&1; then
	echo "== installing Debian's wrk package" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } >&2 ||
		die "wrk is missing and could not be installed (apt-get install wrk)"
fi
if [[ -z ${BIN:-} ]]; then
	echo "== cargo build --profile $BENCH_PROFILE --locked --bin podmutator (target dir $TARGET_DIR)" >&2
	cargo build --profile "$BENCH_PROFILE" --locked --bin podmutator >&2
	BIN=$TARGET_DIR/$BENCH_PROFILE_DIR/podmutator
fi
[[ -x $BIN ]] || die "$BIN is not an executable"

TMP=$(mktemp -d)
SERVER_PID=
SAMPLER_PID=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if [[ -n $SAMPLER_PID ]]; then kill "$SAMPLER_PID" 2>/dev/null || true; fi
	if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
		kill -KILL "$SERVER_PID" 2>/dev/null || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Every wrk connection comes from 127.0.0.1: the per-source cap (32 by default) is raised to
# them all, or the run would measure its refusals.
cat >"$TMP/config.json" <<EOF
{"webhook": {"certDir": "$TMP/certs", "localCert": true, "listenPort": $PORT, "secretManagerTypes": ["K8s"]},
 "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "maxConnectionsPerSource": $CONNECTIONS}}
EOF
URL="https://127.0.0.1:$PORT/mutate--v1-pod?timeout=10s"

echo "== machine"
echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "rustc: $(rustc -V 2>/dev/null || echo '?')"
echo "wrk: $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

"$BIN" serve --config "$TMP/config.json" >/dev/null 2>"$TMP/server.err" &
SERVER_PID=$!
for _ in $(seq 1 300); do
	if curl -sf --cacert "$TMP/certs/ca.crt" "https://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then
		break
	fi
	kill -0 "$SERVER_PID" 2>/dev/null || die "server exited at start: $(cat "$TMP/server.err")"
	sleep 0.1
done
curl -sf --cacert "$TMP/certs/ca.crt" "https://127.0.0.1:$PORT/healthz" >/dev/null || die "server not ready after 30 s"

# One admission checked by hand before loading it: 200, allowed, a JSON Patch.
answer=$(curl -s --cacert "$TMP/certs/ca.crt" -H 'content-type: application/json' \
	--data-binary @"$REVIEW" -w '\n%{http_code}' "$URL")
code=${answer##*$'\n'}
body=${answer%$'\n'*}
[[ $code == 200 ]] || die "review answered HTTP $code: $body"
python3 -c 'import json,sys; r=json.loads(sys.argv[1])["response"]; sys.exit(0 if r["allowed"] and r.get("patchType")=="JSONPatch" else 1)' "$body" ||
	die "review answer is not an allowed JSON Patch: $body"

rss() { awk -v k="$1:" '$1==k {print $2}' "/proc/$SERVER_PID/status"; }
( while kill -0 "$SERVER_PID" 2>/dev/null; do
	echo "$(date +%s) $(rss VmRSS)"
	sleep 5
done ) >"$TMP/rss.samples" 2>/dev/null &
SAMPLER_PID=$!

export REVIEW_FILE=$ROOT/$REVIEW
LUA=$ROOT/scripts/bench/wrk-review.lua
ADMISSIONS=1 # the curl check above
ERRORS=0
# Runs wrk; sets R_* from its WRK_RESULT line and adds to ADMISSIONS/ERRORS.
run_wrk() {
	local secs=$1 out
	out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${secs}s" --timeout 10s -s "$LUA" "$URL") ||
		die "wrk failed: $out"
	local line
	line=$(grep '^WRK_RESULT' <<<"$out") || die "wrk printed no result: $out"
	for kv in ${line#WRK_RESULT }; do
		printf -v "R_${kv%%=*}" '%s' "${kv#*=}"
	done
	ADMISSIONS=$((ADMISSIONS + R_requests))
	ERRORS=$((ERRORS + R_connect + R_read + R_write + R_status + R_timeout))
	kill -0 "$SERVER_PID" 2>/dev/null || die "server died during the load: $(cat "$TMP/server.err")"
}

echo "== warm-up: 5 s"
run_wrk 5
RSS_BEFORE=$(rss VmRSS)
HWM_BEFORE=$(rss VmHWM)
AT_BEFORE=$ADMISSIONS

echo "== measured: $DURATION s, $CONNECTIONS connections, $THREADS wrk threads, keep-alive"
LOAD_DURING=$(cut -d' ' -f1-3 /proc/loadavg)
run_wrk "$DURATION"
M_requests=$R_requests
M_secs=$(awk -v d="$R_duration_us" 'BEGIN {printf "%.1f", d / 1e6}')
M_rps=$(awk -v n="$R_requests" -v d="$R_duration_us" 'BEGIN {printf "%.0f", n / (d / 1e6)}')
M_errors=$((R_connect + R_read + R_write + R_status + R_timeout))
M_err_detail="connect $R_connect, read $R_read, write $R_write, non-2xx $R_status, timeout $R_timeout"
M_p50=$R_p50_us M_p90=$R_p90_us M_p99=$R_p99_us M_p999=$R_p999_us M_max=$R_max_us
LOAD_AFTER_MEASURED=$(cut -d' ' -f1-3 /proc/loadavg)
RSS_MEASURED=$(rss VmRSS)

# The same review, selector label off: same bytes to parse, nothing selects the pod.
UNSELECTED=$TMP/unselected.json
python3 - "$ROOT/$REVIEW" "$UNSELECTED" <<'PY' || die "cannot make the unselected review from $REVIEW"
import json, sys
review = json.load(open(sys.argv[1]))
labels = review["request"]["object"]["metadata"]["labels"]
if labels.get("inject-flyte-secrets") != "true":
    sys.exit(f"{sys.argv[1]}: the pod has no inject-flyte-secrets: \"true\" label")
labels["inject-flyte-secrets"] = "none"  # as long as "true": the same size
json.dump(review, open(sys.argv[2], "w"), separators=(",", ":"))
PY
answer=$(curl -s --cacert "$TMP/certs/ca.crt" -H 'content-type: application/json' \
	--data-binary @"$UNSELECTED" "$URL")
python3 -c 'import json,sys; r=json.loads(sys.argv[1])["response"]; sys.exit(0 if r["allowed"] and "patch" not in r else 1)' "$answer" ||
	die "the unselected review was not allowed untouched: $answer"
# Figures of one phase, from the R_* of its run: "rps p50_ms p99_ms errors".
phase() {
	awk -v n="$R_requests" -v d="$R_duration_us" -v p50="$R_p50_us" -v p99="$R_p99_us" \
		-v e="$((R_connect + R_read + R_write + R_status + R_timeout))" \
		'BEGIN {printf "%.0f %.2f %.2f %d", n / (d / 1e6), p50 / 1000, p99 / 1000, e}'
}
P_admission=$(phase)
echo "== measured: the same review, selector label off: $DURATION s"
REVIEW_FILE=$UNSELECTED run_wrk "$DURATION"
P_unselected=$(phase)
echo "== measured: GET /healthz: $DURATION s"
URL_ADMISSION=$URL
URL="https://127.0.0.1:$PORT/healthz"
REVIEW_FILE= run_wrk "$DURATION"
P_healthz=$(phase)
URL=$URL_ADMISSION
LOAD_AFTER_PHASES=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== continuing to $TOTAL admissions"
while ((ADMISSIONS < TOTAL)); do
	left=$((TOTAL - ADMISSIONS))
	secs=$(awk -v l="$left" -v r="$M_rps" 'BEGIN {s = int(l / (r > 0 ? r : 1000) * 1.05) + 1; if (s > 120) s = 120; print s}')
	run_wrk "$secs"
	echo "   $ADMISSIONS admissions, RSS $(rss VmRSS) KiB" >&2
done
RSS_AFTER=$(rss VmRSS)
HWM_AFTER=$(rss VmHWM)
kill "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=

echo "== stopping the server (SIGTERM, graceful drain)"
kill -TERM "$SERVER_PID"
set +e
wait "$SERVER_PID"
STOP_STATUS=$?
set -e
SERVER_PID=
STOP_OK=yes
[[ $STOP_STATUS == 0 ]] || STOP_OK="no (exit status $STOP_STATUS)"

samples=$(awk '$2 != "" {print $2}' "$TMP/rss.samples" | sort -n)
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
echo
printf '%-46s %s\n' "figure" "value"
printf '%-46s %s\n' "requests/s (measured run, ${M_secs} s)" "$M_rps"
printf '%-46s %s\n' "requests in the measured run" "$M_requests"
printf '%-46s %s / %s / %s / %s ms\n' "latency p50 / p90 / p99 / p99.9" \
	"$(awk -v u="$M_p50" 'BEGIN {printf "%.2f", u/1000}')" "$(awk -v u="$M_p90" 'BEGIN {printf "%.2f", u/1000}')" \
	"$(awk -v u="$M_p99" 'BEGIN {printf "%.2f", u/1000}')" "$(awk -v u="$M_p999" 'BEGIN {printf "%.2f", u/1000}')"
printf '%-46s %s ms\n' "latency max" "$(awk -v u="$M_max" 'BEGIN {printf "%.2f", u/1000}')"
printf '%-46s %s (%s)\n' "errors in the measured run" "$M_errors" "$M_err_detail"
printf '%-46s %s\n' "admissions in total (warm-up + runs)" "$ADMISSIONS"
printf '%-46s %s\n' "errors in total" "$ERRORS"
printf '%-46s %s MiB (VmHWM %s MiB)\n' "RSS after warm-up ($AT_BEFORE admissions)" "$(mib "$RSS_BEFORE")" "$(mib "$HWM_BEFORE")"
printf '%-46s %s MiB\n' "RSS after the measured run" "$(mib "$RSS_MEASURED")"
printf '%-46s %s MiB (VmHWM %s MiB)\n' "RSS after $ADMISSIONS admissions" "$(mib "$RSS_AFTER")" "$(mib "$HWM_AFTER")"
printf '%-46s %+.1f MiB\n' "RSS change, warm-up -> end" "$(awk -v a="$RSS_AFTER" -v b="$RSS_BEFORE" 'BEGIN {print (a-b)/1024}')"
printf '%-46s %s .. %s MiB (%s samples)\n' "RSS every 5 s, min .. max" "$(mib "$(head -1 <<<"$samples")")" \
	"$(mib "$(tail -1 <<<"$samples")")" "$(wc -l <<<"$samples")"
printf '%-46s %s\n' "RSS samples (MiB, every 5 s from server start)" \
	"$(awk '$2 != "" {printf "%s%.1f", (n++ ? " " : ""), $2 / 1024}' "$TMP/rss.samples")"
printf '%-46s %s\n' "graceful stop on SIGTERM" "$STOP_OK"
printf '%-46s %s\n' "load (1/5/15 min) before measured run" "$LOAD_DURING"
printf '%-46s %s\n' "load (1/5/15 min) after measured run" "$LOAD_AFTER_MEASURED"

echo
echo "same server, $CONNECTIONS connections, $DURATION s each (load before $LOAD_DURING, after $LOAD_AFTER_PHASES)"
printf '%-44s %10s %9s %9s %7s %14s\n' "run" "req/s" "p50 ms" "p99 ms" "errors" "x unselected"
read -r a_rps a_p50 a_p99 a_err <<<"$P_admission"
read -r u_rps u_p50 u_p99 u_err <<<"$P_unselected"
read -r h_rps h_p50 h_p99 h_err <<<"$P_healthz"
x() { awk -v a="$1" -v b="$u_rps" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
printf '%-44s %10s %9s %9s %7s %14s\n' "task pod review (mutated)" "$a_rps" "$a_p50" "$a_p99" "$a_err" "$(x "$a_rps")"
printf '%-44s %10s %9s %9s %7s %14s\n' "same review, selector off (parse + allow)" "$u_rps" "$u_p50" "$u_p99" "$u_err" "1.00"
printf '%-44s %10s %9s %9s %7s %14s\n' "GET /healthz (transport ceiling)" "$h_rps" "$h_p50" "$h_p99" "$h_err" "$(x "$h_rps")"
echo "targets: admission >= 0.80 x unselected, p99 < 5 ms at 64 connections"

fail=0
((ERRORS == 0)) || { echo "bench-load: FAILED: $ERRORS wrk errors" >&2; fail=1; }
[[ $STOP_OK == yes ]] || { echo "bench-load: FAILED: server did not stop cleanly: $(tail -5 "$TMP/server.err")" >&2; fail=1; }
exit $fail
