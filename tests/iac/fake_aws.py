"""A stand-in for the AWS CLI in the tests, for the calls the project's scripts make, each through
boto3 against moto (AWS_ENDPOINT_URL): `aws secretsmanager create-secret` (scripts/path-token.sh)
and `aws eks update-kubeconfig --name N [--region R] --kubeconfig FILE` (modules/registration,
scripts/registration-drift.sh). It describes the cluster through boto3 (moto, at AWS_ENDPOINT_URL), so an
unknown cluster or region fails as with the real CLI, and writes a kubeconfig naming it (JSON,
which kubectl reads as YAML) for tests/iac/fake_kubectl.py to check.
"""

import json
import pathlib
import sys

import boto3
from botocore.exceptions import ClientError

args = sys.argv[1:]
if args[:2] == ["secretsmanager", "create-secret"]:
    # scripts/path-token.sh: `create-secret --name N --description D --secret-string file://F
    # --query ARN --output text`, printing the ARN as the real CLI does.
    opts = dict(zip(args[2::2], args[3::2]))
    if sorted(opts) != ["--description", "--name", "--output", "--query", "--secret-string"] or len(args) % 2:
        sys.exit(f"fake aws: unexpected arguments {args}")
    if (opts["--query"], opts["--output"]) != ("ARN", "text") or not opts["--secret-string"].startswith("file://"):
        sys.exit(f"fake aws: unexpected arguments {args}")
    value = pathlib.Path(opts["--secret-string"][len("file://"):]).read_text(encoding="utf-8")
    try:
        out = boto3.client("secretsmanager").create_secret(
            Name=opts["--name"], Description=opts["--description"], SecretString=value)
    except ClientError as e:
        sys.exit(f"An error occurred ({e.response['Error']['Code']}) when calling the CreateSecret operation: {e.response['Error']['Message']}")
    print(out["ARN"])
    sys.exit(0)
if args[:2] != ["eks", "update-kubeconfig"]:
    sys.exit(f"fake aws: unexpected call {args}")
opts = dict(zip(args[2::2], args[3::2]))
if sorted(opts) not in (["--kubeconfig", "--name"], ["--kubeconfig", "--name", "--region"]) or len(args) % 2:
    sys.exit(f"fake aws: unexpected arguments {args}")
try:
    cluster = boto3.client("eks", region_name=opts.get("--region")).describe_cluster(name=opts["--name"])["cluster"]
except ClientError as e:
    sys.exit(f"An error occurred ({e.response['Error']['Code']}) when calling the DescribeCluster operation: {e.response['Error']['Message']}")
arn = cluster["arn"]
pathlib.Path(opts["--kubeconfig"]).write_text(json.dumps({
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": arn, "cluster": {"server": cluster.get("endpoint", "https://example.invalid")}}],
    "contexts": [{"name": arn, "context": {"cluster": arn, "user": arn}}],
    "current-context": arn,
    "users": [{"name": arn, "user": {}}],
}), encoding="utf-8")
print(f"Added new context {arn} to {opts['--kubeconfig']}")
