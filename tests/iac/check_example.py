"""Checks what an example (examples/alb, examples/http-api) left in moto and the fake cluster,
after each step of tests/terraform_apply.rs's install, removal and reinstall.

Usage: python check_example.py applied|destroyed|reapplied EXAMPLE OUTPUTS_JSON KUBE_DIR
                               FACTS_JSON FIRST_OUTPUTS_JSON|- LOG...

OUTPUTS_JSON is `terraform output -json` of the example (without the sensitive manifest) taken
at this step (for `destroyed`, before the destroy); FACTS_JSON what tests/iac/moto_cluster.py
made; FIRST_OUTPUTS_JSON the outputs of the first install (for `reapplied`). Each LOG is
Terraform output that must hold neither path token (the install's nor the reinstall's). The tokens are read from the fake cluster's registration and kept, 0600, beside
KUBE_DIR; they are compared, never printed.
"""

import hashlib
import json
import pathlib
import sys

import boto3
from botocore.exceptions import ClientError

from common import Checks

REGION = "us-east-1"
HOST = "podmutator.example.com"
KUBE_SYSTEM = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}


def client(name):
    return boto3.client(name, region_name=REGION)


def outputs(path):
    return {k: v["value"] for k, v in json.loads(pathlib.Path(path).read_text()).items()}


def main():
    mode, example, outputs_path, kube_dir, facts_path, first_path, *logs = sys.argv[1:]
    out = outputs(outputs_path)
    facts = json.loads(pathlib.Path(facts_path).read_text())
    kube = pathlib.Path(kube_dir)
    c = Checks(f"examples/{example} {mode}")
    name = out["function_name"]
    lam = client("lambda")
    registration = kube / "podmutator.json"

    tokens_file = kube.parent / "tokens.secret"
    tokens = tokens_file.read_text().split() if tokens_file.exists() else []
    if mode in ("applied", "reapplied"):
        reg = json.loads(registration.read_text())
        urls = [w["clientConfig"]["url"] for w in reg["webhooks"]]
        token = urls[0].split("/")[3]
        c.true("every URL is the example's domain and one token", all(u.startswith(f"https://{HOST}/{token}/") for u in urls))
        c.eq("the registered token is the function's (path_token_sha256)", hashlib.sha256(token.encode()).hexdigest(), out["path_token_sha256"])
        if token not in tokens:
            tokens.append(token)
            tokens_file.touch(mode=0o600)
            tokens_file.write_text("\n".join(tokens))
        if mode == "reapplied":
            c.eq("the reinstall drew a new token (the old secret is scheduled for deletion)", len(tokens), 2)
        secrets = reg["webhooks"][0]
        want_ns = {"matchExpressions": [KUBE_SYSTEM]}
        if example == "http-api":
            # The example passes secrets_namespace_selector through (terraform.tfvars).
            want_ns = {"matchLabels": {"podmutator-pilot": "true"}, "matchExpressions": [KUBE_SYSTEM]}
        c.eq("secrets entry namespaceSelector", secrets["namespaceSelector"], want_ns)
        c.eq("secrets entry failurePolicy", secrets["failurePolicy"], "Fail")

        fn = lam.get_function(FunctionName=name)
        conf = fn["Configuration"]
        # terraform.tfvars reserves 7: the example passes reserved_concurrent_executions through.
        c.eq("reserved_concurrent_executions passed through", fn.get("Concurrency", {}).get("ReservedConcurrentExecutions"), 7)
        c.eq("the function logs to the log_group_name output", conf.get("LoggingConfig", {}).get("LogGroup"), out["log_group_name"])
        c.true("the log group's name has a generated suffix", out["log_group_name"].startswith(f"/aws/lambda/{name}-") and len(out["log_group_name"]) > len(f"/aws/lambda/{name}-"), out["log_group_name"])
        alarms = client("cloudwatch").describe_alarms(AlarmNamePrefix=f"{name}-")["MetricAlarms"]
        c.true("alarms created", len(alarms) >= 5, str(len(alarms)))
        c.true("every alarm notifies alarm_topic_arns (passed through)", all(a.get("AlarmActions") == [facts["alarm_topic_arn"]] for a in alarms))
        if example == "alb":
            elb = client("elbv2")
            lb = elb.describe_load_balancers(Names=[name])["LoadBalancers"][0]
            attrs = {a["Key"]: a["Value"] for a in elb.describe_load_balancer_attributes(LoadBalancerArn=lb["LoadBalancerArn"])["Attributes"]}
            # On by default (the test leaves the example's default): the removal lifts it.
            c.eq("alb_deletion_protection on by default", attrs.get("deletion_protection.enabled"), "true")
            c.eq("the ALB is in the cluster's internal-elb subnets (eks-network)", sorted(z["SubnetId"] for z in lb["AvailabilityZones"]), sorted(facts["subnet_ids"]))
            sg = client("ec2").describe_security_groups(GroupIds=lb["SecurityGroups"])["SecurityGroups"][0]
            sources = [g["GroupId"] for p in sg["IpPermissions"] for g in p.get("UserIdGroupPairs", [])]
            c.eq("ALB ingress from the control plane's group only", sources, [facts["control_plane_security_group_id"]])
            # The state lives in examples/backend-s3's bucket (docs/deploy.md's key for the ALB
            # example), encrypted with its key.
            backend = json.loads((kube.parent / "backend.json").read_text())
            head = client("s3").head_object(Bucket=backend["bucket"], Key="podmutator/alb.tfstate")
            c.eq("the state is encrypted with the backend's KMS key", (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")), ("aws:kms", backend["kms_key_arn"]))
        else:
            c.eq("dashboard", [d["DashboardName"] for d in client("cloudwatch").list_dashboards()["DashboardEntries"]], [name])

    groups = [g["logGroupName"] for g in client("logs").describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{name}-")["logGroups"]]
    if mode == "destroyed":
        try:
            lam.get_function(FunctionName=name)
            c.true("function deleted", False)
        except ClientError as e:
            c.eq("function deleted", e.response["Error"]["Code"], "ResourceNotFoundException")
        c.true("registration deleted from the cluster", not registration.exists())
        c.eq("the log group is kept (the audit trail)", groups, [out["log_group_name"]])
    elif mode == "reapplied":
        first = outputs(first_path)
        c.true("the reinstall logs to a new group", out["log_group_name"] != first["log_group_name"], out["log_group_name"])
        c.eq("the kept group and the new one, side by side", sorted(groups), sorted([first["log_group_name"], out["log_group_name"]]))
    else:
        c.eq("one log group", groups, [out["log_group_name"]])

    for log in logs:
        text = pathlib.Path(log).read_text(errors="replace")
        c.true(f"{pathlib.Path(log).name} holds no path token", not any(t in text for t in tokens))
    c.finish()


if __name__ == "__main__":
    main()
