#!/usr/bin/env bash
# Creates the path token for the SAM template: a random 48-character token (letters and digits,
# about 285 bits) stored in a new Secrets Manager secret, and prints the two stack parameters
# that go with it. The token itself is never printed; read it from the secret when you
# register the webhook (docs/deploy.md, Path B).
#   scripts/path-token.sh [secret-name]        (default podmutator-path-token-<date>)
# Needs the AWS CLI with credentials for the stack's account and region.
set -euo pipefail
name=${1:-podmutator-path-token-$(date -u +%Y%m%d%H%M%S)}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
chmod 600 "$tmp"
# 48 letters and digits from the kernel's CSPRNG: 4096 random bytes keep about 990 of them. No
# pipe into `head`: under pipefail, the writer it closes early would fail the script (SIGPIPE).
token=$(LC_ALL=C tr -dc 'A-Za-z0-9' < <(head -c 4096 /dev/urandom))
token=${token:0:48}
[[ ${#token} -eq 48 ]] || { echo "path-token.sh: could not draw 48 random characters" >&2; exit 1; }
printf %s "$token" >"$tmp"
unset token
arn=$(aws secretsmanager create-secret --name "$name" \
	--description "podmutator: secret first path segment of the webhook URL (the function holds its SHA-256)" \
	--secret-string "file://$tmp" --query ARN --output text)
hash=$(sha256sum "$tmp" | cut -d' ' -f1)
echo "PathTokenSha256=$hash PathTokenSecretArn=$arn"
