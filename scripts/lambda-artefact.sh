#!/usr/bin/env bash
# Prints the Terraform input that deploys a built zip: its base64 SHA-256, which the module's
# lambda_zip_base64sha256 takes (the module never hashes the file itself, so plan and destroy
# work without it, and a rebuilt zip is deployed only when you pass its new hash).
#   scripts/lambda-artefact.sh [target/lambda/podmutator/bootstrap.zip]
set -euo pipefail
zip=${1:-target/lambda/podmutator/bootstrap.zip}
[[ -f $zip ]] || { echo "lambda-artefact.sh: $zip not found; build it with: cargo lambda build --release --arm64 --output-format zip" >&2; exit 1; }
printf 'lambda_zip_base64sha256 = "%s"\n' "$(openssl dgst -sha256 -binary "$zip" | base64)"
