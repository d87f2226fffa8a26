#!/usr/bin/env bash
# The fetcher image's binaries, built and tried without Docker: runs the `Dockerfile`'s build step
# (`cargo lambda build --release --target <arch>-unknown-linux-musl`, zig from the pinned tools
# venv, the same versions the Dockerfile pins) for each architecture, then checks what the image
# relies on:
#
#   - both binaries (podmutator, and podmutator-exec, the exec wrapper a pod copies) are static:
#     no program interpreter and no shared library (readelf), so they run on distroless/static,
#     which has no libc; the wrapper is at most 1 MiB (EXEC_MAX_BYTES), since each pod that
#     needs env vars holds a copy in memory;
#   - (x86_64, the machine's own) `podmutator fetch` run from that binary, with only a plan and
#     AWS credentials in its environment, fetches two secrets from moto on 127.0.0.1 in one
#     BatchGetSecretValue round trip and writes them 0400 where the plan says; a plan naming a
#     missing secret exits 1 naming it and writes nothing; fetch copies the wrapper from beside
#     it, and the copy, run as `podmutator exec`, sets a variable from a file and replaces
#     itself with the command, whose exit code comes back.
#
#   scripts/pod-image.sh                  # x86_64 and arm64
#   ARCHES=x86_64 scripts/pod-image.sh    # one
#
# Each build is a full release (LTO) build: ~3-8 min on 2 cores. Binaries land in
# $CARGO_TARGET_DIR/pod-image/<arch>/{podmutator,podmutator-exec}/bootstrap. Exits non-zero on the first failure.
# The container build itself (base images, `docker buildx`) needs a Docker daemon and the
# registries; see docs/deploy.md for the publishing steps.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/bench/quick.sh
. scripts/bench/quick.sh

ARCHES=${ARCHES:-x86_64 arm64}
EXEC_MAX_BYTES=${EXEC_MAX_BYTES:-1048576}
# A smoke run: the first architecture, in the dev profile, whose binaries are not sized.
release=--release
if bench_quick; then
	ARCHES=${ARCHES%% *}
	release=
	EXEC_MAX_BYTES=$((1 << 30))
fi
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET_DIR/pod-image
PATH="$(scripts/tools.sh path bin):$PATH"
export PATH
PYTHON=$(scripts/tools.sh path python)
MOTO=$(scripts/tools.sh path moto_server)

fail() {
	echo "pod-image: FAILED: $*" >&2
	exit 1
}

for arch in $ARCHES; do
	case $arch in
	x86_64) target=x86_64-unknown-linux-musl ;;
	arm64) target=aarch64-unknown-linux-musl ;;
	*) fail "unknown arch $arch (x86_64 or arm64)" ;;
	esac
	if ! rustup target list --installed | grep -qx "$target"; then
		echo "== rustup target add $target" >&2
		rustup target add "$target" >&2
	fi
	dir=$OUT/$arch
	rm -rf "$dir"
	echo "== $arch: cargo lambda build ${release:---profile dev} --locked --features podmutator/serve,podmutator/tools --target $target --bin podmutator --bin podmutator-exec" >&2
	t0=$SECONDS
	cargo lambda build $release --locked --features podmutator/serve,podmutator/tools --target "$target" --bin podmutator --bin podmutator-exec \
		--lambda-dir "$dir" >&2 || fail "build for $target"
	for name in podmutator podmutator-exec; do
		bin=$dir/$name/bootstrap
		[[ -x $bin ]] || fail "no executable at $bin"
		headers=$(readelf -lW "$bin")
		dynamic=$(readelf -dW "$bin")
		grep -q "Requesting program interpreter" <<<"$headers" && fail "$arch: $bin asks for a program interpreter (not static)"
		grep -q "(NEEDED)" <<<"$dynamic" && fail "$arch: $bin needs shared libraries: $(grep NEEDED <<<"$dynamic")"
		echo "   -> $name: static, $(stat -c %s "$bin") bytes" >&2
	done
	size=$(stat -c %s "$dir/podmutator-exec/bootstrap")
	((size <= EXEC_MAX_BYTES)) || fail "$arch: the exec wrapper is $size bytes, over $EXEC_MAX_BYTES (every env-var pod holds a copy in memory)"
	echo "   built in $((SECONDS - t0)) s" >&2
done

if [[ " $ARCHES " != *" x86_64 "* ]]; then
	echo "pod-image: built and checked $ARCHES (run with x86_64 to try fetch and exec)" >&2
	exit 0
fi

bin=$OUT/x86_64/podmutator/bootstrap
wrapper=$OUT/x86_64/podmutator-exec/bootstrap
work=$(mktemp -d -t pod-image.XXXXXX)
moto_pid=
cleanup() {
	[[ -n $moto_pid ]] && kill "$moto_pid" 2>/dev/null && wait "$moto_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$MOTO" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto_pid=$!
endpoint=http://127.0.0.1:$port
for _ in $(seq 1 300); do
	"$PYTHON" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
	sleep 0.1
done

# Two secrets with generated values; the values stay in files, never on this output.
"$PYTHON" - "$endpoint" "$work" <<'EOF'
import os, secrets, sys
import boto3
endpoint, work = sys.argv[1:]
sm = boto3.client("secretsmanager", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
for name in ["u__org__acme__domain__development__project__flytesnacks__key__db",
             "u__org__acme__domain____project____key__api"]:
    value = secrets.token_urlsafe(24)
    sm.create_secret(Name=name, SecretString=value)
    with open(os.path.join(work, name + ".expected"), "w") as f:
        f.write(value)
EOF

# The image's layout: the wrapper beside podmutator, where fetch looks for it.
mkdir -p "$work/root" "$work/image"
cp "$bin" "$work/image/podmutator"
cp "$wrapper" "$work/image/podmutator-exec"
bin=$work/image/podmutator
plan=$(
	cat <<EOF
{"root": "$work/root", "region": "us-east-1", "secrets": [
 {"id": "u__org__acme__domain__development__project__flytesnacks__key__db", "file": "$work/root/files/db"},
 {"id": "u__org__acme__domain____project____key__api", "file": "$work/root/run/env/API_KEY"}],
 "copyExecutableTo": "$work/root/run/bin/podmutator"}
EOF
)
aws_env=(AWS_ENDPOINT_URL="$endpoint" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
	AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true AWS_CONFIG_FILE=/dev/null
	AWS_SHARED_CREDENTIALS_FILE=/dev/null)

echo "== fetch: two secrets from moto with the static binary" >&2
env -i "${aws_env[@]}" PODMUTATOR_FETCH_PLAN="$plan" "$bin" fetch 2>"$work/fetch.err" ||
	fail "fetch exited $?: $(cat "$work/fetch.err")"
cat "$work/fetch.err" >&2
cmp -s "$work/root/files/db" "$work/u__org__acme__domain__development__project__flytesnacks__key__db.expected" ||
	fail "files/db does not hold the secret's value"
cmp -s "$work/root/run/env/API_KEY" "$work/u__org__acme__domain____project____key__api.expected" ||
	fail "run/env/API_KEY does not hold the secret's value"
for f in files/db run/env/API_KEY; do
	mode=$(stat -c %a "$work/root/$f")
	[[ $mode == 400 ]] || fail "$f has mode $mode, not 400"
done
cmp -s "$wrapper" "$work/root/run/bin/podmutator" || fail "copyExecutableTo is not the exec wrapper"
# Two secrets in one call: the default strategy's batch (one GetSecretValue each would be two).
grep -q "in 1 Secrets Manager calls" "$work/fetch.err" || fail "not one BatchGetSecretValue call: $(cat "$work/fetch.err")"
echo "   -> both files 0400 with the right values, the exec wrapper copied, one call" >&2

echo "== fetch: a missing secret fails naming it, writing nothing" >&2
mkdir -p "$work/root2"
missing="{\"root\": \"$work/root2\", \"secrets\": [{\"id\": \"u__org__acme__domain____project____key__nope\", \"file\": \"$work/root2/files/nope\"}, {\"id\": \"u__org__acme__domain____project____key__api\", \"file\": \"$work/root2/files/api\"}]}"
if env -i "${aws_env[@]}" PODMUTATOR_FETCH_PLAN="$missing" "$bin" fetch 2>"$work/missing.err"; then
	fail "fetch of a missing secret exited 0"
fi
grep -q "u__org__acme__domain____project____key__nope" "$work/missing.err" ||
	fail "the error does not name the missing secret: $(cat "$work/missing.err")"
[[ -z $(find "$work/root2" -type f) ]] || fail "a failed fetch wrote files"
echo "   -> exit 1, the secret named, no file written" >&2

echo "== exec: the copied wrapper sets API_KEY from its file and becomes the command" >&2
set +e
env -i PATH=/usr/bin:/bin PODMUTATOR_EXEC_ENV="{\"API_KEY\": \"$work/root/run/env/API_KEY\"}" \
	"$work/root/run/bin/podmutator" exec -- /bin/sh -c \
	'[ "$API_KEY" = "$(cat "$1")" ] && [ -z "${PODMUTATOR_EXEC_ENV+set}" ] && exit 42; exit 3' \
	sh "$work/u__org__acme__domain____project____key__api.expected"
code=$?
set -e
[[ $code == 42 ]] || fail "exec: the command exited $code (42 means it saw API_KEY and no plan)"
echo "   -> the command saw the variable, not the plan, and its exit code (42) came back" >&2
echo "pod-image: OK ($ARCHES)" >&2
