#!/usr/bin/env bash
# The 10,000-container pod over HTTPS against the release binary (`podmutator serve`, 127.0.0.1):
# the bad-input corpus' pod (tests/fixtures/bad-input/huge/ten-thousand-containers.json: the base
# review with 10,000 distinctly named copies of its container, each of which gets the secret)
# against the same review with the pod's selector label switched off (same size: parsed and
# allowed, no mutation). Target: mutated <= 2x unselected.
#
# One keep-alive TLS connection, the two reviews alternating, ROUNDS of each after WARMUP of
# each; every answer is checked (200, allowed, a patch for the mutated one and none for the
# other). Prints the median, p90 and minimum of both and the ratio of the medians, in one run.
#
#   scripts/bench-wide.sh                       # builds the release binary
#   BIN=path/to/podmutator ROUNDS=31 scripts/bench-wide.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh
bench_quick && : "${ROUNDS:=1}" "${WARMUP:=0}"
ROUNDS=${ROUNDS:-21}
WARMUP=${WARMUP:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

die() {
	echo "bench-wide: FAILED: $*" >&2
	exit 1
}
if [[ -z ${BIN:-} ]]; then
	echo "== cargo build --profile $BENCH_PROFILE --locked --bin podmutator (target dir $TARGET_DIR)" >&2
	cargo build --profile "$BENCH_PROFILE" --locked --bin podmutator >&2
	BIN=$TARGET_DIR/$BENCH_PROFILE_DIR/podmutator
fi
[[ -x $BIN ]] || die "$BIN is not an executable"

TMP=$(mktemp -d)
SERVER_PID=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
		kill -KILL "$SERVER_PID" 2>/dev/null || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$TMP/config.json" <<EOF
{"webhook": {"certDir": "$TMP/certs", "localCert": true, "listenPort": $PORT, "secretManagerTypes": ["K8s"]},
 "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true}}
EOF

# The two reviews, built as tests/bad_input.rs builds the corpus case.
python3 - "$ROOT/tests/fixtures/bad-input" "$TMP" <<'PY' || die "cannot build the reviews"
import copy, json, os, sys
corpus, tmp = sys.argv[1], sys.argv[2]
case = json.load(open(os.path.join(corpus, "huge", "ten-thousand-containers.json")))
review = json.load(open(os.path.join(corpus, case["body"]["review"])))
n = case["body"]["containers"]["count"]
containers = review["request"]["object"]["spec"]["containers"]
first = containers[0]
containers[:] = []
for i in range(n):
    c = copy.deepcopy(first)
    c["name"] = f"{first['name']}-{i}"
    containers.append(c)
json.dump(review, open(os.path.join(tmp, "mutated.json"), "w"), separators=(",", ":"))
labels = review["request"]["object"]["metadata"]["labels"]
assert labels["inject-flyte-secrets"] == "true"
labels["inject-flyte-secrets"] = "none"  # as long as "true": the same size
json.dump(review, open(os.path.join(tmp, "unselected.json"), "w"), separators=(",", ":"))
PY

echo "== machine: $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" serve --config "$TMP/config.json" >/dev/null 2>"$TMP/server.err" &
SERVER_PID=$!
for _ in $(seq 1 300); do
	if curl -sf --cacert "$TMP/certs/ca.crt" "https://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then
		break
	fi
	kill -0 "$SERVER_PID" 2>/dev/null || die "server exited at start: $(cat "$TMP/server.err")"
	sleep 0.1
done

python3 - "$PORT" "$TMP" "$ROUNDS" "$WARMUP" <<'PY' || die "see above"
import http.client, json, os, ssl, statistics, sys, time
port, tmp, rounds, warmup = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.create_default_context(cafile=os.path.join(tmp, "certs", "ca.crt"))
conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
bodies = {k: open(os.path.join(tmp, k + ".json"), "rb").read() for k in ("mutated", "unselected")}
times = {k: [] for k in bodies}
sizes = {}
def one(kind):
    t = time.perf_counter()
    conn.request("POST", "/mutate--v1-pod?timeout=10s", bodies[kind], {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    dt = time.perf_counter() - t
    if resp.status != 200:
        sys.exit(f"{kind}: HTTP {resp.status}: {data[:300]!r}")
    r = json.loads(data)["response"]
    if not r["allowed"] or (("patch" in r) != (kind == "mutated")):
        sys.exit(f"{kind}: unexpected answer: {data[:300]!r}")
    sizes[kind] = len(data)
    return dt
for i in range(warmup + rounds):
    for kind in ("mutated", "unselected") if i % 2 == 0 else ("unselected", "mutated"):
        dt = one(kind)
        if i >= warmup:
            times[kind].append(dt * 1e3)
def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]
print(f"{rounds} rounds of each, alternating, one keep-alive TLS connection, after {warmup} of each")
print("%-44s %9s %9s %9s %9s %11s" % ("review", "in B", "out B", "median ms", "p90 ms", "min ms"))
for kind, label in (("mutated", "10,000 containers, mutated"), ("unselected", "same review, selector off")):
    xs = times[kind]
    print("%-44s %9d %9d %9.1f %9.1f %11.1f" % (label, len(bodies[kind]), sizes[kind], statistics.median(xs), q(xs, 0.9), min(xs)))
m, u = statistics.median(times["mutated"]), statistics.median(times["unselected"])
print("mutated / unselected (medians): %.2f   (minima: %.2f)   target <= 2.00" % (m / u, min(times["mutated"]) / min(times["unselected"])))
PY
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || die "server did not stop cleanly: $(tail -5 "$TMP/server.err")"
SERVER_PID=
