"""A stand-in for the AWS CLI in tests/terraform_apply.rs, for the one call modules/registration
and scripts/registration-drift.sh make: `aws eks update-kubeconfig --name N [--region R]
--kubeconfig FILE`. It describes the cluster through boto3 (moto, at AWS_ENDPOINT_URL), so an
unknown cluster or region fails as with the real CLI, and writes a kubeconfig naming it (JSON,
which kubectl reads as YAML) for tests/iac/fake_kubectl.py to check.
"""

import json
import pathlib
import sys

import boto3
from botocore.exceptions import ClientError

args = sys.argv[1:]
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
