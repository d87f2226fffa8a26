#!/usr/bin/env bash
# Builds the versioned release artefacts into dist/ (git-ignored), in one command:
#
#   dist/podmutator-<version>-lambda-arm64.zip     the Lambda function (bootstrap), arm64
#   dist/podmutator-<version>-lambda-x86_64.zip    the same for x86_64
#   dist/podmutator-<version>-linux-arm64          the pod image's static (musl) binary, arm64
#   dist/podmutator-<version>-linux-x86_64         the same for x86_64
#   dist/podmutator-exec-<version>-linux-arm64     the exec wrapper beside it in the image
#                                                  (what fetch copies into pods), arm64
#   dist/podmutator-exec-<version>-linux-x86_64    the same for x86_64
#   dist/podmutator-<version>-image                with --image: the in-cluster image pushed,
#                                                  by digest (REPOSITORY@sha256:...)
#   dist/SHA256SUMS                                `sha256sum -c SHA256SUMS` checks them
#
# <version> is Cargo.toml's. The zips are `cargo lambda build --release --locked
# --output-format zip` (the deploy guide's build); the pod binaries come from
# scripts/pod-image.sh, which builds them as the Dockerfile does, checks that they are static and
# tries the x86_64 one against moto (so `scripts/tools.sh install` first). Every artefact is then
# checked before it is named: a zip holds one executable `bootstrap`, each binary is an ELF for its
# architecture, and a binary this machine can run reports <version>. dist/ holds one release:
# older artefacts are removed. Then it prints the Terraform input of each zip
# (scripts/lambda-artefact.sh).
#
#   scripts/release.sh                    build everything, then package (4 LTO builds: long)
#   scripts/release.sh --dry-run          print the version, the builds and the artefact names
#   scripts/release.sh --from DIR         package builds already made and checked, laid out as
#                                         the builds leave them: DIR/lambda/<arch>/podmutator/
#                                         bootstrap.zip and DIR/pod-image/<arch>/{podmutator,
#                                         podmutator-exec}/bootstrap (static-ness and the
#                                         wrapper's size are pod-image.sh's checks)
#   --out DIR                             write to DIR instead of dist/
#   --image REPOSITORY                    also build the Dockerfile's image for every arch of
#                                         ARCHES and push it as REPOSITORY:<version> (docker
#                                         buildx, logged in already), then record the digest
#                                         the push made, which the in-cluster install pins
#                                         (docs/deploy.md), and print its `kustomize edit set
#                                         image` line. REPOSITORY has no tag and no digest.
#   ARCHES="arm64 x86_64"                 the architectures (default both)
#
# Builds land in $CARGO_TARGET_DIR (default target/), which is also --from's default.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

fail() {
	echo "release: $*" >&2
	exit 1
}

need() {
	command -v "$1" >/dev/null || fail "$1 is required ($2) and was not found on PATH"
}

dry_run=false
from=
from_given=false
out=$ROOT/dist
image=
while (($#)); do
	case $1 in
	--dry-run) dry_run=true ;;
	--from)
		[[ $# -ge 2 ]] || fail "--from needs a directory"
		from=$2
		from_given=true
		shift
		;;
	--out)
		[[ $# -ge 2 ]] || fail "--out needs a directory"
		out=$2
		shift
		;;
	--image)
		[[ $# -ge 2 ]] || fail "--image needs a repository (<registry>/podmutator)"
		image=$2
		shift
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) fail "unknown argument $1 (see --help)" ;;
	esac
	shift
done

# The workspace's version (every crate takes it): the first `version = "..."` after
# `[workspace.package]` in Cargo.toml.
version=$(awk '
	/^\[/ { in_package = ($0 == "[workspace.package]") }
	in_package && /^version[[:space:]]*=/ { gsub(/.*=[[:space:]]*"|".*/, ""); print; exit }
' Cargo.toml)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]] ||
	fail "Cargo.toml's [workspace.package] version is not a semantic version: '$version'"

ARCHES=${ARCHES:-arm64 x86_64}
for arch in $ARCHES; do
	case $arch in
	arm64 | x86_64) ;;
	*) fail "unknown arch $arch in ARCHES (arm64 or x86_64)" ;;
	esac
done

# A repository to push to: no scheme, no whitespace, no digest, and no tag (a ':' after the last
# '/' is one; before it, a registry's port).
if [[ -n $image ]]; then
	[[ $image =~ ^[a-z0-9][a-z0-9._/:-]*[a-z0-9]$ && $image != *//* && ${image##*/} != *:* ]] ||
		fail "--image takes a repository without a tag or digest, e.g. registry.example.com/team/podmutator: '$image'"
fi
platform_of() { [[ $1 == arm64 ]] && echo linux/arm64 || echo linux/amd64; }
platforms=
for arch in $ARCHES; do
	platforms=${platforms:+$platforms,}$(platform_of "$arch")
done

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
from=${from:-$TARGET_DIR}

lambda_name() { echo "podmutator-$version-lambda-$1.zip"; }
pod_name() { echo "podmutator-$version-linux-$1"; }
exec_name() { echo "podmutator-exec-$version-linux-$1"; }
lambda_flag() { [[ $1 == arm64 ]] && echo --arm64 || echo --x86-64; }
image_name() { echo "podmutator-$version-image"; }
# The image's build: the Dockerfile at the root, every platform, pushed; buildx writes the digest
# the registry got (for several platforms, the index's) into the metadata file.
image_build() {
	image_cmd=(docker buildx build --platform "$platforms" --tag "$image:$version" --push --metadata-file "$1"
		--build-arg "PODMUTATOR_COMMIT=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" "$ROOT")
}

if $dry_run; then
	echo "version $version"
	if ! $from_given; then
		for arch in $ARCHES; do
			echo "build: cargo lambda build --release --locked --bin podmutator $(lambda_flag "$arch") --output-format zip --lambda-dir $TARGET_DIR/lambda/$arch"
		done
		echo "build: ARCHES=\"$ARCHES\" scripts/pod-image.sh"
	fi
	if [[ -n $image ]]; then
		image_build "<metadata file>"
		echo "build: ${image_cmd[*]}"
	fi
	for arch in $ARCHES; do
		echo "artefact: $out/$(lambda_name "$arch")"
		echo "artefact: $out/$(pod_name "$arch")"
		echo "artefact: $out/$(exec_name "$arch")"
	done
	[[ -z $image ]] || echo "artefact: $out/$(image_name)"
	echo "artefact: $out/SHA256SUMS"
	exit 0
fi

need sha256sum "the checksums"
need unzip "to check each zip's bootstrap"
need readelf "to check each binary's architecture"

if ! $from_given; then
	need cargo "the builds"
	PATH="$(scripts/tools.sh path bin):$PATH"
	export PATH
	need cargo-lambda "the builds: scripts/tools.sh install venv"
	for arch in $ARCHES; do
		echo "== $arch: cargo lambda build --release --locked $(lambda_flag "$arch") --output-format zip" >&2
		rm -rf "$TARGET_DIR/lambda/$arch"
		cargo lambda build --release --locked --bin podmutator "$(lambda_flag "$arch")" \
			--output-format zip --lambda-dir "$TARGET_DIR/lambda/$arch" >&2 ||
			fail "the Lambda build for $arch failed"
	done
	echo "== the pod image's binaries: scripts/pod-image.sh" >&2
	ARCHES="$ARCHES" scripts/pod-image.sh || fail "scripts/pod-image.sh failed"
fi

work=$(mktemp -d -t release.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The ELF machine readelf names for each architecture.
machine_of() { [[ $1 == arm64 ]] && echo AArch64 || echo "Advanced Micro Devices X86-64"; }
host_arch=$(uname -m)
[[ $host_arch == aarch64 ]] && host_arch=arm64

# check_binary ARCH FILE WHAT [PROGRAM]: an executable ELF for ARCH that, when this machine can
# run it, reports the release's version as PROGRAM (default podmutator).
check_binary() {
	local arch=$1 file=$2 what=$3 program=${4:-podmutator} machine
	[[ -x $file ]] || fail "$what is not executable: $file"
	machine=$(readelf -h "$file" 2>/dev/null | sed -n 's/^ *Machine: *//p') ||
		true
	[[ -n $machine ]] || fail "$what is not an ELF file: $file"
	[[ $machine == "$(machine_of "$arch")" ]] ||
		fail "$what is for '$machine', not $arch ($(machine_of "$arch")): $file"
	if [[ $arch == "$host_arch" ]]; then
		local said
		said=$("$file" --version 2>&1) || fail "$what --version failed: $said"
		[[ $said == "$program $version" ]] ||
			fail "$what says '$said', not '$program $version' (built from another commit?): $file"
	fi
}

mkdir -p "$out"
names=()
for arch in $ARCHES; do
	zip=$from/lambda/$arch/podmutator/bootstrap.zip
	[[ -f $zip ]] || fail "no Lambda zip for $arch at $zip (build it: cargo lambda build --release --locked $(lambda_flag "$arch") --output-format zip --lambda-dir $from/lambda/$arch)"
	listing=$(unzip -Z1 "$zip") || fail "$zip is not a readable zip"
	[[ $listing == bootstrap ]] || fail "$zip must hold exactly one file, bootstrap; it holds: $(echo $listing)"
	mkdir -p "$work/$arch"
	unzip -p "$zip" bootstrap >"$work/$arch/bootstrap"
	# The executable bit lives in the zip's entry; check it there, then the ELF itself.
	unzip -Z -l "$zip" bootstrap | grep -q '^-rwx' || fail "bootstrap in $zip is not executable"
	chmod +x "$work/$arch/bootstrap"
	check_binary "$arch" "$work/$arch/bootstrap" "the Lambda bootstrap for $arch"

	bin=$from/pod-image/$arch/podmutator/bootstrap
	[[ -f $bin ]] || fail "no pod binary for $arch at $bin (build it: ARCHES=$arch scripts/pod-image.sh)"
	check_binary "$arch" "$bin" "the pod binary for $arch"
	wrapper=$from/pod-image/$arch/podmutator-exec/bootstrap
	[[ -f $wrapper ]] || fail "no exec wrapper for $arch at $wrapper (build it: ARCHES=$arch scripts/pod-image.sh)"
	check_binary "$arch" "$wrapper" "the exec wrapper for $arch" podmutator-exec

	cp "$zip" "$work/$(lambda_name "$arch")"
	cp "$bin" "$work/$(pod_name "$arch")"
	cp "$wrapper" "$work/$(exec_name "$arch")"
	chmod 0755 "$work/$(pod_name "$arch")" "$work/$(exec_name "$arch")"
	names+=("$(lambda_name "$arch")" "$(pod_name "$arch")" "$(exec_name "$arch")")
done

# The in-cluster image, last: it is pushed, so only once every artefact has passed. Its digest is
# what the registry answered the push with; nothing here pulls it back.
digest=
if [[ -n $image ]]; then
	need docker "the in-cluster image (--image): docker with buildx, logged in to the registry"
	image_build "$work/image.json"
	echo "== the in-cluster image: ${image_cmd[*]}" >&2
	"${image_cmd[@]}" >&2 || fail "docker buildx build of $image:$version failed"
	[[ -f $work/image.json ]] || fail "docker buildx wrote no metadata file: the pushed image's digest is unknown"
	digest=$(grep -o '"containerimage\.digest"[[:space:]]*:[[:space:]]*"sha256:[0-9a-f]\{64\}"' "$work/image.json" |
		grep -o 'sha256:[0-9a-f]\{64\}' | head -n 1) || true
	[[ -n $digest ]] || fail "docker buildx's metadata holds no containerimage.digest: the pushed image's digest is unknown"
	echo "$image@$digest" >"$work/$(image_name)"
	names+=("$(image_name)")
fi

# Everything checked. The directory holds one release, which SHA256SUMS describes exactly:
# earlier artefacts (any version) go first.
rm -f "$out"/podmutator-* "$out/SHA256SUMS"
for name in "${names[@]}"; do
	mv "$work/$name" "$out/$name"
done
(cd "$out" && printf '%s\n' "${names[@]}" | LC_ALL=C sort | xargs sha256sum >SHA256SUMS.tmp &&
	mv SHA256SUMS.tmp SHA256SUMS && sha256sum --quiet -c SHA256SUMS) ||
	fail "writing or checking $out/SHA256SUMS failed"

echo "release $version in $out:"
(cd "$out" && LC_ALL=C sort -k2 SHA256SUMS | awk '{print "  " $2}')
echo "  SHA256SUMS"
for arch in $ARCHES; do
	echo "Terraform, architecture = \"$arch\": lambda_zip_path = \"$out/$(lambda_name "$arch")\""
	echo "  $(scripts/lambda-artefact.sh "$out/$(lambda_name "$arch")")"
done
if [[ -n $digest ]]; then
	echo "In-cluster image: $image@$digest; the install's first step pins it (docs/deploy.md):"
	echo "  cd deploy/kubernetes/base && kustomize edit set image podmutator=$image@$digest"
fi
