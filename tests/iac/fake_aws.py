"""A stand-in for the AWS CLI in the tests, for the calls the project's scripts and docs make,
each through boto3 against moto (AWS_ENDPOINT_URL): `aws secretsmanager create-secret`
(scripts/path-token.sh); docs/scale.md's `aws lambda get-account-settings` (with `--query` and
`--output text`) and `aws cloudwatch put-metric-alarm`; docs/troubleshooting.md's `aws lambda get-function-configuration`,
`aws secretsmanager get-secret-value` (with `--query` as JMESPath and `--output text`, as the CLI
reads them) and `aws logs tail GROUP --since 15m [--format short]`; docs/deploy.md's control plane
security group (`eks describe-cluster`, `ec2 create-security-group`, `eks update-cluster-config`,
`ec2 describe-network-interfaces`); its SAM registration (`cloudformation describe-stacks`) and the stack's termination protection
(`cloudformation update-termination-protection`); its fetcher image's ECR repository
(`ecr create-repository`, `ecr get-login-password`, `ecr describe-images`); and
`aws eks update-kubeconfig --name N [--region R] --kubeconfig FILE` (modules/registration,
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


def fail(e, operation):
    sys.exit(f"An error occurred ({e.response['Error']['Code']}) when calling the {operation} operation: {e.response['Error']['Message']}")


def queried(result, opts):
    """`--query` applied (JMESPath, as the CLI does) and printed as the CLI prints it: with
    `--output text` a string as it is and a list of strings tab-separated; without `--output`,
    JSON (the CLI's default)."""
    import jmespath

    value = jmespath.search(opts["--query"], result) if "--query" in opts else result
    output = opts.get("--output", "json")
    if output == "json":
        print(json.dumps(value, indent=4, default=str))
    elif output != "text":
        sys.exit(f"fake aws: only --output text or json, got {opts}")
    elif isinstance(value, str):
        print(value)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        print("\t".join(value))
    else:
        print(json.dumps(value))


if args[:2] in (["lambda", "get-function-configuration"], ["secretsmanager", "get-secret-value"]):
    opts = dict(zip(args[2::2], args[3::2]))
    allowed = {"--function-name", "--qualifier", "--secret-id", "--query", "--output"}
    if len(args) % 2 or not set(opts) <= allowed:
        sys.exit(f"fake aws: unexpected arguments {args}")
    try:
        if args[0] == "lambda":
            kwargs = {"FunctionName": opts["--function-name"]}
            if "--qualifier" in opts:
                kwargs["Qualifier"] = opts["--qualifier"]
            result = boto3.client("lambda").get_function_configuration(**kwargs)
        else:
            result = boto3.client("secretsmanager").get_secret_value(SecretId=opts["--secret-id"])
    except ClientError as e:
        fail(e, "GetFunctionConfiguration" if args[0] == "lambda" else "GetSecretValue")
    queried(result, opts)
    sys.exit(0)
if args[:2] == ["cloudformation", "update-termination-protection"]:
    # docs/deploy.md's SAM stack: `update-termination-protection --[no-]enable-termination-protection
    # --stack-name N`, printing the stack's ID as the CLI does (JSON).
    rest = args[2:]
    flags = [a for a in rest if a in ("--enable-termination-protection", "--no-enable-termination-protection")]
    opts = dict(zip(*[iter([a for a in rest if a not in flags])] * 2))
    if len(flags) != 1 or sorted(opts) != ["--stack-name"] or len(rest) != 3:
        sys.exit(f"fake aws: unexpected arguments {args}")
    try:
        result = boto3.client("cloudformation").update_termination_protection(
            StackName=opts["--stack-name"], EnableTerminationProtection=flags[0] == "--enable-termination-protection")
    except ClientError as e:
        fail(e, "UpdateTerminationProtection")
    print(json.dumps({"StackId": result["StackId"]}, indent=4))
    sys.exit(0)
if args[:2] == ["cloudformation", "describe-stacks"]:
    # docs/deploy.md's SAM registration: `describe-stacks --stack-name N --query
    # "Stacks[0].Outputs[?OutputKey=='K'].OutputValue" --output text`.
    opts = dict(zip(args[2::2], args[3::2]))
    if len(args) % 2 or not set(opts) <= {"--stack-name", "--query", "--output"}:
        sys.exit(f"fake aws: unexpected arguments {args}")
    try:
        result = boto3.client("cloudformation").describe_stacks(StackName=opts["--stack-name"])
    except ClientError as e:
        fail(e, "DescribeStacks")
    queried(result, opts)
    sys.exit(0)
if args[:2] in (["ecr", "create-repository"], ["ecr", "get-login-password"], ["ecr", "describe-images"]):
    # docs/deploy.md's fetcher image: `ecr create-repository --repository-name N
    # --image-tag-mutability M --image-scanning-configuration scanOnPush=B` (printing the
    # repository as JSON), `ecr get-login-password` (the password alone, as the CLI prints it)
    # and `ecr describe-images --repository-name N --image-ids imageTag=T --query Q`.
    import base64

    opts = dict(zip(args[2::2], args[3::2]))
    allowed = {
        "create-repository": {"--repository-name", "--image-tag-mutability", "--image-scanning-configuration"},
        "get-login-password": set(),
        "describe-images": {"--repository-name", "--image-ids", "--query", "--output"},
    }[args[1]]
    if len(args) % 2 or not set(opts) <= allowed:
        sys.exit(f"fake aws: unexpected arguments {args}")
    ecr = boto3.client("ecr")
    try:
        if args[1] == "create-repository":
            key, _, scan = opts.get("--image-scanning-configuration", "scanOnPush=false").partition("=")
            if key != "scanOnPush" or scan not in ("true", "false"):
                sys.exit(f"fake aws: unexpected --image-scanning-configuration {opts}")
            result = ecr.create_repository(
                repositoryName=opts["--repository-name"],
                imageTagMutability=opts.get("--image-tag-mutability", "MUTABLE"),
                imageScanningConfiguration={"scanOnPush": scan == "true"})
        elif args[1] == "get-login-password":
            token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
            print(base64.b64decode(token).decode().partition(":")[2])
            sys.exit(0)
        else:
            key, _, tag = opts["--image-ids"].partition("=")
            if key != "imageTag":
                sys.exit(f"fake aws: unexpected --image-ids {opts['--image-ids']}")
            result = ecr.describe_images(repositoryName=opts["--repository-name"], imageIds=[{"imageTag": tag}])
    except ClientError as e:
        fail(e, "".join(w.capitalize() for w in args[1].split("-")))
    result.pop("ResponseMetadata", None)
    queried(result, opts)
    sys.exit(0)
if args[:2] == ["lambda", "get-account-settings"]:
    opts = dict(zip(args[2::2], args[3::2]))
    if len(args) % 2 or not set(opts) <= {"--query", "--output"}:
        sys.exit(f"fake aws: unexpected arguments {args}")
    try:
        result = boto3.client("lambda").get_account_settings()
    except ClientError as e:
        fail(e, "GetAccountSettings")
    result.pop("ResponseMetadata", None)
    queried(result, opts)
    sys.exit(0)
if args[:2] == ["cloudwatch", "put-metric-alarm"]:
    # Each `--some-option VALUE` as boto3's SomeOption, typed as the CLI types it; the alarm
    # actions a list of one.
    opts = dict(zip(args[2::2], args[3::2]))
    numbers = {"--period": int, "--evaluation-periods": int, "--datapoints-to-alarm": int, "--threshold": float}
    strings = {"--alarm-name", "--alarm-description", "--namespace", "--metric-name", "--statistic",
               "--comparison-operator", "--treat-missing-data"}
    if len(args) % 2 or not set(opts) <= strings | set(numbers) | {"--alarm-actions"}:
        sys.exit(f"fake aws: unexpected arguments {args}")
    kwargs = {}
    for flag, value in opts.items():
        key = "".join(w.capitalize() for w in flag[2:].split("-"))
        kwargs[key] = [value] if flag == "--alarm-actions" else numbers.get(flag, str)(value)
    try:
        boto3.client("cloudwatch").put_metric_alarm(**kwargs)
    except ClientError as e:
        fail(e, "PutMetricAlarm")
    sys.exit(0)
if args[:2] == ["logs", "tail"]:
    # `logs tail GROUP --since 15m [--format short]`: each event's time and message, as the
    # CLI's short format prints them; without --format, its detailed format (time, stream,
    # message).
    import datetime
    import time

    group, opts = args[2], dict(zip(args[3::2], args[4::2]))
    if len(args) % 2 == 0 or sorted(opts) not in (["--format", "--since"], ["--since"]) or opts.get("--format", "short") != "short":
        sys.exit(f"fake aws: unexpected arguments {args}")
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    since = int(opts["--since"][:-1]) * units[opts["--since"][-1]]
    try:
        events = boto3.client("logs").filter_log_events(
            logGroupName=group, startTime=int((time.time() - since) * 1000))["events"]
    except ClientError as e:
        fail(e, "FilterLogEvents")
    for e in events:
        at = datetime.datetime.fromtimestamp(e["timestamp"] / 1000, datetime.timezone.utc)
        if "--format" in opts:
            print(f"{at.strftime('%Y-%m-%dT%H:%M:%S')} {e['message']}")
        else:
            print(f"{at.isoformat()} {e['logStreamName']} {e['message']}")
    sys.exit(0)
if args[:2] in (["eks", "describe-cluster"], ["ec2", "create-security-group"],
                ["eks", "update-cluster-config"], ["ec2", "describe-network-interfaces"]):
    # docs/deploy.md's "A security group for the control plane alone": `eks describe-cluster
    # --name N --query Q --output text`, `ec2 create-security-group --vpc-id V --group-name G
    # --description D --query GroupId --output text`, `eks update-cluster-config --name N
    # --resources-vpc-config securityGroupIds=SG[,SG...]` (the CLI's shorthand; it prints the
    # update as JSON) and `ec2 describe-network-interfaces --filters Name=group-id,Values=SG
    # --query Q` (JSON, the CLI's default output).
    opts = dict(zip(args[2::2], args[3::2]))
    allowed = {
        "describe-cluster": {"--name", "--query", "--output"},
        "create-security-group": {"--vpc-id", "--group-name", "--description", "--query", "--output"},
        "update-cluster-config": {"--name", "--resources-vpc-config"},
        "describe-network-interfaces": {"--filters", "--query"},
    }[args[1]]
    if len(args) % 2 or not set(opts) <= allowed:
        sys.exit(f"fake aws: unexpected arguments {args}")
    try:
        if args[1] == "describe-cluster":
            result = boto3.client("eks").describe_cluster(name=opts["--name"])
        elif args[1] == "create-security-group":
            result = boto3.client("ec2").create_security_group(
                VpcId=opts["--vpc-id"], GroupName=opts["--group-name"], Description=opts["--description"])
        elif args[1] == "update-cluster-config":
            key, _, value = opts["--resources-vpc-config"].partition("=")
            if key != "securityGroupIds" or not value:
                sys.exit(f"fake aws: unexpected --resources-vpc-config {opts['--resources-vpc-config']}")
            result = boto3.client("eks").update_cluster_config(
                name=opts["--name"], resourcesVpcConfig={"securityGroupIds": value.split(",")})
        else:
            name, _, values = opts["--filters"].partition(",")
            if name != "Name=group-id" or not values.startswith("Values="):
                sys.exit(f"fake aws: unexpected --filters {opts['--filters']}")
            result = boto3.client("ec2").describe_network_interfaces(
                Filters=[{"Name": "group-id", "Values": values[len("Values="):].split(",")}])
    except ClientError as e:
        fail(e, "".join(w.capitalize() for w in args[1].split("-")))
    result.pop("ResponseMetadata", None)
    queried(result, opts)
    sys.exit(0)
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
