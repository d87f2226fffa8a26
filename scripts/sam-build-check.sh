#!/usr/bin/env bash
# `sam build` of template.yaml with the rust-cargolambda builder, and a check that it produced
# the arm64 `bootstrap` a SAM deployment would upload. It is a cross-compiled LTO release build
# (minutes, not seconds), so it runs as its own CI step instead of inside `cargo test`.
#
# Usage: [SAM_CHECK_FAST=1] scripts/sam-build-check.sh [BUILD_DIR]
#        (default BUILD_DIR: target/sam-build-check)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${1:-$ROOT/target/sam-build-check}
cd "$ROOT"

# cargo lambda cross-compiles with zig, but the Rust standard library for the target must be
# installed.
if command -v rustup >/dev/null 2>&1 &&
	! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
	rustup target add aarch64-unknown-linux-gnu
fi

# A target directory of its own: the aarch64 release build then never waits on the lock of a
# concurrent debug build or test run in target/, and its dependencies stay warm between runs.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/sam-build}

# --fast (CI): the same builder, template and target, with a quick release profile (no LTO,
# many codegen units, opt-level 1). It proves that `sam build` turns template.yaml into an arm64
# bootstrap; the artefact you deploy is built with the full release profile, without --fast.
if [[ ${SAM_CHECK_FAST:-} == 1 ]]; then
	export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
		CARGO_PROFILE_RELEASE_OPT_LEVEL=1
	export CARGO_TARGET_DIR=$ROOT/target/sam-build-fast
fi

SAM=$(scripts/tools.sh path sam)
# The builder runs `cargo lambda`, which finds zig only through `python -m ziglang`.
PATH="$(scripts/tools.sh path bin):$PATH"
export PATH SAM_CLI_TELEMETRY=0

start=$SECONDS
"$SAM" build --template-file template.yaml --build-dir "$BUILD_DIR" --beta-features
echo "sam-build-check: sam build took $((SECONDS - start)) s" >&2

bootstrap=$BUILD_DIR/Function/bootstrap
[[ -x $bootstrap ]] || {
	echo "sam-build-check: $bootstrap is missing or not executable" >&2
	exit 1
}
# ELF header: e_machine (offset 18, little endian) is 0xb7 for AArch64.
machine=$(od -An -tx1 -j18 -N2 "$bootstrap" | tr -d ' \n')
[[ $machine == b700 ]] || {
	echo "sam-build-check: $bootstrap is not an arm64 ELF (e_machine $machine)" >&2
	exit 1
}
echo "sam-build-check: $bootstrap is an arm64 executable of $(stat -c %s "$bootstrap") bytes" >&2
# The zip's binary is the Lambda build (Cargo.toml's [package.metadata.lambda.build]: no default
# features): it has the runtime loop and not `serve` or the operator's tools. Their help texts
# are in the binary exactly when their commands are.
# `podmutator version` says which build it is; only this build's answer is in the binary.
for present in "Run the AWS Lambda runtime loop" "In a pod (reference delivery): fetch" \
	"Lambda (the runtime loop, check-config and the pod side"; do
	grep -qaF "$present" "$bootstrap" || {
		echo "sam-build-check: $bootstrap lacks \"$present\": not a podmutator build" >&2
		exit 1
	}
done
for absent in "Serve HTTPS on webhook.listenPort" "Run the webhook offline over manifests" \
	"Print the MutatingWebhookConfiguration" "full (serve and the operator's tools)"; do
	if grep -qaF "$absent" "$bootstrap"; then
		echo "sam-build-check: $bootstrap holds \"$absent\": the Lambda build must leave out serve and the tools" >&2
		exit 1
	fi
done
echo "sam-build-check: the bootstrap is the Lambda build (no serve, inject or webhook-config)" >&2
# The pre-traffic hook (PreTrafficCheck) goes through SAM's python builder, which copies its
# CodeUri as it is: it has no requirements to download, so the build needs no network.
hook=$BUILD_DIR/PreTrafficHook
for f in hook.py pre-traffic-event.json; do
	cmp -s "$hook/$f" deploy/sam/pre-traffic-hook/$f || {
		echo "sam-build-check: $hook/$f is not deploy/sam/pre-traffic-hook/$f" >&2
		exit 1
	}
done
cmp -s "$hook/pre-traffic-event.json" terraform/pre-traffic-event.json || {
	echo "sam-build-check: the hook's event is not terraform/pre-traffic-event.json" >&2
	exit 1
}
echo "sam-build-check: the pre-traffic hook is built with Terraform's canned event" >&2
