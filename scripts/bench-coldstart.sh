#!/usr/bin/env bash
# Cold start of the release binary as a Lambda function, against a loopback Lambda Runtime API
# (scripts/bench/runtime_api.py, Python stdlib, 127.0.0.1 only): process start -> first
# response for one invocation of events/apigw-http-mutate.json, over STARTS starts (median, p90,
# max), the peak RSS of each start (VmHWM right after the response, cross-checked by 3 starts
# under `/usr/bin/time -v`), a warm-invocation figure, and `podmutator --version` as the exec
# floor. Prints a table. Targets (reported in the README, never asserted here):
# median < 30 ms, peak RSS < 32 MB.
#
#   scripts/bench-coldstart.sh                 # builds target/release/podmutator first
#   CARGO_TARGET_DIR=/work/target-bench scripts/bench-coldstart.sh
#   BIN=target/lambda/podmutator/bootstrap STARTS=50 scripts/bench-coldstart.sh   # no build
#   BIN_BEFORE=path/to/older/podmutator scripts/bench-coldstart.sh   # production run of both
#
# Then the production configuration: Embedded first (Secrets Manager, us-east-1), then K8s, the
# path token held as its SHA-256 (`http.pathTokenSha256`, the event's path carries the token),
# metrics and logs on. Its event is the internal ALB's (PROD_EVENT, default
# events/alb-mutate.json: a function serving Embedded values refuses API Gateway's), the review
# with the pod's organization/project/domain labels removed, so Embedded declines the secret and
# nothing is fetched: what is timed is the cold start, not a Secrets Manager round trip. One more start runs under
# `strace -f -e trace=connect`, which counts the network connections the process opens before its
# first answer (the runtime API's loopback port excepted); target 0. With BIN_BEFORE, the
# same production run for that binary too, back to back (e.g. one that builds the AWS client at
# start).
#
# Exits non-zero only when a start fails (crash, error report, timeout, wrong answer).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
bench_quick && : "${STARTS:=2}" "${WARM:=2}"

STARTS=${STARTS:-20}
WARM=${WARM:-50}
EVENT=${EVENT:-events/apigw-http-mutate.json}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PYTHON=${PYTHON:-python3}

if [[ -z ${BIN:-} ]]; then
	echo "== cargo build --profile $BENCH_PROFILE --locked --bin podmutator (target dir $TARGET_DIR)" >&2
	cargo build --profile "$BENCH_PROFILE" --locked --bin podmutator >&2
	BIN=$TARGET_DIR/$BENCH_PROFILE_DIR/podmutator
fi
[[ -x $BIN ]] || {
	echo "bench-coldstart: $BIN is not an executable" >&2
	exit 2
}

# GNU time for the peak-RSS cross-check (Debian package `time`).
if [[ ! -x /usr/bin/time ]]; then
	echo "== installing Debian's time package (for time -v)" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time; } >&2 ||
		echo "bench-coldstart: could not install time; VmHWM alone gives the peak RSS" >&2
fi
TIME_V=()
[[ -x /usr/bin/time ]] && TIME_V=(--time-v /usr/bin/time)

echo "== machine"
echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "rustc: $(rustc -V)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "binary: $BIN ($(stat -c %s "$BIN") bytes)"
# The events' paths carry no token: the default run serves without one (http.pathTokenDisabled).
export PODMUTATOR_CONFIG="${PODMUTATOR_CONFIG:-{\"http\": {\"pathTokenDisabled\": true}}}"
echo "event: $EVENT; config: ${PODMUTATOR_CONFIG_FILE:-defaults (K8s manager, metrics and info logs on, stdout to /dev/null)} + $PODMUTATOR_CONFIG"
echo
"$PYTHON" scripts/bench/runtime_api.py --binary "$BIN" --event "$EVENT" --starts "$STARTS" --warm "$WARM" \
	--json "${JSON_OUT:-/dev/null}" "${TIME_V[@]}" && rc=0 || rc=$?

command -v strace >/dev/null 2>&1 || {
	echo "== installing Debian's strace package (counts connections at cold start)" >&2
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace; } >&2 ||
		{ echo "bench-coldstart: strace is missing and could not be installed" >&2; exit 2; }
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# A fixed, obviously fake token of the production length (`openssl rand -hex 32`).
TOKEN=0000000000000000000000000000000000000000000000000000000000bench0
TOKEN_SHA256=$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)
# The production event comes through the internal ALB (the default endpoint): a function that
# writes Embedded values into its replies refuses API Gateway's events.
"$PYTHON" - "${PROD_EVENT:-events/alb-mutate.json}" "$TMP/event.json" "$TOKEN" <<'PY'
import base64, json, sys
event = json.load(open(sys.argv[1]))
token = sys.argv[3]
if "rawPath" in event:
    event["rawPath"] = "/" + token + event["rawPath"]
    event["requestContext"]["http"]["path"] = event["rawPath"]
else:
    event["path"] = "/" + token + event["path"]
encoded = event.get("isBase64Encoded")
review = json.loads(base64.b64decode(event["body"]) if encoded else event["body"])
labels = review["request"]["object"]["metadata"]["labels"]
for k in ("organization", "project", "domain"):
    labels.pop(k, None)
body = json.dumps(review)
event["body"] = base64.b64encode(body.encode()).decode() if encoded else body
json.dump(event, open(sys.argv[2], "w"))
PY
PROD_CONFIG="{\"webhook\": {\"secretManagerTypes\": [\"Embedded\", \"K8s\"], \"embeddedSecretManagerConfig\": {\"type\": \"AWS\", \"awsConfig\": {\"region\": \"us-east-1\"}}}, \"embedded\": {\"organization\": \"flyte\"}, \"http\": {\"pathTokenSha256\": \"$TOKEN_SHA256\"}}"

# Connections opened by one start of $1 before its first answer, the runtime API excepted.
connections() {
	local bin=$1
	cat >"$TMP/traced" <<SH
#!/bin/sh
exec strace -f -qq -A -e trace=connect -o "$TMP/connect.log" "$bin" "\$@"
SH
	chmod +x "$TMP/traced"
	: >"$TMP/connect.log"
	PODMUTATOR_CONFIG=$PROD_CONFIG "$PYTHON" scripts/bench/runtime_api.py --binary "$TMP/traced" \
		--event "$TMP/event.json" --starts 1 --warm 0 >/dev/null 2>"$TMP/traced.err" || {
		echo "bench-coldstart: the traced start failed: $(tail -3 "$TMP/traced.err")" >&2
		return 1
	}
	# The log is appended to by every run (the untimed start, the timed one, the --version runs):
	# it must show the runtime API's loopback connect, or nothing was traced and 0 means nothing.
	grep -q 'connect(.*sin_addr=inet_addr("127.0.0.1")' "$TMP/connect.log" || {
		echo "bench-coldstart: strace logged no connect to the runtime API: the trace is empty" >&2
		return 1
	}
	# Every connect() but the loopback runtime API.
	grep 'connect(' "$TMP/connect.log" | grep -v 'sin_addr=inet_addr("127.0.0.1")' |
		grep -vc 'AF_UNIX' || true
}

production() {
	local label=$1 bin=$2
	echo
	echo "== production configuration ($label: $bin): Embedded + K8s, pathTokenSha256, metrics on"
	PODMUTATOR_CONFIG=$PROD_CONFIG "$PYTHON" scripts/bench/runtime_api.py --binary "$bin" \
		--event "$TMP/event.json" --starts "$STARTS" --warm "$WARM" --json "$TMP/$label.json" || rc=1
	local calls
	calls=$(connections "$bin") || rc=1
	echo "network connections before the first answer (strace, 2 starts): ${calls:-?} (target 0)"
	grep -v 'inet_addr("127.0.0.1")' "$TMP/connect.log" | grep 'connect(' | head -5 || true
}
production after "$BIN"
if [[ -n ${BIN_BEFORE:-} ]]; then
	production before "$BIN_BEFORE"
	"$PYTHON" - "$TMP/before.json" "$TMP/after.json" <<'PY'
import json, statistics, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
def col(d, k):
    runs = d["runs"] if isinstance(d, dict) else d
    return sorted(r[k] for r in runs)
print()
print("production cold start, before -> after (same run), ms")
for k in ("first_ms", "init_ms", "invoke_ms"):
    b, a = col(before, k), col(after, k)
    p90 = lambda v: v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
    print("%-10s median %6.2f -> %6.2f (x%.2f)   p90 %6.2f -> %6.2f" % (
        k, statistics.median(b), statistics.median(a),
        statistics.median(a) / statistics.median(b), p90(b), p90(a)))
PY
fi

echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "targets: median start->first response < 30 ms (production configuration: < 10 ms, 0 network"
echo "connections); peak RSS < 32 MB (reported, not asserted)"
exit "$rc"
