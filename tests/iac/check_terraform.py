"""Parses terraform/ with python-hcl2 and checks it against registration.json and the function.

Usage: python check_terraform.py REPO_ROOT EXPECT_JSON FACTS_OUT

EXPECT_JSON holds what the Rust crate says (routes, webhook name, placeholder). FACTS_OUT
receives the Terraform variable defaults, for check_sam.py to compare the SAM parameters with.
Run by tests/iac.rs with the python of .venv-hcl (scripts/tools.sh path python-hcl).
"""

import json
import pathlib
import re
import sys

import hcl2

from common import ALLOWED_ACTIONS, Checks, expected_webhooks, load_json

OPTS = hcl2.SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True
)

TLS12_PLUS_POLICIES = {
    "ELBSecurityPolicy-TLS13-1-2-2021-06",
    "ELBSecurityPolicy-TLS13-1-2-Res-2021-06",
    "ELBSecurityPolicy-TLS13-1-3-2021-06",
    "ELBSecurityPolicy-TLS-1-2-2017-01",
    "ELBSecurityPolicy-TLS-1-2-Ext-2018-06",
    "ELBSecurityPolicy-FS-1-2-Res-2020-10",
}


def load_module(directory):
    """All top-level blocks of a module, merged: {"resource": {type: {name: body}}, ...}."""
    merged = {"resource": {}, "data": {}, "ephemeral": {}, "variable": {}, "locals": {}, "module": {}, "output": {}, "terraform": []}
    for path in sorted(pathlib.Path(directory).glob("*.tf")):
        with open(path, encoding="utf-8") as f:
            doc = hcl2.load(f, serialization_options=OPTS)
        merged["terraform"].extend(doc.get("terraform", []))
        for kind in ("resource", "data", "ephemeral"):
            for block in doc.get(kind, []):
                for rtype, by_name in block.items():
                    merged[kind].setdefault(rtype, {}).update(by_name)
        for kind in ("variable", "module", "output"):
            for block in doc.get(kind, []):
                merged[kind].update(block)
        for block in doc.get("locals", []):
            merged["locals"].update(block)
    return merged


def one(body, key):
    """A nested block that appears once (python-hcl2 gives blocks as lists)."""
    v = body.get(key)
    return v[0] if isinstance(v, list) and v else v


def statements(policy_document):
    out = list(policy_document.get("statement", []))
    for dyn in policy_document.get("dynamic", []):
        for _, body in dyn.items():
            out.extend(body.get("content", []))
    return out


def is_wildcard(v):
    """True for "*" in either form the HCL may hold it: the string or a list containing it."""
    if isinstance(v, str):
        return v.strip() == "*"
    if isinstance(v, list):
        return any(is_wildcard(x) for x in v)
    return False


def required_providers(mod):
    out = {}
    for t in mod["terraform"]:
        for rp in t.get("required_providers", []):
            out.update(rp)
    return out


def lambda_permissions(mod):
    return mod["resource"].get("aws_lambda_permission", {})


def main():
    root = pathlib.Path(sys.argv[1])
    expect = load_json(sys.argv[2])
    facts_out = sys.argv[3]
    c = Checks("terraform")

    registration = load_json(root / "terraform" / "registration.json")
    tf = load_module(root / "terraform")
    sub = load_module(root / "terraform" / "modules" / "webhook-config")
    var = {name: body.get("default") for name, body in tf["variable"].items()}
    res = tf["resource"]
    placeholder = expect["meshLabelKeyPlaceholder"]

    # --- registration.json: the settings the issue asks for, per webhook ---------------------
    want_hooks = expected_webhooks(expect)
    c.eq("registration.json webhook names", [w["name"] for w in registration["webhooks"]], list(want_hooks))
    kube_system_excluded = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    for w in registration["webhooks"]:
        n = w["name"]
        path, mesh = want_hooks.get(n, (None, None))
        c.eq(f"{n}: path is the function's route", w["path"], path)
        c.eq(f"{n}: mesh", w["mesh"], mesh)
        c.eq(f"{n}: admissionReviewVersions", w["admissionReviewVersions"], ["v1"])
        c.eq(f"{n}: sideEffects", w["sideEffects"], "None")
        c.eq(f"{n}: reinvocationPolicy", w["reinvocationPolicy"], "IfNeeded")
        c.true(f"{n}: failurePolicy is Fail or Ignore", w["failurePolicy"] in ("Fail", "Ignore"))
        c.true(f"{n}: timeoutSeconds within 1..30", 1 <= w["timeoutSeconds"] <= 30)
        # Pod CREATE only, except the image builder's: its organisation check also covers the
        # UPDATEs that change images and ephemeral containers added through the subresource.
        pods = {"apiGroups": [""], "apiVersions": ["v1"], "scope": "Namespaced"}
        want_rules = (
            [
                {"operations": ["CREATE", "UPDATE"], **pods, "resources": ["pods"]},
                {"operations": ["UPDATE"], **pods, "resources": ["pods/ephemeralcontainers"]},
            ]
            if n == expect["imageBuilderWebhookName"]
            else [{"operations": ["CREATE"], **pods, "resources": ["pods"]}]
        )
        c.eq(f"{n}: rules", [dict(sorted(r.items())) for r in w["rules"]], [dict(sorted(r.items())) for r in want_rules])
        c.true(
            f"{n}: namespaceSelector excludes kube-system",
            kube_system_excluded in w["namespaceSelector"].get("matchExpressions", []),
        )
        names = [m["name"] for m in w.get("matchConditions", [])]
        c.true(f"{n}: has matchConditions with unique names", names and len(names) == len(set(names)), str(names))
    by_name = {w["name"]: w for w in registration["webhooks"]}
    secrets = by_name.get(expect["secretsWebhookName"], {})
    c.eq(
        "secrets objectSelector is the function's secretsSelector",
        secrets.get("objectSelector"),
        {"matchLabels": {expect["secretsSelector"]["label"]: expect["secretsSelector"]["value"]}},
    )
    c.true(
        "secrets matchConditions skip pods without secret annotations",
        any(expect["annotationPrefix"] in m["expression"] for m in secrets.get("matchConditions", [])),
    )
    pod = by_name.get("managed-pod.podmutator.io", {})
    c.eq("managed-pod objectSelector", pod.get("objectSelector"), {"matchLabels": {placeholder: expect["meshManagedValue"]}})
    ns = by_name.get("managed-namespace.podmutator.io", {})
    c.eq("managed-namespace namespaceSelector labels", ns.get("namespaceSelector", {}).get("matchLabels"), {placeholder: expect["meshManagedValue"]})
    c.eq(
        "managed-namespace objectSelector leaves labelled pods to the other entry",
        ns.get("objectSelector"),
        {"matchExpressions": [{"key": placeholder, "operator": "DoesNotExist"}]},
    )
    c.eq("mesh label key default (root)", var.get("mesh_label_key"), registration["meshLabelKey"])
    c.eq("mesh label key default (webhook-config)", sub["variable"]["mesh_label_key"].get("default"), registration["meshLabelKey"])

    # --- timing: timeoutSeconds > Lambda timeout > Embedded deadline -------------------------
    # The entries that fail closed: the function's answer must reach the API server before their
    # timeout. The images entry fails open and waits 3 s: a pod should not wait long on it.
    min_timeout = min(w["timeoutSeconds"] for w in registration["webhooks"] if w["failurePolicy"] == "Fail")
    images_entry = {w["name"]: w for w in registration["webhooks"]}.get("images.podmutator.io", {})
    c.eq("the images entry fails open at 3 s", (images_entry.get("failurePolicy"), images_entry.get("timeoutSeconds")), ("Ignore", 3))
    c.true("min_timeout_seconds covers the entries that fail closed only",
           'w.failurePolicy == "Fail"' in sub["locals"]["fail_closed_timeouts"] and "local.fail_closed_timeouts" in sub["output"]["min_timeout_seconds"]["value"],
           sub["output"]["min_timeout_seconds"]["value"])
    c.eq("timeout_seconds default defers to registration.json", var.get("timeout_seconds"), None)
    c.eq("failure_policy default defers to registration.json", var.get("failure_policy"), None)
    c.true(
        "webhook timeoutSeconds > Lambda timeout",
        min_timeout > var["lambda_timeout_seconds"],
        f"{min_timeout} vs {var['lambda_timeout_seconds']}",
    )
    c.true(
        "Lambda timeout > Embedded deadline",
        var["lambda_timeout_seconds"] * 1000 > var["embedded_deadline_ms"],
        f"{var['lambda_timeout_seconds']} s vs {var['embedded_deadline_ms']} ms",
    )
    c.eq("Embedded deadline default is the function's", var.get("embedded_deadline_ms"), expect["embedded"]["deadlineMs"])
    c.eq("cache TTL default is the function's", var.get("embedded_cache_ttl_seconds"), expect["embedded"]["cacheTtlSeconds"])
    c.eq("namespace template default is the function's", var.get("namespace_template"), expect["embedded"]["namespaceTemplate"])
    c.eq("body limit default is the function's", var.get("max_body_bytes"), expect["maxBodyBytes"])
    c.eq("mesh label default is the function's", var.get("mesh_label_key"), expect["meshManagedLabel"])
    # Plans refuse it (tests/terraform_apply.rs); here: the rule reads every input it needs.
    public_value = [
        v for v in tf["variable"]["endpoint"]["validation"]
        if all(s in v["condition"] for s in ('var.endpoint == "http_api"', '"embedded"', "lower(", 'var.embedded_delivery == "value"', 'var.embedded_env_var_delivery == "value"'))
    ]
    c.eq("endpoint validation refuses value delivery on http_api", len(public_value), 1)
    c.true(
        "lambda_timeout_seconds validation refers to embedded_deadline_ms",
        any("var.embedded_deadline_ms" in v["condition"] for v in tf["variable"]["lambda_timeout_seconds"]["validation"]),
    )
    fn = res["aws_lambda_function"]["this"]
    c.eq("function handler", fn.get("handler"), "bootstrap")
    c.eq("function runtime", fn.get("runtime"), "provided.al2023")
    c.eq("function architectures", fn.get("architectures"), ["${var.architecture}"])
    c.eq("architecture default", var.get("architecture"), "arm64")
    c.eq("function timeout", fn.get("timeout"), "${var.lambda_timeout_seconds}")
    c.eq("function memory", fn.get("memory_size"), "${var.memory_size}")
    c.eq("memory default", var.get("memory_size"), 256)
    preconditions = [p["condition"] for p in one(fn, "lifecycle").get("precondition", [])]
    c.true(
        "function precondition: Lambda timeout below the registered timeoutSeconds",
        "${var.lambda_timeout_seconds < module.webhook_config.min_timeout_seconds}" in preconditions,
        str(preconditions),
    )
    c.eq(
        "config passes the deadline",
        "deadlineMs = var.embedded_deadline_ms" in tf["locals"]["function_sections"]["embedded"],
        True,
    )
    env = one(fn, "environment")["variables"]
    c.eq("the function's environment is local.function_environment", env, "${local.function_environment}")
    c.eq("the environment is PODMUTATOR_CONFIG alone", tf["locals"]["function_environment"], {"PODMUTATOR_CONFIG": "${jsonencode(local.function_config)}"})
    # Lambda's 4 KB, checked at plan time on the whole environment (every variable), with the
    # unknown hash replaced by a placeholder of its length.
    probe = tf["locals"]["environment_probe"]
    c.true("the size probe is the whole environment with the placeholder hash",
           probe.startswith("${jsonencode(merge(local.function_environment, {PODMUTATOR_CONFIG = jsonencode(merge(local.function_config,") and "local.path_token_http_variants[1]" in probe, probe)
    c.eq("the placeholder is 64 characters, a hash's length", tf["locals"]["hash_placeholder"], '${join("", [for i in range(64) : "0"])}')
    c.true("the size is counted in bytes (through base64), not characters",
           tf["locals"]["environment_probe_b64"] == "${base64encode(local.environment_probe)}" and "length(local.environment_probe_b64) / 4 * 3" in tf["locals"]["environment_bytes"])
    c.true("function precondition: the environment fits Lambda's 4 KB", "${local.environment_bytes <= 4096}" in preconditions, str(preconditions))
    size_message = [p["error_message"] for p in one(fn, "lifecycle")["precondition"] if p["condition"] == "${local.environment_bytes <= 4096}"]
    c.true("the 4 KB refusal gives the size and what to shorten", size_message and "${local.environment_bytes} bytes" in size_message[0] and "images rules" in size_message[0], str(size_message))
    # Items 3 and 16: one hash, [current, previous] during a rotation, or pathTokenDisabled.
    c.eq("function config's http takes the token keys from the variants", tf["locals"]["function_sections"]["http"], "${merge({maxBodyBytes = var.max_body_bytes}, local.path_token_http_variants[0])}")
    variants = tf["locals"]["path_token_http_variants"]
    for part in ("[for h in [local.path_token_sha256, local.hash_placeholder] :",
                 "var.path_token_enabled && var.previous_path_token_sha256 == null ? {pathTokenSha256 = h} : {}",
                 "var.path_token_enabled && var.previous_path_token_sha256 != null ? {pathTokenSha256 = [h, var.previous_path_token_sha256]} : {}",
                 "var.path_token_enabled ? {} : {pathTokenDisabled = true}"):
        c.true(f"token keys: {part}", part in variants, variants)
    c.true("function config carries the token's hash, not a secret id", "pathTokenSecretId" not in json.dumps(tf["locals"]))
    c.eq("no previous token by default", var.get("previous_path_token_sha256"), None)
    prev_checks = [v["condition"] for v in tf["variable"]["previous_path_token_sha256"]["validation"]]
    c.true("previous_path_token_sha256 must be a lowercase hex SHA-256", any('regex("^[0-9a-f]{64}$", var.previous_path_token_sha256)' in v for v in prev_checks), str(prev_checks))
    c.true("previous_path_token_sha256 needs the token on", any("var.path_token_enabled" in v for v in prev_checks), str(prev_checks))
    c.true("function precondition: the previous hash is not the current one",
           "${var.previous_path_token_sha256 == null || var.previous_path_token_sha256 != local.path_token_sha256}" in preconditions, str(preconditions))
    c.true("the hash is SHA-256 of the stored token", tf["locals"]["path_token_sha256"] == "${var.path_token_enabled ? nonsensitive(sha256(local.path_token)) : null}", tf["locals"]["path_token_sha256"])
    c.eq("path token on by default", var.get("path_token_enabled"), True)
    c.true("token generated without the random provider, never in a plan (ephemeral, write-only)",
           "aws_secretsmanager_random_password" in tf["ephemeral"] and "secret_string_wo" in res["aws_secretsmanager_secret_version"]["path_token"],
           str(list(tf["ephemeral"])))
    c.eq("the AWS module needs only the AWS provider", sorted(required_providers(tf)), ["aws"])
    c.eq("the registration module needs no provider", sorted(required_providers(load_module(root / "terraform" / "modules" / "registration"))), [])
    text = "".join(p.read_text() for p in (root / "terraform").rglob("*.tf"))
    # The zip is hashed at plan only where it is (try, falling back to the given hash): plan and
    # destroy work without it, and a zip that is not the hashed one is never uploaded.
    c.eq("the zip hashed at plan only through try(), never required",
         (text.count("filebase64sha256(") + text.count("filesha256("), text.count("try(filebase64sha256(var.lambda_zip_path)")),
         (2, 2))
    c.true("function precondition: the zip at the path is the hashed one",
           "${try(filebase64sha256(var.lambda_zip_path), var.lambda_zip_base64sha256) == var.lambda_zip_base64sha256}" in preconditions, str(preconditions))
    c.eq("code hash from a variable", fn.get("source_code_hash"), "${var.lambda_zip_base64sha256}")
    c.eq("versions published", fn.get("publish"), True)
    # Item 11 of issue 38: a reservation claims the account's regional limit, so a default one
    # made the fourth install in a region (or the first below a limit of 400) fail midway.
    c.eq("reserved concurrency: nothing reserved by default (-1)", var.get("reserved_concurrent_executions"), -1)
    c.eq("the function takes its reservation from the variable", fn.get("reserved_concurrent_executions"), "${var.reserved_concurrent_executions}")
    reserved_checks = [v["condition"] for v in tf["variable"]["reserved_concurrent_executions"]["validation"]]
    c.true("reserved_concurrent_executions: -1 (none) or at least 1, never 0",
           any(v.startswith("${var.reserved_concurrent_executions == -1 || (var.reserved_concurrent_executions >= 1") for v in reserved_checks), str(reserved_checks))
    throttles = tf["locals"]["alarms"]
    c.true("the throttles alarm says what to do when nothing is reserved",
           "reserved_concurrent_executions = -1" in throttles and "ClaimedAccountConcurrency" in throttles and "hit its reserved concurrency" not in throttles, throttles[:200])
    post = [p["condition"] for p in one(fn, "lifecycle").get("postcondition", [])]
    c.true("function postcondition: the uploaded code is the zip whose hash was given",
           "${self.code_sha256 == var.lambda_zip_base64sha256 || self.version == null}" in post, str(post))
    c.eq("role name is a prefix (unique per deployment)", "name" in res["aws_iam_role"]["function"], False)
    c.eq("role permissions boundary", res["aws_iam_role"]["function"].get("permissions_boundary"), "${var.permissions_boundary_arn}")
    for name, lg in res["aws_cloudwatch_log_group"].items():
        c.eq(f"log group {name} kept on destroy", lg.get("skip_destroy"), "${var.retain_log_groups}")
        # A fixed name would make a reinstall fail on the kept group (ResourceAlreadyExists).
        c.true(f"log group {name} is named per install (name_prefix)", "name" not in lg and lg.get("name_prefix", "").endswith('${var.name}-'), str(lg))
    c.eq("log groups kept by default", var.get("retain_log_groups"), True)
    log_group = res["aws_cloudwatch_log_group"]["function"]
    c.eq("function log group retention", log_group.get("retention_in_days"), "${var.log_retention_days}")
    c.eq("function logs go to that group", one(fn, "logging_config").get("log_group"), "${aws_cloudwatch_log_group.function.name}")

    # --- IAM: least privilege -----------------------------------------------------------------
    policy = tf["data"]["aws_iam_policy_document"]["function"]
    stmts = statements(policy)
    actions = [a for s in stmts for a in s.get("actions", [])]
    c.true("no wildcard actions", not any("*" in a for a in actions), str(actions))
    on_star = {"BatchReadSecrets": ["secretsmanager:BatchGetSecretValue"], "EcrAuthorizationToken": ["ecr:GetAuthorizationToken"]}
    for s in stmts:
        if is_wildcard(s.get("resources")):
            c.eq(f"statement {s.get('sid')} on * (string or list form) is BatchGetSecretValue or GetAuthorizationToken alone", s.get("actions"), on_star.get(s.get("sid")))
    c.true("only the expected actions", set(actions) <= ALLOWED_ACTIONS, str(sorted(set(actions) - ALLOWED_ACTIONS)))
    c.true("no NotAction / NotResource", not any("not_actions" in s or "not_resources" in s for s in stmts))
    by_sid = {s.get("sid"): s for s in stmts}
    read = by_sid.get("ReadOrgSecrets", {})
    c.eq("GetSecretValue on the org prefix only", read.get("resources"), ["${local.scoped_secrets_arn}"])
    c.true(
        "org prefix ARN",
        tf["locals"]["scoped_secrets_arn"].endswith(":secret:u__org__${var.secret_org}__*"),
        tf["locals"]["scoped_secrets_arn"],
    )
    c.eq("secret org default", var.get("secret_org"), "flyte")
    batch = by_sid.get("BatchReadSecrets", {})
    c.eq("BatchGetSecretValue stands alone (it is granted on *)", batch.get("actions"), ["secretsmanager:BatchGetSecretValue"])
    # Reference delivery: every value-reading statement exists only when the function reads
    # values, and that is false exactly for delivery "reference" with env vars by "exec".
    c.eq(
        "reads_values: value delivery, or env vars by value",
        tf["locals"].get("reads_values"),
        '${var.embedded_delivery == "value" || var.embedded_env_var_delivery == "value"}',
    )
    c.eq("resolves_refs: reference delivery", tf["locals"].get("resolves_refs"), '${var.embedded_delivery == "reference"}')
    gates = {}
    for dyn in policy.get("dynamic", []):
        for _, body in dyn.items():
            for content in body.get("content", []):
                gates[content.get("sid")] = body.get("for_each")
    for sid in ("ReadOrgSecrets", "BatchReadSecrets"):
        c.eq(f"{sid} only when the function reads values", gates.get(sid), "${local.reads_values ? [1] : []}")
    c.true(
        "kms:Decrypt only when the function reads values",
        "!local.reads_values" in str(gates.get("DecryptSecretsThroughSecretsManager")),
        str(gates.get("DecryptSecretsThroughSecretsManager")),
    )
    c.eq("no statement outside a delivery gate reads secrets", [s.get("sid") for s in policy.get("statement", []) if any("secretsmanager" in a or "kms" in a for a in s.get("actions", []))], [])
    describe = by_sid.get("DescribeOrgSecrets", {})
    c.eq("DescribeSecret on the org prefix only", describe.get("resources"), ["${local.scoped_secrets_arn}"])
    c.eq("DescribeSecret stands alone", describe.get("actions"), ["secretsmanager:DescribeSecret"])
    c.eq("DescribeSecret only in reference delivery", gates.get("DescribeOrgSecrets"), "${local.resolves_refs ? [1] : []}")
    c.eq("value delivery stays the default", var.get("embedded_delivery"), "value")
    embedded_config = tf["locals"]["function_sections"]["embedded"]
    for key in ("organization = var.secret_org", "delivery = var.embedded_delivery", "envVarDelivery = var.embedded_env_var_delivery", "fetcherImage = var.fetcher_image", "domains = var.embedded_domains"):
        c.true(f"function config passes {key}", key in " ".join(str(embedded_config).split()), str(embedded_config))
    ecr_gate = "${length(var.entrypoint_ecr_repository_arns) > 0 ? [1] : []}"
    for sid in ("EcrAuthorizationToken", "EcrReadTaskImages"):
        c.eq(f"{sid} only with ECR repositories named", gates.get(sid), ecr_gate)
    c.eq("ECR image reads on the named repositories only", by_sid.get("EcrReadTaskImages", {}).get("resources"), "${var.entrypoint_ecr_repository_arns}")
    c.eq("no ECR permission by default", var.get("entrypoint_ecr_repository_arns"), [])
    c.true("function config passes the lookup's registries", "var.entrypoint_registries" in " ".join(str(embedded_config).split()), str(embedded_config))
    kms = by_sid.get("DecryptSecretsThroughSecretsManager", {})
    c.eq("kms:Decrypt only through Secrets Manager", one(kms, "condition").get("variable") if kms else None, "kms:ViaService")

    # --- endpoint: routes the registration calls, and nothing else ----------------------------
    c.eq("routes local", tf["locals"].get("routes"), '${concat(module.webhook_config.paths, ["' + expect["routes"]["healthz"] + '"])}')
    c.true("no listener rules (the token would be readable in them)", "aws_lb_listener_rule" not in res)
    listener = res["aws_lb_listener"]["https"]
    c.eq("ALB listener protocol", listener.get("protocol"), "HTTPS")
    c.eq("ALB listener port", listener.get("port"), 443)
    c.eq("ALB catch-all default action forwards to the function", (one(listener, "default_action").get("type"), one(listener, "default_action").get("target_group_arn")), ("forward", "${aws_lb_target_group.function[0].arn}"))
    c.eq("no HTTP listener", sorted(res["aws_lb_listener"]), ["https"])
    c.true("ALB TLS policy is TLS 1.2+", var.get("alb_ssl_policy") in TLS12_PLUS_POLICIES, str(var.get("alb_ssl_policy")))
    c.eq("ALB is internal", res["aws_lb"]["this"].get("internal"), True)
    # An ALB access log line holds the request URL, path token included.
    logs_checks = [v["condition"] for v in tf["variable"]["alb_access_logs_bucket"].get("validation", [])]
    c.true("ALB access logs refused while the token is on, unless acknowledged",
           "${var.alb_access_logs_bucket == null || !var.path_token_enabled || var.alb_access_logs_record_path_token}" in logs_checks, str(logs_checks))
    c.eq("the acknowledgement is off by default", var.get("alb_access_logs_record_path_token"), False)
    c.eq("ALB access logs off by default", var.get("alb_access_logs_bucket"), None)
    access_logs = [d["access_logs"] for d in res["aws_lb"]["this"].get("dynamic", []) if "access_logs" in d]
    c.eq("the ALB's access logs come from alb_access_logs_bucket alone", [a.get("for_each") for a in access_logs], ['${var.alb_access_logs_bucket == null ? [] : [var.alb_access_logs_bucket]}'])
    ingress = res.get("aws_vpc_security_group_ingress_rule", {})
    c.eq("one ingress rule", list(ingress), ["alb_from_control_plane"])
    rule_in = ingress.get("alb_from_control_plane", {})
    c.eq("ingress only from the control plane's security group", rule_in.get("referenced_security_group_id"), "${var.control_plane_security_group_id}")
    c.true("no cluster_security_group_id input (never the cluster SG)", "cluster_security_group_id" not in var)
    c.true("security group and target group names are prefixes, replaced before destroy",
           all("name_prefix" in r and one(r, "lifecycle").get("create_before_destroy") is True for r in (res["aws_security_group"]["alb"], res["aws_lb_target_group"]["function"])))
    pre = [p["condition"] for p in one(res["aws_lb"]["this"], "lifecycle").get("precondition", [])]
    c.true("ALB subnets checked: one per availability zone", any("distinct(data.aws_subnet.alb[*].availability_zone)" in p for p in pre), str(pre))
    c.eq("ingress port", (rule_in.get("from_port"), rule_in.get("to_port"), rule_in.get("ip_protocol")), (443, 443, "tcp"))
    c.true("no CIDR ingress", "cidr_ipv4" not in rule_in and "cidr_ipv6" not in rule_in)
    c.true("no egress rules", "aws_vpc_security_group_egress_rule" not in res and "egress" not in res["aws_security_group"]["alb"])
    c.eq("target group is the Lambda", res["aws_lb_target_group"]["function"].get("target_type"), "lambda")
    c.eq(
        "ALB health check path",
        one(res["aws_lb_target_group"]["function"], "health_check").get("path"),
        expect["routes"]["healthz"],
    )
    # Without the token in it the health check gets 404 behind a token, 200 where the plain
    # paths are answered (no token, or accept_plain_paths while it turns on).
    c.eq(
        "ALB health check expects what /healthz answers",
        one(res["aws_lb_target_group"]["function"], "health_check").get("matcher"),
        '${var.path_token_enabled && !var.accept_plain_paths ? "404" : "200"}',
    )

    api_routes = tf["locals"].get("api_routes", "")
    c.true("API routes keep the plain paths only while accept_plain_paths", "if var.accept_plain_paths" in api_routes, api_routes)
    c.true("API routes put the token first", '"/{token}"' in api_routes and "${p}" in api_routes, api_routes)
    c.true("API routes: GET for healthz, POST otherwise", '"GET" : "POST"' in api_routes, api_routes)
    c.eq("API routes from local.routes", res["aws_apigatewayv2_route"]["routes"].get("for_each"), "${local.use_api ? local.api_routes : {}}")
    c.eq("execute-api endpoint disabled", res["aws_apigatewayv2_api"]["this"].get("disable_execute_api_endpoint"), True)
    settings = one(res["aws_apigatewayv2_stage"]["default"], "default_route_settings")
    c.eq("API throttling burst", settings.get("throttling_burst_limit"), "${var.api_throttling_burst_limit}")
    c.eq("API throttling rate", settings.get("throttling_rate_limit"), "${var.api_throttling_rate_limit}")
    access_format = one(res["aws_apigatewayv2_stage"]["default"], "access_log_settings").get("format", "")
    c.true("access logs never record the path (it holds the token)", "$context.path" not in access_format, access_format)
    c.eq(
        "custom domain TLS policy",
        one(res["aws_apigatewayv2_domain_name"]["this"], "domain_name_configuration").get("security_policy"),
        "TLS_1_2",
    )
    c.true("integration timeout checked against the webhook timeout", any("min_timeout_seconds * 1000" in p["condition"] for p in one(res["aws_apigatewayv2_integration"]["function"], "lifecycle").get("precondition", [])))
    c.eq("integration invokes the live alias", res["aws_apigatewayv2_integration"]["function"].get("integration_uri"), "${aws_lambda_alias.live.invoke_arn}")
    c.eq("API throttling default burst", var.get("api_throttling_burst_limit"), 5000)
    c.eq("API throttling default rate", var.get("api_throttling_rate_limit"), 2000)
    # Item 7 of issue 38: path_token_version only goes up. The applied version is a tag of the
    # secret, read back at plan time by data sources that need no resource of the module, and a
    # lower version is refused before the secret version (which draws a new token) changes.
    c.eq("the token's secret records the applied version", res["aws_secretsmanager_secret"]["path_token"].get("tags"),
         "${merge(var.tags, {(local.path_token_version_tag) = tostring(var.path_token_version)})}")
    listed = tf["data"].get("aws_secretsmanager_secrets", {}).get("path_token", {})
    c.eq("the recorded version is found by the secret's name prefix and tag",
         sorted((f["name"], f["values"]) for f in listed.get("filter", [])), sorted([("name", ["${local.path_token_name_prefix}"]), ("tag-key", ["${local.path_token_version_tag}"])]))
    c.true("the recorded version is read from live tags", "data.aws_secretsmanager_secrets.path_token[0].arns" in str(tf["data"].get("aws_secretsmanager_secret", {}).get("path_token_recorded", {}).get("for_each")))
    version_pre = (one(res["aws_secretsmanager_secret_version"]["path_token"], "lifecycle") or {}).get("precondition", [])
    c.true("a lower path_token_version is refused at plan time",
           any(p["condition"] == "${var.path_token_version >= local.recorded_path_token_version}" and "terraform.tfvars" in p["error_message"] for p in version_pre), str(version_pre))
    c.true("path_token_version is a whole number of at least 1",
           any("var.path_token_version >= 1" in v["condition"] for v in tf["variable"]["path_token_version"].get("validation", [])))
    token = tf["ephemeral"]["aws_secretsmanager_random_password"]["path_token"]
    c.true("path token has at least 32 characters", token.get("password_length", 0) >= 32)
    c.eq("path token is letters and digits", (token.get("exclude_punctuation"), token.get("include_space")), (True, False))

    # --- every invoke permission is scoped by SourceArn, on the alias --------------------------
    for mod_name, mod in [("terraform", tf)] + [(f"modules/{d.name}", load_module(d)) for d in sorted((root / "terraform" / "modules").iterdir())]:
        for name, perm in lambda_permissions(mod).items():
            c.true(f"{mod_name}: aws_lambda_permission.{name} has source_arn", bool(perm.get("source_arn")), str(perm))
            c.true(f"{mod_name}: aws_lambda_permission.{name} source_arn is not a wildcard", not is_wildcard(perm.get("source_arn")))
    c.true("there are invoke permissions to check", len(lambda_permissions(tf)) == 2)
    for name, perm in lambda_permissions(tf).items():
        c.eq(f"aws_lambda_permission.{name} on the live alias", perm.get("qualifier"), "${aws_lambda_alias.live.name}")
    c.eq("ACM validates by DNS", res["aws_acm_certificate"]["this"].get("validation_method"), "DNS")
    c.eq("Certificate Transparency logging from a variable", one(res["aws_acm_certificate"]["this"], "options").get("certificate_transparency_logging_preference"), "${var.certificate_transparency_logging_preference}")
    c.eq("Certificate Transparency logging on by default", var.get("certificate_transparency_logging_preference"), "ENABLED")
    # --- item 13 of issue 38: the pull-through cache rules are their own root's, not an install's ---
    c.true("the AWS module creates no pull-through cache rule", "aws_ecr_pull_through_cache_rule" not in res, str(sorted(res)))
    ptc_data = tf["data"].get("aws_ecr_pull_through_cache_rule", {}).get("upstream", {})
    c.eq("the AWS module reads the rule of each upstream it rewrites to", (ptc_data.get("for_each"), ptc_data.get("ecr_repository_prefix")),
         ("${local.pull_through}", "${var.ecr_pull_through_cache_prefix}${each.key}"))
    c.true("... and refuses a rule that caches another registry",
           any(p.get("condition") == "${self.upstream_registry_url == each.value.upstream}" for p in one(ptc_data, "lifecycle").get("postcondition", [])), str(ptc_data))
    c.true("rules the AWS module made before are dropped from its state, never deleted",
           re.search(r'removed\s*\{\s*from\s*=\s*aws_ecr_pull_through_cache_rule\.upstream\s*lifecycle\s*\{\s*destroy\s*=\s*false', (root / "terraform" / "images.tf").read_text()) is not None)
    ptc = load_module(root / "terraform" / "modules" / "pull-through-cache")
    c.eq("modules/pull-through-cache caches the upstreams the AWS module rewrites to", ptc["locals"].get("upstreams"), tf["locals"]["pull_through_upstreams"])
    c.eq("modules/pull-through-cache: one rule per upstream", ptc["resource"]["aws_ecr_pull_through_cache_rule"]["upstream"].get("for_each"), "${toset(var.upstreams)}")
    for v in ("upstreams", "prefix", "credential_arns"):
        c.true(f"modules/pull-through-cache validates {v} as the AWS module did", bool(ptc["variable"][v].get("validation")))
    ptc_ex = load_module(root / "examples" / "pull-through-cache")
    c.eq("examples/pull-through-cache needs only the AWS provider", sorted(required_providers(ptc_ex)), ["aws"])
    for v in ("upstreams", "prefix", "credential_arns"):
        c.eq(f"examples/pull-through-cache passes {v} to the module", ptc_ex["module"]["pull_through_cache"].get(v), f"${{var.{v}}}")

    # --- registration wiring: the root feeds the renderer what `webhook-config` takes ---------
    mod = tf["module"]["webhook_config"]
    c.eq("renderer source", mod.get("source"), "./modules/webhook-config")
    c.true("renderer reads registration.json", "registration.json" in mod.get("registration_json", ""), mod.get("registration_json", ""))
    c.eq("renderer url", mod.get("url"), "https://${var.domain_name}")
    c.true("the AWS module's renderer gets no token", "path_token" not in mod)
    reg = load_module(root / "terraform" / "modules" / "registration")
    rmod = reg["module"]["webhook_config"]
    c.eq("registration renders with the token", rmod.get("path_token"), "${var.registration.path_token}")
    c.eq("registration failure_policy", rmod.get("failure_policy"), "${var.failure_policy}")
    c.eq("registration secrets_namespace_selector", rmod.get("secrets_namespace_selector"), "${var.secrets_namespace_selector}")
    c.eq("registration input is sensitive", reg["variable"]["registration"].get("sensitive"), True)
    data = reg["resource"]["terraform_data"]["registration"]
    provs = data.get("provisioner", [])
    create = [p["local-exec"] for p in provs if "local-exec" in p and p["local-exec"].get("when") is None]
    c.true("registration applied server-side with --force-conflicts", create and "--server-side --force-conflicts" in create[0]["command"], str(create))
    c.true("the manifest travels only in a (sensitive) environment variable, marked with the instance",
           create and create[0].get("environment", {}).get("MANIFEST", "").startswith("${jsonencode(merge(local.applied,") and "self.id" in create[0]["environment"]["MANIFEST"],
           str(create and create[0].get("environment", {}).get("MANIFEST")))
    c.eq("registration replaced before destroy", one(data, "lifecycle").get("create_before_destroy"), True)

    # --- item 9 of issue 38: a protected install's destroy fails before it deletes anything ----
    def destroy_commands(body):
        return [p["local-exec"] for p in body.get("provisioner", []) if "local-exec" in p and p["local-exec"].get("when") == "destroy"]

    guard = res.get("terraform_data", {}).get("deletion_guard", {})
    c.eq("the deletion guard exists with the ALB", guard.get("count"), "${local.use_alb ? 1 : 0}")
    c.eq("the guard holds alb_deletion_protection in its state", guard.get("input"), "${var.alb_deletion_protection}")
    cmds = destroy_commands(guard)
    c.true("the guard's destroy fails while protected, and only then",
           len(cmds) == 1 and cmds[0].get("command", "").startswith("${self.input ?") and "exit 1" in cmds[0]["command"] and cmds[0]["command"].endswith(': "exit 0"}'), str(cmds))
    c.true("the guard's refusal says how to lift it",
           cmds and "alb_deletion_protection = false" in cmds[0].get("environment", {}).get("MESSAGE", "") and "terraform apply" in cmds[0]["environment"]["MESSAGE"], str(cmds))
    # Destroyed before everything else: it depends on every resource of the module.
    managed = sorted(f"${{{t}.{n}}}" for t, by_name in res.items() for n in by_name if (t, n) != ("terraform_data", "deletion_guard"))
    c.eq("the guard depends on every resource of the module", sorted(guard.get("depends_on", [])), managed)
    c.eq("the registration output carries the protection to modules/registration",
         tf["output"]["registration"]["value"].get("deletion_protection"), "${local.use_alb && var.alb_deletion_protection}")
    rguard = reg["resource"]["terraform_data"].get("deletion_guard", {})
    c.eq("the registration's guard reads the protection from the AWS module's output", rguard.get("input"), "${nonsensitive(var.registration.deletion_protection)}")
    c.eq("the registration's guard depends on the registration (so it is destroyed first)", rguard.get("depends_on"), ["${terraform_data.registration}"])
    rcmds = destroy_commands(rguard)
    c.true("the registration's guard fails while protected, and only then",
           len(rcmds) == 1 and rcmds[0].get("command", "").startswith("${self.input ?") and "exit 1" in rcmds[0]["command"], str(rcmds))
    c.true("no kubernetes_manifest resource anywhere (it prints the token in plans)", "resource \"kubernetes_manifest\"" not in text)
    passed_through = ["name", "path_token_version", "previous_path_token_sha256", "alarm_topic_arns", "secret_org", "embedded_domains", "reserved_concurrent_executions"]
    for ex, extra in (("alb", ["alb_deletion_protection", "alb_access_logs_bucket", "alb_access_logs_record_path_token"]), ("http-api", [])):
        exm = load_module(root / "examples" / ex)
        c.eq(f"examples/{ex} needs only the AWS provider", sorted(required_providers(exm)), ["aws"])
        c.eq(f"examples/{ex}: registration after the AWS module", exm["module"]["registration"].get("depends_on"), ["${module.podmutator}"])
        for v in passed_through + extra:
            c.eq(f"examples/{ex} passes {v} to the module", exm["module"]["podmutator"].get(v), f"${{var.{v}}}")
        c.eq(f"examples/{ex}: nothing reserved by default, as the module", exm["variable"].get("reserved_concurrent_executions", {}).get("default"), -1)
        c.eq(f"examples/{ex} passes secrets_namespace_selector to the registration", exm["module"]["registration"].get("secrets_namespace_selector"), "${var.secrets_namespace_selector}")
        c.true(f"examples/{ex} outputs the registration for the drift check", exm["output"].get("registration_manifest", {}).get("sensitive") is True)
    # Provider 6.x is untested: every module and example allows 5.100 and later 5.x only.
    for d in [root / "terraform", *sorted((root / "terraform" / "modules").iterdir()), *sorted(p for p in (root / "examples").iterdir() if p.is_dir())]:
        aws = required_providers(load_module(d)).get("aws")
        if aws is not None:
            c.eq(f"{d.relative_to(root)}: AWS provider ~> 5.100", aws.get("version"), "~> 5.100")
    c.true("no deprecated aws_region.name (6.x)", "aws_region.current.name" not in "".join(p.read_text() for p in root.rglob("*.tf") if "target" not in p.parts))
    c.true("no hard-coded amazonaws.com host: the partition's dns_suffix (service principals aside)",
           not re.search(r'\.amazonaws\.com"', re.sub(r'"(lambda|elasticloadbalancing|apigateway|pods\.eks|eks)\.amazonaws\.com"', "", "".join(p.read_text() for p in (root / "terraform").rglob("*.tf")))))
    alb_ex = load_module(root / "examples" / "alb")
    c.true("examples/alb requires the control plane's security group (no default)", "default" not in alb_ex["variable"]["control_plane_security_group_id"])
    c.true("examples/alb never falls back to the cluster security group", "cluster_security_group_id" not in (root / "examples" / "alb" / "main.tf").read_text())
    net = load_module(root / "terraform" / "modules" / "eks-network")
    pre = [p["condition"] for p in net["output"]["control_plane_security_group_id"].get("precondition", [])]
    c.true("eks-network refuses the cluster security group", "${local.control_plane_sg != local.cluster_security_group_id}" in pre, str(pre))
    mesh_config = tf["locals"]["function_sections"]["mesh"]
    c.true("function config turns mesh on with the registration", "enabled = var.mesh_enabled" in mesh_config, mesh_config)
    c.true("function config uses the registration's mesh label", "managedLabel = var.mesh_label_key" in mesh_config, mesh_config)

    # --- docs/deploy.md documents every variable and output --------------------------------
    docs = (root / "docs" / "deploy.md").read_text(encoding="utf-8")
    pod_identity = load_module(root / "terraform" / "modules" / "pod-identity")
    for mod_name, mod in [("terraform", tf), ("registration", reg), ("eks-network", net), ("pod-identity", pod_identity), ("pull-through-cache", ptc)]:
        for kind in ("variable", "output"):
            for name in mod[kind]:
                c.true(f"docs/deploy.md documents {mod_name} {kind} {name}", f"`{name}`" in docs)

    with open(facts_out, "w", encoding="utf-8") as f:
        json.dump({"defaults": var, "pullThroughUpstreams": tf["locals"]["pull_through_upstreams"]}, f)
    c.finish()


if __name__ == "__main__":
    main()
