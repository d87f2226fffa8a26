"""Checks what `terraform apply` of terraform/ created in moto, and what `destroy` left behind.

Usage: python check_moto_deploy.py applied|destroyed ENDPOINT OUTPUTS_JSON KUBE_DIR LOG...

ENDPOINT is alb or http_api; OUTPUTS_JSON is `terraform output -json` of the harness (taken
before destroy); KUBE_DIR is the fake kubectl's store; each LOG is captured Terraform output
that must not contain the path token. Talks to moto through AWS_ENDPOINT_URL with boto3 (from
.venv). Prints no secret: the token is only compared, never shown.
"""

import hashlib
import json
import pathlib
import re
import sys

import boto3
from botocore.exceptions import ClientError

from common import Checks

REGION = "us-east-1"


def client(name):
    return boto3.client(name, region_name=REGION)


def gone(call):
    try:
        call()
    except ClientError as e:
        return e.response["Error"]["Code"] in ("ResourceNotFoundException", "NotFoundException", "LoadBalancerNotFound", "TargetGroupNotFound")
    return False


def main():
    mode, endpoint, outputs_path, kube_dir, *logs = sys.argv[1:]
    out = {k: v["value"] for k, v in json.loads(pathlib.Path(outputs_path).read_text()).items()}
    c = Checks(f"moto {mode} ({endpoint})")
    fn_name = out["function_name"]
    lam = client("lambda")
    kube = pathlib.Path(kube_dir)
    registration_file = kube / "podmutator.json"

    # Read once while the secret exists, kept (0600) in the scratch directory for the destroyed
    # check, whose logs must not contain it either.
    kept = kube.parent / "token.secret"
    if mode == "applied":
        secret = client("secretsmanager").get_secret_value(SecretId=out["path_token_secret_arn"])["SecretString"]
        kept.touch(mode=0o600)
        kept.write_text(secret)
    else:
        secret = kept.read_text()
    c.true("path token: 48 letters and digits", re.fullmatch(r"[A-Za-z0-9]{48}", secret) is not None)
    token_hash = hashlib.sha256(secret.encode()).hexdigest()
    for log in logs:
        c.true(f"{pathlib.Path(log).name} does not contain the path token", secret not in pathlib.Path(log).read_text(errors="replace"))

    if mode == "destroyed":
        c.true("function deleted", gone(lambda: lam.get_function(FunctionName=fn_name)))
        groups = [g["logGroupName"] for g in client("logs").describe_log_groups()["logGroups"]]
        c.true("function log group kept on destroy (audit trail)", out["log_group_name"] in groups, str(groups))
        if endpoint == "http_api":
            c.true("API access log group kept on destroy", any(g.startswith(f"/aws/apigateway/{fn_name}-") for g in groups), str(groups))
        c.true("registration deleted from the cluster", not registration_file.exists())
        described = client("secretsmanager").describe_secret(SecretId=out["path_token_secret_arn"])
        c.true("token secret scheduled for deletion", "DeletedDate" in described)
        calls = (kube / "calls.log").read_text().splitlines()
        c.true("registration deleted before anything else (last kubectl call is the delete)", "delete" in calls[-1], calls[-1])
        c.finish()
        return

    # --- the function: config holds the token's hash, never the token or its secret id ------
    f = lam.get_function(FunctionName=fn_name)
    conf = f["Configuration"]
    config = json.loads(conf["Environment"]["Variables"]["PODMUTATOR_CONFIG"])
    http = config["http"]
    c.eq("config http keys", sorted(http), ["maxBodyBytes", "pathTokenSha256"])
    c.true("http.pathTokenSha256 is SHA-256 of the stored token (lowercase hex)", http.get("pathTokenSha256") == token_hash)
    c.eq("path_token_sha256 output", out["path_token_sha256"], token_hash)
    c.true("token is nowhere in the function's configuration", secret not in json.dumps(conf))
    c.eq("metrics namespace", config.get("metrics"), {"namespace": "podmutator"})
    c.eq("architecture", conf["Architectures"], ["arm64"])
    c.eq("log format", conf.get("LoggingConfig", {}).get("LogFormat"), "JSON")
    c.eq("nothing reserved by default (the account's limit is not claimed)", f.get("Concurrency", {}).get("ReservedConcurrentExecutions"), None)
    c.eq("the code Lambda holds is the zip whose hash was given", conf["CodeSha256"], out["code_sha256"])
    alias = lam.get_alias(FunctionName=fn_name, Name="live")
    c.true("`live` alias points at a published version", alias["FunctionVersion"] not in ("$LATEST", ""), alias["FunctionVersion"])

    role_name = conf["Role"].split("/")[-1]
    c.true("role name is generated from a prefix (no fixed name)", role_name.startswith(f"{fn_name}-fn-") and len(role_name) > len(fn_name) + 4, role_name)
    iam = client("iam")
    docs = [iam.get_role_policy(RoleName=role_name, PolicyName=p)["PolicyDocument"] for p in iam.list_role_policies(RoleName=role_name)["PolicyNames"]]
    text = json.dumps(docs)
    c.true("the role cannot read the path token's secret", out["path_token_secret_arn"] not in text and "path-token" not in text)

    # --- invoke permissions: each scoped by SourceArn, on the alias -------------------------
    policy = json.loads(lam.get_policy(FunctionName=fn_name, Qualifier="live")["Policy"])
    stmts = policy["Statement"]
    c.eq("one invoke permission", len(stmts), 1)
    for s in stmts:
        src = s.get("Condition", {}).get("ArnLike", {}).get("AWS:SourceArn")
        c.true(f"permission {s.get('Sid')} carries SourceArn", bool(src), json.dumps(s.get("Condition")))
        c.true(f"permission {s.get('Sid')} is on the live alias", s["Resource"].endswith(":live"), s["Resource"])

    # --- the registration the fake cluster received ------------------------------------------
    reg = json.loads(registration_file.read_text())
    urls = [w["clientConfig"]["url"] for w in reg["webhooks"]]
    c.true("every webhook URL starts with the token", all(u.startswith(f"https://podmutator.example.com/{secret}/") for u in urls))
    c.eq("failurePolicy as registered", [w["failurePolicy"] for w in reg["webhooks"]], ["Fail"])

    if endpoint == "alb":
        elb = client("elbv2")
        tg_arn = out["target_group_arn"]
        c.eq("ALB permission SourceArn is the target group", stmts[0]["Condition"]["ArnLike"]["AWS:SourceArn"], tg_arn)
        lb = elb.describe_load_balancers(Names=[fn_name])["LoadBalancers"][0]
        c.eq("ALB internal", lb["Scheme"], "internal")
        c.eq("ALB one subnet per zone", len({z["ZoneName"] for z in lb["AvailabilityZones"]}), len(lb["AvailabilityZones"]))
        listeners = elb.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]
        c.eq("one HTTPS listener on 443", [(x["Protocol"], x["Port"]) for x in listeners], [("HTTPS", 443)])
        c.eq("catch-all default action forwards to the function", [(a["Type"], a.get("TargetGroupArn")) for a in listeners[0]["DefaultActions"]], [("forward", tg_arn)])
        rules = elb.describe_rules(ListenerArn=listeners[0]["ListenerArn"])["Rules"]
        c.eq("no listener rules besides the default", [r["IsDefault"] for r in rules], [True])
        c.true("the token is in no listener rule", secret not in json.dumps(rules, default=str))
        tg = elb.describe_target_groups(TargetGroupArns=[tg_arn])["TargetGroups"][0]
        c.eq("target group health check", (tg["TargetType"], tg["HealthCheckPath"], tg["Matcher"].get("HttpCode")), ("lambda", "/healthz", "404"))
        targets = elb.describe_target_health(TargetGroupArn=tg_arn)["TargetHealthDescriptions"]
        c.eq("target is the live alias", [t["Target"]["Id"] for t in targets], [alias["AliasArn"]])
        ec2 = client("ec2")
        sg = ec2.describe_security_groups(GroupIds=lb["SecurityGroups"])["SecurityGroups"][0]
        sources = [(p["FromPort"], g["GroupId"]) for p in sg["IpPermissions"] for g in p.get("UserIdGroupPairs", [])]
        c.eq("ALB ingress only from the control plane group", sources, [(443, out["control_plane_security_group_id"])])
        c.eq("no CIDR ingress", [r for p in sg["IpPermissions"] for r in p.get("IpRanges", [])], [])
        c.true("DNS target output is the ALB", out["dns_target_name"] == lb["DNSName"])
    else:
        api = client("apigatewayv2")
        api_id = out["api_id"]
        c.true("API permission SourceArn is the API's execution ARN", stmts[0]["Condition"]["ArnLike"]["AWS:SourceArn"].endswith(f":{api_id}/*"))
        integ = api.get_integrations(ApiId=api_id)["Items"]
        c.eq("one integration", len(integ), 1)
        c.true("integration timeout below the webhook timeout (10 s)", integ[0]["TimeoutInMillis"] < 10000, str(integ[0]["TimeoutInMillis"]))
        c.true("integration invokes the live alias", ":live/invocations" in integ[0]["IntegrationUri"], integ[0]["IntegrationUri"])
        keys = sorted(r["RouteKey"] for r in api.get_routes(ApiId=api_id)["Items"])
        c.eq("routes behind {token}", keys, ["GET /{token}/healthz", "POST /{token}/mutate--v1-pod"])
        stage = api.get_stage(ApiId=api_id, StageName="$default")
        rs = stage["DefaultRouteSettings"]
        c.eq("throttling raised for pod bursts", (rs.get("ThrottlingBurstLimit"), rs.get("ThrottlingRateLimit")), (5000, 2000.0))
        c.true("access log format has no $context.path", "$context.path" not in stage["AccessLogSettings"]["Format"])
        rr = client("route53").list_resource_record_sets(HostedZoneId=out["zone_id"])["ResourceRecordSets"]
        alias_rr = [r for r in rr if r["Type"] == "A" and r["Name"].rstrip(".") == "podmutator.example.com"]
        c.eq("alias record to the API domain", [r.get("AliasTarget", {}).get("DNSName", "").rstrip(".") for r in alias_rr], [out["dns_target_name"]])

    # --- alarms ------------------------------------------------------------------------------
    cw = client("cloudwatch")
    alarms = {a["AlarmName"]: a for a in cw.describe_alarms(AlarmNamePrefix=f"{fn_name}-")["MetricAlarms"]}
    want = ["lambda-errors", "lambda-throttles", "lambda-duration-p99", "secretsmanager-throttles", "path-token-refusals"]
    want += ["alb-unhealthy", "alb-target-5xx", "alb-elb-5xx"] if endpoint == "alb" else ["api-4xx", "api-5xx", "api-integration-latency-p99"]
    c.eq("alarms", sorted(alarms), sorted(f"{fn_name}-{w}" for w in want))
    c.true("every alarm notifies the SNS topic", all(a.get("AlarmActions") == [out["alarm_topic_arn"]] for a in alarms.values()))
    emf = alarms.get(f"{fn_name}-secretsmanager-throttles", {})
    c.true("EMF throttles alarm queries SecretsManagerThrottles", "SecretsManagerThrottles" in json.dumps(emf.get("Metrics", [])))
    refusals = alarms.get(f"{fn_name}-path-token-refusals", {})
    c.true("EMF refusals alarm queries Refusals of the PathToken kind", "WHERE Refusal = 'PathToken'" in json.dumps(refusals.get("Metrics", [])))
    if endpoint == "http_api":
        c.eq("dashboard", [d["DashboardName"] for d in cw.list_dashboards()["DashboardEntries"]], [fn_name])

    logs_ = client("logs").describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{fn_name}-")["logGroups"]
    c.eq("function log group: one, with a generated suffix, named by the output", [g["logGroupName"] for g in logs_], [out["log_group_name"]])
    c.eq("function log group retention", [g.get("retentionInDays") for g in logs_], [365])
    c.eq("the function logs to it", conf.get("LoggingConfig", {}).get("LogGroup"), out["log_group_name"])
    c.finish()


if __name__ == "__main__":
    main()
