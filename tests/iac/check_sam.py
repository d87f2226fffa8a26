"""Checks template.yaml against registration.json, the function and the Terraform defaults.

Usage: python check_sam.py REPO_ROOT EXPECT_JSON TERRAFORM_FACTS_JSON CONFIGS_OUT_JSON

The template is decoded with cfn-lint's loader, then the intrinsic functions the template uses
(Ref, Fn::If, Fn::Sub, Fn::Join, Fn::Split, conditions) are evaluated for every combination of
endpoint, mesh, image builder and images switches, so what is checked is what CloudFormation
would create. Every PODMUTATOR_CONFIG so rendered is written to CONFIGS_OUT_JSON, for
tests/iac.rs to load with the function's own configuration code. Run by tests/iac.rs with the
python of .venv (scripts/tools.sh path python), which has cfn-lint.
"""

import importlib.util
import itertools
import json
import pathlib
import re
import shlex
import sys

from cfnlint.decode import decode_str

from common import ALLOWED_ACTIONS, Checks, expected_webhooks, load_json, registration_paths

NO_VALUE = object()
PSEUDO = {
    "AWS::Region": "eu-west-1",
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws",
    "AWS::StackName": "podmutator",
    "AWS::URLSuffix": "amazonaws.com",
}

# SAM parameter -> Terraform variable with the same meaning and default.
SAME_DEFAULTS = {
    "MemorySize": "memory_size",
    "LambdaTimeoutSeconds": "lambda_timeout_seconds",
    "EmbeddedDeadlineMs": "embedded_deadline_ms",
    "EmbeddedCacheTtlSeconds": "embedded_cache_ttl_seconds",
    "EmbeddedDelivery": "embedded_delivery",
    "EmbeddedEnvVarDelivery": "embedded_env_var_delivery",
    "NamespaceTemplate": "namespace_template",
    "MaxBodyBytes": "max_body_bytes",
    "SecretOrg": "secret_org",
    "LogRetentionDays": "log_retention_days",
    "AlbSslPolicy": "alb_ssl_policy",
    "ApiThrottlingBurstLimit": "api_throttling_burst_limit",
    "ApiThrottlingRateLimit": "api_throttling_rate_limit",
    "MeshLabelKey": "mesh_label_key",
    "ReservedConcurrency": "reserved_concurrent_executions",
    "Architecture": "architecture",
    "EcrPullThroughCachePrefix": "ecr_pull_through_cache_prefix",
}

# SAM switch parameter -> the Terraform upstream (ecr_pull_through_cache_upstreams) it stands for.
PULL_THROUGH = {
    "EcrPullThroughCacheDockerHub": "docker-hub",
    "EcrPullThroughCacheQuay": "quay",
    "EcrPullThroughCacheGitHub": "github",
    "EcrPullThroughCacheK8s": "k8s",
    "EcrPullThroughCacheEcrPublic": "ecr-public",
}
# Upstreams ECR serves only with credentials, and the parameter that holds them.
CREDENTIALS = {
    "docker-hub": "EcrPullThroughCacheDockerHubCredentialArn",
    "github": "EcrPullThroughCacheGitHubCredentialArn",
}
ECR_REGISTRY = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"

BUILDER_ON = {
    "ImageBuilderEnabled": "true",
    "ImageBuilderExisting": "cr.union.ai",
    "ImageBuilderReplacement": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/union",
    "ImageBuilderDisableVerification": "false",
    "ImageBuilderLabelSelector": '{"matchLabels":{"image-builder":"true"}}',
}
# images switches: none; one cache without credentials; every cache, a prefix, extra rules and
# both selectors.
IMAGES_VARIANTS = {
    "none": {},
    "quay": {"EcrPullThroughCacheQuay": "true"},
    "all": dict(
        {p: "true" for p in PULL_THROUGH},
        EcrPullThroughCachePrefix="cache/",
        EcrPullThroughCacheDockerHubCredentialArn="arn:aws:secretsmanager:eu-west-1:123456789012:secret:ecr-pullthroughcache/docker-hub-AbCdEf",
        EcrPullThroughCacheGitHubCredentialArn="arn:aws:secretsmanager:eu-west-1:123456789012:secret:ecr-pullthroughcache/github-AbCdEf",
        ImagesExtraRules=["registry.example.com=123456789012.dkr.ecr.eu-west-1.amazonaws.com/mirror", "gcr.io/distroless=mirror.example.org/distroless"],
        ImagesPodSelector='{"matchLabels":{"mirror":"ecr"}}',
        ImagesNamespaceSelector='{"matchExpressions":[{"key":"tier","operator":"In","values":["web"]}]}',
    ),
    "extra-rules-only": {"ImagesExtraRules": ["registry.example.com=mirror.example.org/r"]},
}

TOKEN_SHA256 = "0123456789abcdef" * 4
# The token's secret, as scripts/path-token.sh prints it (the pre-traffic hook reads it).
TOKEN_SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:podmutator-path-token-AbCdEf"


def is_wildcard(v):
    """True for "*" in either form a policy may hold it: the string or a list containing it."""
    if isinstance(v, str):
        return v.strip() == "*"
    if isinstance(v, list):
        return any(is_wildcard(x) for x in v)
    return False


class Evaluator:
    """Resolves the intrinsic functions this template uses, for one set of parameters."""

    def __init__(self, template, params):
        self.t = template
        self.params = params
        self.conditions = {}

    def condition(self, name):
        if name not in self.conditions:
            self.conditions[name] = bool(self.value(self.t["Conditions"][name]))
        return self.conditions[name]

    def exists(self, logical_id):
        cond = self.t["Resources"][logical_id].get("Condition")
        return cond is None or self.condition(cond)

    def ref(self, name):
        if name in self.params:
            v = self.params[name]
            # A list given for a String parameter is what a deploy passes: "a,b".
            if isinstance(v, list) and self.t["Parameters"].get(name, {}).get("Type") == "String":
                return ",".join(v)
            return v
        if name == "AWS::StackId":
            return "arn:aws:cloudformation:eu-west-1:123456789012:stack/podmutator/1a2b3c4d-0000-1111-2222-333344445555"
        if name in PSEUDO:
            return PSEUDO[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        return f"<{name}>"

    def sub(self, text, extra):
        def repl(m):
            key = m.group(1)
            if key in extra:
                return str(extra[key])
            if "." in key:
                return f"<{key}>"
            v = self.ref(key)
            return ",".join(v) if isinstance(v, list) else str(v)

        return re.sub(r"\$\{([^}!]+)\}", repl, text)

    def value(self, v):
        if isinstance(v, dict):
            if len(v) == 1:
                (k, a), = v.items()
                if k == "Ref":
                    return self.ref(a)
                if k == "Condition":
                    return self.condition(a)
                if k == "Fn::If":
                    return self.value(a[1] if self.condition(a[0]) else a[2])
                if k == "Fn::Equals":
                    return self.value(a[0]) == self.value(a[1])
                if k == "Fn::Not":
                    return not self.value(a[0])
                if k == "Fn::And":
                    return all(self.value(x) for x in a)
                if k == "Fn::Or":
                    return any(self.value(x) for x in a)
                if k == "Fn::Contains":
                    return self.value(a[1]) in self.value(a[0])
                if k == "Fn::Join":
                    items = self.value(a[1])
                    return a[0].join(str(self.value(x)) for x in items)
                if k == "Fn::Sub":
                    if isinstance(a, str):
                        return self.sub(a, {})
                    extra = {name: self.value(x) for name, x in a[1].items()}
                    return self.sub(a[0], extra)
                if k == "Fn::Select":
                    return self.value(a[1])[int(self.value(a[0]))]
                if k == "Fn::Split":
                    return str(self.value(a[1])).split(a[0])
                if k == "Fn::GetAtt":
                    return f"<{a[0] if isinstance(a, list) else a}>"
            out = {}
            for k, x in v.items():
                r = self.value(x)
                if r is not NO_VALUE:
                    out[k] = r
            return out
        if isinstance(v, list):
            return [r for r in (self.value(x) for x in v) if r is not NO_VALUE]
        return v


def failed_rules(template, ev):
    """The Rules whose condition holds and one of whose assertions does not, as CloudFormation
    evaluates them before it creates anything: a non-empty answer is a refused deploy."""
    out = []
    for name, rule in template.get("Rules", {}).items():
        if "RuleCondition" in rule and not ev.value(rule["RuleCondition"]):
            continue
        if not all(ev.value(a["Assert"]) for a in rule["Assertions"]):
            out.append(name)
    return out


# The reference init container's image, as a deployment pins it.
FETCHER_IMAGE = "registry.example/podmutator@sha256:" + "0" * 64

ECR_REPOSITORIES = ["arn:aws:ecr:eu-west-1:123456789012:repository/flyte/task"]


def by_sid_ecr(stmts):
    """The resources of the ECR image-read statement, or None without one."""
    for s in stmts:
        if s.get("Sid") == "EcrReadTaskImages":
            return s["Resource"]
    return None


def defaults(template):
    out = {}
    for name, p in template["Parameters"].items():
        d = p.get("Default")
        if p["Type"] == "CommaDelimitedList":
            d = [] if d in (None, "") else [s.strip() for s in str(d).split(",")]
        elif p["Type"] == "Number" and d is not None:
            d = int(d)
        out[name] = d
    return out


def parameters_in(v, template):
    """The parameters a template fragment refers to (Ref and ${Name} in Fn::Sub)."""
    found = set()
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "Ref" and isinstance(x, str) and x in template["Parameters"]:
                found.add(x)
            elif k == "Fn::Sub":
                text = x if isinstance(x, str) else x[0]
                found |= {n for n in re.findall(r"\$\{([^}!.]+)\}", text) if n in template["Parameters"]}
                if not isinstance(x, str):
                    found |= parameters_in(x[1], template)
            else:
                found |= parameters_in(x, template)
    elif isinstance(v, list):
        for x in v:
            found |= parameters_in(x, template)
    return found


def items(n, first, rest, separator=","):
    """Eight items (each list parameter's most), the last padded with "a" to n characters."""
    value = separator.join([first] * 7 + [rest])
    return value + "a" * (n - len(value))


# The longest value of each bounded String parameter that costs the most in the environment's
# JSON: a quote costs two bytes there, a list separator becomes '","' (or a rule's '"},{"match":"'),
# so lists hold their most items. Each is checked against its AllowedPattern and MaxLength.
WORST_VALUES = {
    "SecretEnvVarPrefix": lambda n: "A" * n,
    "ImageBuilderExisting": lambda n: "a" * n,
    "ImageBuilderReplacement": lambda n: "a" * n,
    "ImageBuilderLabelSelector": lambda n: "{" + '"' * (n - 2) + "}",
    "ImagesPodSelector": lambda n: "{" + '"' * (n - 2) + "}",
    "ImagesNamespaceSelector": lambda n: "{" + '"' * (n - 2) + "}",
    "NamespaceTemplate": lambda n: "{{domain}}" + "a" * (n - 10),
    "FetcherImage": lambda n: "a" * n,
    "MeshLabelKey": lambda n: "a" * (n - 64) + "/" + "a" * 63,
    "EcrPullThroughCachePrefix": lambda n: "a" * (n - 1) + "/",
    "SecretOrg": lambda n: "a" * n,
    "PathTokenSha256": lambda n: "a" * n,
    "PreviousPathTokenSha256": lambda n: "b" * n,
    "AllowedUsernames": lambda n: items(n, "a", "a"),
    "EmbeddedDomains": lambda n: items(n, "a", "a"),
    "EntrypointRegistries": lambda n: items(n, "a", "a"),
    "ImagesExtraRules": lambda n: items(n, "a=a", "a=a"),
}


# The Number parameters that reach PODMUTATOR_CONFIG, and the function's key each sets.
CONFIG_NUMBERS = {
    "EmbeddedDeadlineMs": "embedded.deadlineMs",
    "EmbeddedCacheTtlSeconds": "embedded.cacheTtlSeconds",
    "MaxBodyBytes": "http.maxBodyBytes",
}


def worst_case(template, base):
    """The parameters of the largest environment the template can render, and its size."""
    params = dict(base, **BUILDER_ON, **IMAGES_VARIANTS["all"])
    params.update(
        EndpointType="alb", MeshEnabled="true", PathTokenEnabled="true",
        EmbeddedDelivery="reference", EmbeddedEnvVarDelivery="value",
        ImageBuilderDisableVerification="false",
        SecretManagerTypes=list(template["Parameters"]["SecretManagerTypes"]["AllowedValues"]),
        # The longest region and partition suffix there are.
        **{"AWS::Region": "ap-southeast-5", "AWS::URLSuffix": "amazonaws.com.cn"},
    )
    for name in parameters_in(template["Resources"]["Function"]["Properties"]["Environment"], template):
        p = template["Parameters"][name]
        if p["Type"] == "String" and "MaxLength" in p and name in WORST_VALUES:
            params[name] = WORST_VALUES[name](int(p["MaxLength"]))
        elif p["Type"] == "Number" and "MaxValue" in p:
            params[name] = int(p["MaxValue"])
    # The longest deadline needs the longest function timeout (no Rule can hold them in order:
    # CloudFormation cannot compare two numbers; docs/deploy.md says to keep them so).
    params["LambdaTimeoutSeconds"] = int(template["Parameters"]["LambdaTimeoutSeconds"]["MaxValue"])
    ev = Evaluator(template, params)
    env = ev.value(template["Resources"]["Function"]["Properties"]["Environment"]["Variables"])
    return params, len(json.dumps(env, separators=(",", ":")).encode())


def main():
    root = pathlib.Path(sys.argv[1])
    expect = load_json(sys.argv[2])
    tf_facts = load_json(sys.argv[3])
    tf_defaults = tf_facts["defaults"]
    tf_upstreams = tf_facts["pullThroughUpstreams"]
    rendered = []
    c = Checks("template.yaml")

    registration = load_json(root / "terraform" / "registration.json")
    template, matches = decode_str((root / "template.yaml").read_text(encoding="utf-8"))
    c.eq("template decodes", [str(m) for m in matches], [])
    base = defaults(template)
    base.update({"DomainName": "podmutator.example.com", "HostedZoneId": "Z0000000000000", "VpcId": "vpc-0123abcd",
                 "SubnetIds": ["subnet-0123abcd", "subnet-4567abcd"], "ControlPlaneSecurityGroupId": "sg-0123abcd",
                 "PathTokenSha256": TOKEN_SHA256, "PathTokenSecretArn": TOKEN_SECRET_ARN})
    healthz = expect["routes"]["healthz"]
    want_hooks = expected_webhooks(expect)

    # --- parameters: same defaults as Terraform, timing in order -----------------------------
    for param, variable in SAME_DEFAULTS.items():
        c.eq(f"default of {param} equals Terraform's {variable}", base[param], tf_defaults.get(variable))
    # The entries that fail closed: the function's answer must reach the API server before their
    # timeout. The images entry fails open (3 s) and may time out first.
    min_timeout = min(w["timeoutSeconds"] for w in registration["webhooks"] if w["failurePolicy"] == "Fail")
    c.true("webhook timeoutSeconds > LambdaTimeoutSeconds", min_timeout > base["LambdaTimeoutSeconds"])
    c.true("LambdaTimeoutSeconds > EmbeddedDeadlineMs", base["LambdaTimeoutSeconds"] * 1000 > base["EmbeddedDeadlineMs"])
    c.true(
        "LambdaTimeoutSeconds cannot reach the Kubernetes limit of 30",
        int(template["Parameters"]["LambdaTimeoutSeconds"]["MaxValue"]) < 30,
    )
    c.eq("default endpoint", base["EndpointType"], "alb")

    fn = template["Resources"]["Function"]
    props = fn["Properties"]
    c.eq("function type", fn["Type"], "AWS::Serverless::Function")
    c.eq("built with cargo lambda", fn["Metadata"].get("BuildMethod"), "rust-cargolambda")
    c.eq("binary", fn["Metadata"].get("BuildProperties", {}).get("Binary"), "podmutator")
    c.eq("handler", props.get("Handler"), "bootstrap")
    c.eq("runtime", props.get("Runtime"), "provided.al2023")
    c.eq("architectures", props.get("Architectures"), [{"Ref": "Architecture"}])
    c.eq("endpoint invokes the live alias (published versions)", props.get("AutoPublishAlias"), "live")
    # Nothing reserved by default, as Terraform (item 11 of issue 38: a default reservation
    # claims the account's limit and fails other stacks): -1 leaves the property out; 0 is refused.
    c.eq("ReservedConcurrency reserves nothing by default", base["ReservedConcurrency"], -1)
    c.eq("by default the function has no reservation", Evaluator(template, base).value({"x": props.get("ReservedConcurrentExecutions")}).get("x", NO_VALUE), NO_VALUE)
    for reserved, want, refused in [(300, 300, []), (50, 50, []), (-1, NO_VALUE, []), (0, 0, ["ReservedConcurrencyNotZero"])]:
        ev = Evaluator(template, dict(base, ReservedConcurrency=reserved))
        got = ev.value({"x": props.get("ReservedConcurrentExecutions")}).get("x", NO_VALUE)
        c.eq(f"ReservedConcurrency {reserved}: the function's reservation", got, want)
        c.eq(f"ReservedConcurrency {reserved}: rules refused", failed_rules(template, ev), refused)
    for name in ("ReservedConcurrency",):
        c.eq(f"{name} allows -1 (none)", template["Parameters"][name].get("MinValue"), -1)
    throttles = template["Resources"]["LambdaThrottlesAlarm"]["Properties"]["AlarmDescription"]
    c.true("the throttles alarm says what to do when nothing is reserved",
           "ReservedConcurrency -1" in throttles and "ClaimedAccountConcurrency" in throttles and "hit its reserved concurrency" not in throttles, throttles)
    c.eq("path token on by default", base["PathTokenEnabled"], "true")
    for name, r in template["Resources"].items():
        if r["Type"] == "AWS::Logs::LogGroup":
            c.eq(f"{name} kept when the stack is deleted", (r.get("DeletionPolicy"), r.get("UpdateReplacePolicy")), ("Retain", "Retain"))
            # A kept group with a fixed name would make the next stack of that name fail.
            c.true(f"{name}'s name is generated (a reinstall beside the kept group works)", "LogGroupName" not in r["Properties"], str(r["Properties"]))
    cert = template["Resources"]["Certificate"]["Properties"]
    c.eq("Certificate Transparency logging from its parameter", cert.get("CertificateTransparencyLoggingPreference"), {"Ref": "CertificateTransparencyLogging"})
    c.eq("Certificate Transparency logging on by default", base["CertificateTransparencyLogging"], "ENABLED")
    c.eq("timeout", props.get("Timeout"), {"Ref": "LambdaTimeoutSeconds"})
    c.eq("memory", props.get("MemorySize"), {"Ref": "MemorySize"})
    c.eq("log group", props.get("LoggingConfig", {}).get("LogGroup"), {"Ref": "FunctionLogGroup"})
    c.eq(
        "log retention",
        template["Resources"]["FunctionLogGroup"]["Properties"].get("RetentionInDays"),
        {"Ref": "LogRetentionDays"},
    )

    # --- the pull-through caches are Terraform's ----------------------------------------------
    c.eq("SAM offers the upstreams Terraform does", sorted(PULL_THROUGH.values()), sorted(tf_upstreams))
    for param, upstream in PULL_THROUGH.items():
        c.eq(f"{param} off by default", base[param], "false")
    for upstream, param in CREDENTIALS.items():
        c.true(
            f"{param} must name a secret under ecr-pullthroughcache/",
            ":secret:ecr-pullthroughcache/" in template["Parameters"][param]["AllowedPattern"],
        )
        switch = next(p for p, u in PULL_THROUGH.items() if u == upstream)
        guards = [
            name for name, rule in template.get("Rules", {}).items()
            if rule.get("RuleCondition") == {"Fn::Equals": [{"Ref": switch}, "true"]}
            and any(a.get("Assert") == {"Fn::Not": [{"Fn::Equals": [{"Ref": param}, ""]}]} for a in rule["Assertions"])
        ]
        c.true(f"a rule refuses {switch} without {param}", len(guards) == 1, str(guards))
    c.eq("image builder off by default", base["ImageBuilderEnabled"], "false")

    # --- every endpoint, mesh and image switch combination ------------------------------------
    largest_env = (0, "")
    for endpoint, mesh, users, token_on, builder, images in itertools.product(["alb", "http-api"], ["false", "true"], [[], ["system:serviceaccount:flyte:flytepropeller"]], ["true", "false"], [False, True], list(IMAGES_VARIANTS)):
        # The users variants also list lookup registries: both are optional lists in "embedded".
        registries = ["public.ecr.aws", "cr.flyte.org"] if users else []
        domains = ["development", "production", "ml-sandbox"] if users else []
        repositories = ECR_REPOSITORIES if users else []
        # ... and a staged rollout's secrets namespace selector and a mesh label of its own.
        # "none" is how a deploy drops a selector given before (SAM CLI cannot send "").
        secrets_selector = '{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["flytesnacks-development"]}]}' if users else ("none" if token_on == "true" else "")
        label_key = "example.org/meshed" if users and mesh == "true" else base["MeshLabelKey"]
        params = dict(base, EndpointType=endpoint, MeshEnabled=mesh, AllowedUsernames=users, EmbeddedDomains=domains, EntrypointRegistries=registries, EntrypointEcrRepositoryArns=repositories, PathTokenEnabled=token_on, SecretsNamespaceSelector=secrets_selector, MeshLabelKey=label_key)
        if endpoint == "http-api":
            # The only delivery the internet-facing endpoint may serve (checked below).
            params.update(EmbeddedDelivery="reference", FetcherImage=FETCHER_IMAGE)
        if builder:
            params.update(BUILDER_ON)
        params.update(IMAGES_VARIANTS[images])
        ev = Evaluator(template, params)
        tag = f"[{endpoint}, mesh={mesh}, users={len(users)}, token={token_on}, builder={builder}, images={images}]"
        c.eq(f"{tag} every rule holds (the stack deploys)", failed_rules(template, ev), [])
        images_on = images != "none"
        features = (["imageBuilder"] if builder else []) + (["images"] if images_on else [])
        paths = registration_paths(registration, mesh == "true", features)
        routes = paths + [healthz]

        raw = ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"])
        try:
            config = json.loads(raw)
        except ValueError as e:
            c.true(f"{tag} PODMUTATOR_CONFIG is JSON", False, f"{e}: {raw}")
            continue
        # The registration command SAM prints for this stack: its flags follow the parameters,
        # and tests/iac.rs runs it and compares what it registers with the routes and config.
        command = shlex.split(ev.value(template["Outputs"]["WebhookConfigCommand"]["Value"]))
        c.eq(f"{tag} WebhookConfigCommand runs webhook-config on WebhookUrl", command[:4], ["podmutator", "webhook-config", "--url", "https://" + base["DomainName"]])
        flags = command[4:]
        c.eq(f"{tag} WebhookConfigCommand token flag", flags[:2] if token_on == "true" else flags[:1], ["--path-token-file", "token"] if token_on == "true" else ["--no-path-token"])
        c.eq(f"{tag} WebhookConfigCommand --mesh iff MeshEnabled", "--mesh" in flags, mesh == "true")
        c.eq(f"{tag} WebhookConfigCommand --images iff an images rule", "--images" in flags, images_on)
        c.eq(f"{tag} WebhookConfigCommand --image-builder-selector iff the builder", "--image-builder-selector" in flags, builder)
        c.eq(f"{tag} WebhookConfigCommand --secrets-namespace-selector iff SecretsNamespaceSelector", "--secrets-namespace-selector" in flags, secrets_selector not in ("", "none"))
        if secrets_selector not in ("", "none"):
            c.eq(f"{tag} WebhookConfigCommand passes the selector as one argument", flags[flags.index("--secrets-namespace-selector") + 1], secrets_selector)
        rendered.append({"tag": tag, "imageBuilder": builder, "images": images_on, "config": config, "webhookConfig": command[1:], "routes": routes, "secretsNamespaceSelector": json.loads(secrets_selector) if secrets_selector not in ("", "none") else None})
        c.eq(
            f"{tag} config entrypointLookup",
            config["embedded"].get("entrypointLookup"),
            {"registries": registries} if registries else None,
        )
        c.eq(f"{tag} config sections", sorted(config), sorted(["embedded", "http", "mesh", "webhook"] + (["images"] if images_on else [])))
        if builder:
            c.eq(
                f"{tag} config imageBuilderConfig",
                config["webhook"].get("imageBuilderConfig"),
                {
                    "enabled": True,
                    "hostnameReplacement": {"existing": BUILDER_ON["ImageBuilderExisting"], "replacement": BUILDER_ON["ImageBuilderReplacement"], "disableVerification": False},
                    "labelSelector": json.loads(BUILDER_ON["ImageBuilderLabelSelector"]),
                },
            )
        else:
            c.true(f"{tag} no imageBuilderConfig", "imageBuilderConfig" not in config["webhook"])
        variant = IMAGES_VARIANTS[images]
        prefix_of_cache = variant.get("EcrPullThroughCachePrefix", "")
        want_caches = {
            f"{prefix_of_cache}{u}": (tf_upstreams[u]["upstream"], variant.get(CREDENTIALS.get(u, ""), NO_VALUE))
            for p, u in PULL_THROUGH.items() if variant.get(p) == "true"
        }
        if images_on:
            # Terraform's order: the caches in its upstream order, then the extra rules.
            want_rules = [
                {"match": tf_upstreams[u]["match"], "replace": f"{ECR_REGISTRY}/{prefix_of_cache}{u}"}
                for u in tf_upstreams if any(variant.get(p) == "true" for p, x in PULL_THROUGH.items() if x == u)
            ] + [dict(zip(("match", "replace"), r.split("=", 1))) for r in variant.get("ImagesExtraRules", [])]
            want_images = {"enabled": True, "rules": want_rules}
            for key, param in (("podSelector", "ImagesPodSelector"), ("namespaceSelector", "ImagesNamespaceSelector")):
                if variant.get(param):
                    want_images[key] = json.loads(variant[param])
            c.eq(f"{tag} config images", config.get("images"), want_images)
        c.eq(f"{tag} config deadline", config["embedded"].get("deadlineMs"), base["EmbeddedDeadlineMs"])
        c.eq(f"{tag} config mesh", config["mesh"], {"enabled": mesh == "true", "managedLabel": label_key})
        # Without a token the function must be told so, or it refuses to start.
        c.eq(f"{tag} config http", config["http"], dict({"maxBodyBytes": base["MaxBodyBytes"]}, **({"pathTokenSha256": TOKEN_SHA256} if token_on == "true" else {"pathTokenDisabled": True})))
        env_bytes = len(json.dumps(ev.value(props["Environment"]["Variables"]), separators=(",", ":")).encode())
        largest_env = max(largest_env, (env_bytes, tag))
        c.eq(f"{tag} config allowedUsernames", config["embedded"].get("allowedUsernames", []), users)
        c.eq(f"{tag} config domains (EmbeddedDomains)", config["embedded"].get("domains", []), domains)
        c.eq(f"{tag} config region", config["webhook"]["embeddedSecretManagerConfig"]["awsConfig"]["region"], PSEUDO["AWS::Region"])
        c.eq(f"{tag} config organization is SecretOrg", config["embedded"].get("organization"), base["SecretOrg"])

        outputs = template["Outputs"]
        c.eq(f"{tag} Routes output", ev.value(outputs["Routes"]["Value"]), ",".join(routes))
        c.eq(f"{tag} WebhookUrl output", ev.value(outputs["WebhookUrl"]["Value"]), "https://" + base["DomainName"])

        resources = {k: r for k, r in template["Resources"].items() if ev.exists(k)}
        caches = {}
        for k, r in resources.items():
            if r["Type"] == "AWS::ECR::PullThroughCacheRule":
                p = ev.value(r["Properties"])
                caches[p["EcrRepositoryPrefix"]] = (p["UpstreamRegistryUrl"], p.get("CredentialArn", NO_VALUE))
        c.eq(f"{tag} ECR pull-through cache rules (prefix: upstream, credential)", caches, want_caches)
        perms = {k: ev.value(r["Properties"]) for k, r in resources.items() if r["Type"] == "AWS::Lambda::Permission"}
        c.eq(f"{tag} one invoke permission", len(perms), 1)
        for k, perm in perms.items():
            c.true(f"{tag} {k} carries SourceArn", bool(perm.get("SourceArn")), str(perm))
            c.true(f"{tag} {k} SourceArn is not a wildcard", not is_wildcard(perm.get("SourceArn")))
            c.eq(f"{tag} {k} invokes the live alias", perm.get("FunctionName"), "<Function.Alias>")
        prefix = "/{token}" if token_on == "true" else ""
        if endpoint == "alb":
            listener = ev.value(resources["HttpsListener"]["Properties"])
            c.eq(f"{tag} ALB catch-all default action forwards to the function", listener["DefaultActions"], [{"Type": "forward", "TargetGroupArn": "<TargetGroup>"}])
            c.true(f"{tag} no listener rules (the token would be readable in them)", not any(r["Type"] == "AWS::ElasticLoadBalancingV2::ListenerRule" for r in resources.values()))
            tg = ev.value(resources["TargetGroup"]["Properties"])
            c.eq(f"{tag} target is the live alias", tg["Targets"], [{"Id": "<Function.Alias>"}])
            c.eq(f"{tag} health check answer", tg["Matcher"]["HttpCode"], "404" if token_on == "true" else "200")
            src = perms["AlbInvokePermission"].get("SourceArn")
            c.eq(f"{tag} ALB permission SourceArn names this stack's target group", src, f"arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/{tg['Name']}/*")
            c.true(f"{tag} no API Gateway", not any(r["Type"].startswith("AWS::ApiGatewayV2") for r in resources.values()))
        else:
            keys = sorted(ev.value(r["Properties"])["RouteKey"] for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Route")
            want = sorted([f"POST {prefix}{p}" for p in paths] + [f"GET {prefix}{healthz}"])
            c.eq(f"{tag} API routes", keys, want)
            c.true(f"{tag} no load balancer", "LoadBalancer" not in resources)
            integ = ev.value(resources["HttpApiIntegration"]["Properties"])
            c.true(f"{tag} integration timeout below the webhook timeout", integ["TimeoutInMillis"] < min_timeout * 1000)
            c.true(
                f"{tag} integration timeout above the largest Lambda timeout",
                integ["TimeoutInMillis"] > int(template["Parameters"]["LambdaTimeoutSeconds"]["MaxValue"]) * 1000,
            )
            c.true(f"{tag} API permission SourceArn is the API's execution ARN", perms["HttpApiInvokePermission"].get("SourceArn", "").endswith(":<HttpApi>/*"))

        alarm_queries = [
            q.get("Expression", "")
            for r in resources.values()
            if r["Type"] == "AWS::CloudWatch::Alarm"
            for q in ev.value(r["Properties"]).get("Metrics", [])
        ]
        c.true(
            f"{tag} an alarm sums the function's SecretsManagerThrottles in its metrics namespace",
            f'SELECT SUM(SecretsManagerThrottles) FROM "{expect["metricsNamespace"]}"' in alarm_queries,
            str(alarm_queries),
        )
        c.true(
            f"{tag} an alarm sums the function's PathToken refusals in its metrics namespace",
            f'SELECT SUM(Refusals) FROM "{expect["metricsNamespace"]}" WHERE Refusal = \'PathToken\'' in alarm_queries,
            str(alarm_queries),
        )

        role = ev.value(resources["FunctionRole"]["Properties"])
        stmts = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
        actions = [a for s in stmts for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
        c.true(f"{tag} no wildcard actions", not any("*" in a for a in actions), str(actions))
        on_star = {"BatchReadSecrets": "secretsmanager:BatchGetSecretValue", "EcrAuthorizationToken": "ecr:GetAuthorizationToken"}
        for s in stmts:
            if is_wildcard(s["Resource"]):
                c.eq(f"{tag} {s['Sid']} on * (string or list form) is BatchGetSecretValue or GetAuthorizationToken alone", s["Action"], on_star.get(s["Sid"]))
        c.eq(
            f"{tag} ECR image reads on the named repositories only",
            by_sid_ecr(stmts),
            ECR_REPOSITORIES if users else None,
        )
        c.true(f"{tag} only the expected actions", set(actions) <= ALLOWED_ACTIONS, str(sorted(set(actions) - ALLOWED_ACTIONS)))
        by_sid = {s["Sid"]: s for s in stmts}
        c.eq(
            f"{tag} GetSecretValue on the org prefix (value delivery), DescribeSecret only (reference)",
            by_sid.get("ReadOrgSecrets" if endpoint == "alb" else "DescribeOrgSecrets", {}).get("Resource"),
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:u__org__flyte__*",
        )
        if endpoint == "http-api":
            c.true(f"{tag} no value-reading statement behind the public endpoint", "ReadOrgSecrets" not in by_sid, str(sorted(by_sid)))
        c.true(f"{tag} the role cannot read the path token", "ReadPathToken" not in by_sid and "PathToken" not in json.dumps(role))

    # --- Lambda's 4 KB environment -------------------------------------------------------------
    # CloudFormation cannot measure a string, so no Rule can refuse a large PODMUTATOR_CONFIG
    # before Lambda does (it fails the update and the stack rolls back; docs/deploy.md, "The 4 KB
    # environment"). The template's own largest rendering, every option on, keeps a margin for
    # longer names, selectors and rules than the ones above.
    c.true(
        f"the largest rendered environment ({largest_env[0]} bytes, {largest_env[1]}) leaves 1 KB of Lambda's 4096",
        0 < largest_env[0] <= 4096 - 1024,
    )
    print(f"template.yaml: largest rendered environment {largest_env[0]} bytes of 4096 ({largest_env[1]})", file=sys.stderr)

    # ... and every value CloudFormation accepts fits: each parameter the environment holds is
    # bounded (MaxLength, MaxValue or AllowedValues), and the largest rendering, with every
    # bounded value at its longest and written to cost the most once escaped in the JSON of the
    # environment, is within 4096 bytes.
    worst, worst_bytes = worst_case(template, base)
    env_params = parameters_in(props["Environment"], template)
    for name in sorted(env_params):
        p = template["Parameters"][name]
        bounded = "AllowedValues" in p or ("MaxLength" in p if p["Type"] == "String" else "MaxValue" in p)
        c.true(f"{name} reaches the environment and is bounded", bounded, str(p))
        if "MaxLength" in p and name in worst:
            value = worst[name]
            c.eq(f"{name}'s worst case is MaxLength characters", len(value), int(p["MaxLength"]))
            c.true(f"{name}'s worst case is a value CloudFormation accepts", re.fullmatch(p.get("AllowedPattern", ".*"), value) is not None, value)
        elif "MaxLength" in p:
            c.true(f"{name} has a worst case", False)
    ev = Evaluator(template, worst)
    c.eq("the worst case deploys (every rule holds)", failed_rules(template, ev), [])
    c.true(
        f"the largest environment CloudFormation can render ({worst_bytes} bytes) fits Lambda's 4096",
        0 < worst_bytes <= 4096,
    )
    print(f"template.yaml: largest possible environment {worst_bytes} bytes of 4096", file=sys.stderr)

    # --- every number the function reads, at each end CloudFormation accepts -----------------
    # The function's own bounds (bounds.rs, as EXPECT_JSON's "bounds") contain each parameter's
    # MinValue..MaxValue, and the configuration rendered at each end (every switch that adds a
    # dependent setting on: a registry lookup, whose timeout follows the deadline) goes through
    # the function's check-config in tests/iac.rs.
    bounds = expect["bounds"]
    numbers = sorted(
        n for n in parameters_in(props["Environment"], template) if template["Parameters"][n]["Type"] == "Number"
    )
    c.eq("the numbers that reach the function", numbers, sorted(CONFIG_NUMBERS))
    for name in numbers:
        p = template["Parameters"][name]
        key = CONFIG_NUMBERS.get(name)
        b = bounds.get(key, {})
        lo, hi = int(p.get("MinValue", -1)), int(p.get("MaxValue", 2**64))
        c.true(
            f"{name} ({lo}..{hi}) lies within the function's {key} ({b})",
            b.get("minimum", 2**64) <= lo and hi <= b.get("maximum", 2**64 - 1),
        )
        for end in (lo, hi):
            params = dict(base, EntrypointRegistries="registry.example.com", **{name: end})
            ev = Evaluator(template, params)
            tag = f"[{name}={end}]"
            c.eq(f"{tag} every rule holds", failed_rules(template, ev), [])
            config = json.loads(ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))
            section, leaf = key.split(".", 1)
            c.eq(f"{tag} renders {key}", config.get(section, {}).get(leaf), end)
            rendered.append({"tag": tag, "imageBuilder": False, "images": False, "config": config})

    # --- token rotation: [current, previous] for one deploy -----------------------------------
    previous = "fedcba9876543210" * 4
    # "none" (the default) is no previous token; so is "", which stacks deployed before "none"
    # existed hold (SAM CLI cannot pass an empty value, tests/iac/check_sam_runbook.py).
    for token_on, prev, want_http, want_failed in [
        ("true", "none", {"pathTokenSha256": TOKEN_SHA256}, []),
        ("true", "", {"pathTokenSha256": TOKEN_SHA256}, []),
        ("true", previous, {"pathTokenSha256": [TOKEN_SHA256, previous]}, []),
        ("false", "none", {"pathTokenDisabled": True}, []),
        ("false", "", {"pathTokenDisabled": True}, []),
        ("false", previous, {"pathTokenDisabled": True}, ["PreviousTokenNeedsCurrent"]),
        ("true", TOKEN_SHA256, {"pathTokenSha256": [TOKEN_SHA256, TOKEN_SHA256]}, ["PreviousTokenNeedsCurrent"]),
    ]:
        params = dict(base, PathTokenEnabled=token_on, PreviousPathTokenSha256=prev)
        ev = Evaluator(template, params)
        tag = f"[token={token_on}, previous={'empty' if prev == '' else 'none' if prev == 'none' else 'set'}{', equal to current' if prev == TOKEN_SHA256 else ''}]"
        c.eq(f"{tag} rules refused", failed_rules(template, ev), want_failed)
        config = json.loads(ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))
        c.eq(f"{tag} config http", config["http"], dict({"maxBodyBytes": base["MaxBodyBytes"]}, **want_http))
        if not want_failed:
            rendered.append({"tag": tag, "imageBuilder": False, "images": False, "config": config})
    c.eq("previous token hash parameter is 64 lowercase hex digits, none or empty", template["Parameters"]["PreviousPathTokenSha256"].get("AllowedPattern"), "^([0-9a-f]{64}|none)?$")
    c.eq("previous token hash parameter defaults to none", base["PreviousPathTokenSha256"], "none")

    # --- a second stack in the account and region leaves the cache rules to the first ------
    rules_of = {}
    for create in ("true", "false"):
        ev = Evaluator(template, dict(base, EcrPullThroughCacheCreateRules=create, **IMAGES_VARIANTS["all"]))
        c.eq(f"[cache rules created={create}] every rule holds", failed_rules(template, ev), [])
        made = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::ECR::PullThroughCacheRule" and ev.exists(k)]
        c.eq(f"[cache rules created={create}] pull-through cache rules", len(made), len(PULL_THROUGH) if create == "true" else 0)
        rules_of[create] = json.loads(ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))["images"]["rules"]
    c.eq("the images rules do not depend on who created the cache rules", rules_of["false"], rules_of["true"])
    # Terraform leaves the rules to their own root (modules/pull-through-cache); a stack makes them.
    c.eq("cache rules created by default", base["EcrPullThroughCacheCreateRules"], "true")

    # --- the policy follows the delivery ------------------------------------------------------
    org_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:u__org__flyte__*"
    value_actions = {"secretsmanager:GetSecretValue", "secretsmanager:BatchGetSecretValue", "kms:Decrypt"}
    for delivery, env_var_delivery in [("value", "exec"), ("reference", "exec"), ("reference", "value")]:
        params = dict(base, EmbeddedDelivery=delivery, EmbeddedEnvVarDelivery=env_var_delivery,
                      FetcherImage="registry.example/podmutator@sha256:" + "0" * 64,
                      SecretsKmsKeyArn="arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000")
        ev = Evaluator(template, params)
        tag = f"[delivery={delivery}, envVarDelivery={env_var_delivery}]"
        config = json.loads(ev.value(template["Resources"]["Function"]["Properties"]["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))
        c.eq(f"{tag} config delivery", (config["embedded"].get("delivery"), config["embedded"].get("envVarDelivery")), (delivery, env_var_delivery))
        c.eq(f"{tag} config fetcherImage", config["embedded"].get("fetcherImage"), params["FetcherImage"] if delivery == "reference" else None)
        role = ev.value(template["Resources"]["FunctionRole"]["Properties"])
        stmts = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
        actions = {a for s in stmts for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        by_sid = {s["Sid"]: s for s in stmts}
        reads = delivery == "value" or env_var_delivery == "value"
        if reads:
            c.true(f"{tag} the function reads values", value_actions <= actions, str(sorted(actions)))
        else:
            c.eq(f"{tag} no value-reading action at all", sorted(actions & value_actions), [])
        if delivery == "reference":
            c.eq(f"{tag} DescribeSecret on the org prefix", (by_sid.get("DescribeOrgSecrets", {}).get("Action"), by_sid.get("DescribeOrgSecrets", {}).get("Resource")), ("secretsmanager:DescribeSecret", org_arn))
        else:
            c.true(f"{tag} no DescribeSecret", "secretsmanager:DescribeSecret" not in actions, str(sorted(actions)))

    # --- what the function refuses at start, refused before anything is created -------------
    # A Rule where the check compares parameters, an AllowedPattern where one value shows it.
    # Each refused value, rendered as the template would render it, is one the function refuses
    # too, naming the key (tests/iac.rs runs check-config on it: "refusedAt"); each accepted one
    # it starts with.
    for tag, extra, want_failed, key in [
        ("[reference without FetcherImage]", dict(EmbeddedDelivery="reference", FetcherImage=""), ["ReferenceNeedsFetcherImage"], "embedded.fetcherImage"),
        ("[reference with FetcherImage]", dict(EmbeddedDelivery="reference", FetcherImage=FETCHER_IMAGE), [], None),
        ("[value without FetcherImage]", dict(EmbeddedDelivery="value", FetcherImage=""), [], None),
        ("[ImageBuilderReplacement = ImageBuilderExisting]", dict(BUILDER_ON, ImageBuilderReplacement=BUILDER_ON["ImageBuilderExisting"]), ["ImageBuilderNeedsHosts"], "webhook.imageBuilderConfig.hostnameReplacement.replacement"),
        ("[ImageBuilderReplacement elsewhere]", dict(BUILDER_ON), [], None),
    ]:
        ev = Evaluator(template, dict(base, **extra))
        c.eq(f"{tag} rules refused", failed_rules(template, ev), want_failed)
        config = json.loads(ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))
        rendered.append(dict({"tag": tag, "imageBuilder": "ImageBuilderEnabled" in extra, "images": False, "config": config}, **({"refusedAt": key} if key else {})))
    c.true(
        "the FetcherImage refusal tells what to set",
        "Set FetcherImage" in str(template.get("Rules", {}).get("ReferenceNeedsFetcherImage", {}).get("Assertions")),
    )
    for name, value, key in [
        ("FetcherImage", "123456789012.dkr.ecr.eu-west-1.amazonaws.com/podmutator@sha256:REPLACE_WITH_THE_DIGEST", "embedded.fetcherImage"),
        ("FetcherImage", " ", "embedded.fetcherImage"),
        ("FetcherImage", "registry.example.com/Podmutator:1", "embedded.fetcherImage"),
        ("FetcherImage", "registry.example.com/podmutator@sha265:" + "0" * 64, "embedded.fetcherImage"),
        ("FetcherImage", FETCHER_IMAGE, None),
        ("FetcherImage", "localhost:5000/podmutator:v1@sha256:" + "0123456789abcdef" * 4, None),
        ("FetcherImage", "podmutator:1.2.3", None),
        ("NamespaceTemplate", "{{ project }}", "embedded.namespaceTemplate"),
        ("NamespaceTemplate", "{{ project }}.{{ domain }}", "embedded.namespaceTemplate"),
        ("NamespaceTemplate", "{{ team }}-{{ domain }}", "embedded.namespaceTemplate"),
        ("NamespaceTemplate", "-{{ project }}-{{ domain }}", "embedded.namespaceTemplate"),
        ("NamespaceTemplate", "{{ project }}-{{ domain }}", None),
        ("NamespaceTemplate", "{{organization}}-{{ project }}-{{domain}}", None),
        ("NamespaceTemplate", "ns-{{  domain }}-{{ project }}", None),
    ]:
        tag = f"[{name}={value!r}]"
        pattern = template["Parameters"][name]["AllowedPattern"]
        c.eq(f"{tag} CloudFormation accepts it (AllowedPattern)", re.fullmatch(pattern, value) is not None, key is None)
        ev = Evaluator(template, dict(base, **dict({"EmbeddedDelivery": "reference", "FetcherImage": FETCHER_IMAGE}, **{name: value})))
        config = json.loads(ev.value(props["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))
        rendered.append(dict({"tag": tag, "imageBuilder": False, "images": False, "config": config}, **({"refusedAt": key} if key else {})))

    # --- value delivery is never served through the internet-facing endpoint ----------------
    # CloudFormation evaluates Rules before it creates anything; the function refuses such
    # reviews too (tests/attacks/public_endpoint.rs).
    for endpoint, types, delivery, env_var_delivery in itertools.product(
        ["alb", "http-api"], [["Embedded"], ["K8s", "Embedded"], ["K8s"]], ["value", "reference"], ["exec", "value"]
    ):
        params = dict(base, EndpointType=endpoint, SecretManagerTypes=types, EmbeddedDelivery=delivery,
                      EmbeddedEnvVarDelivery=env_var_delivery, FetcherImage=FETCHER_IMAGE)
        refused = endpoint == "http-api" and "Embedded" in types and (delivery == "value" or env_var_delivery == "value")
        c.eq(
            f"[{endpoint}, {','.join(types)}, delivery={delivery}, envVarDelivery={env_var_delivery}] refused by NoValueDeliveryOnHttpApi",
            failed_rules(template, Evaluator(template, params)),
            ["NoValueDeliveryOnHttpApi"] if refused else [],
        )
    c.true(
        "the refusal tells what to do",
        "EmbeddedDelivery reference" in str(template.get("Rules", {}).get("NoValueDeliveryOnHttpApi", {}).get("Assertions")),
    )

    # --- endpoint hardening ------------------------------------------------------------------
    r = template["Resources"]
    c.eq("ALB is internal", r["LoadBalancer"]["Properties"].get("Scheme"), "internal")
    c.eq("ALB listener", (r["HttpsListener"]["Properties"]["Protocol"], r["HttpsListener"]["Properties"]["Port"]), ("HTTPS", 443))
    c.eq("ALB TLS policy", r["HttpsListener"]["Properties"]["SslPolicy"], {"Ref": "AlbSslPolicy"})
    c.eq("one listener", [k for k, v in r.items() if v["Type"] == "AWS::ElasticLoadBalancingV2::Listener"], ["HttpsListener"])
    ingress = r["AlbSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    c.eq("ingress only from the control plane's security group", [i.get("SourceSecurityGroupId") for i in ingress], [{"Ref": "ControlPlaneSecurityGroupId"}])
    c.true("no ClusterSecurityGroupId parameter (never the cluster SG)", "ClusterSecurityGroupId" not in template["Parameters"])
    c.eq("ingress port", [(i["IpProtocol"], i["FromPort"], i["ToPort"]) for i in ingress], [("tcp", 443, 443)])
    c.eq(
        "egress matches nothing",
        [e.get("CidrIp") for e in r["AlbSecurityGroup"]["Properties"]["SecurityGroupEgress"]],
        ["255.255.255.255/32"],
    )
    c.true("no other ingress", not any(v["Type"] == "AWS::EC2::SecurityGroupIngress" for v in r.values()))
    c.eq("health check path", r["TargetGroup"]["Properties"].get("HealthCheckPath"), healthz)
    # An ALB access log line holds the request URL, whose first segment is the path token.
    attrs = [a["Key"] for a in r["LoadBalancer"]["Properties"].get("LoadBalancerAttributes", [])]
    c.true("no ALB access logs (they would record the path token)", not any(k.startswith("access_logs.") for k in attrs), str(attrs))
    c.true("no parameter turns ALB access logs on", not any("accesslog" in p.lower() for p in template["Parameters"]), str(list(template["Parameters"])))
    c.eq("execute-api endpoint disabled", r["HttpApi"]["Properties"].get("DisableExecuteApiEndpoint"), True)
    stage = r["HttpApiStage"]["Properties"]
    c.eq("API throttling", sorted(stage["DefaultRouteSettings"]), ["DetailedMetricsEnabled", "ThrottlingBurstLimit", "ThrottlingRateLimit"])
    c.true("access logs never record the path (it holds the token)", "$context.path" not in stage["AccessLogSettings"]["Format"])
    c.eq("custom domain TLS policy", r["ApiDomain"]["Properties"]["DomainNameConfigurations"][0]["SecurityPolicy"], "TLS_1_2")
    c.eq("token hash parameter is 64 lowercase hex digits", template["Parameters"]["PathTokenSha256"]["AllowedPattern"], "^([0-9a-f]{64})?$")
    c.true("no Secrets Manager secret in the stack holds a token", not any(v["Type"] == "AWS::SecretsManager::Secret" for v in r.values()))
    c.eq("certificate validated by DNS", r["Certificate"]["Properties"]["ValidationMethod"], "DNS")
    c.eq("secrets webhook name is Flyte's", list(want_hooks)[0], registration["webhooks"][0]["name"])

    # --- releases: CodeDeploy moves the alias after the pre-traffic hook ----------------------
    # SAM adds the CodeDeploy application and deployment group; the hook, its role and the role
    # CodeDeploy acts with are the template's. tests/iac.rs runs the hook's code itself.
    c.eq("pre-traffic check on by default, as Terraform's pre_traffic_check",
         (base["PreTrafficCheck"], tf_defaults.get("pre_traffic_check")), ("true", True))
    pref = props.get("DeploymentPreference", {})
    c.eq("CodeDeploy moves the live alias at once", pref.get("Type"), "AllAtOnce")
    c.eq("CodeDeploy acts with the stack's own role, not SAM's AWSCodeDeployRoleForLambda",
         pref.get("Role"), {"Fn::GetAtt": ["CodeDeployRole", "Arn"]})
    c.true("no alarm stops a release (the errors alarm counts the live version's errors too)", "Alarms" not in pref, str(pref))
    c.eq("only a pre-traffic hook", sorted(pref.get("Hooks", {})), ["PreTraffic"])
    hook = r["PreTrafficHook"]
    hp = hook["Properties"]
    for name in ("PreTrafficHook", "PreTrafficHookRole", "PreTrafficHookLogGroup"):
        c.eq(f"{name} exists only with the check on", r[name].get("Condition"), "PreTrafficCheckOn")
    c.eq("the output naming the hook's log group exists with it",
         (template["Outputs"]["PreTrafficLogGroupName"].get("Condition"), template["Outputs"]["PreTrafficLogGroupName"]["Value"]),
         ("PreTrafficCheckOn", {"Ref": "PreTrafficHookLogGroup"}))
    code_dir = root / hp["CodeUri"]
    module, function = hp["Handler"].rsplit(".", 1)
    source_file = code_dir / f"{module}.py"
    c.true(f"the hook's handler {hp['Handler']} is in its CodeUri", source_file.is_file(), str(source_file))
    # SAM's python builder copies a directory without a requirements file as it is, offline.
    c.eq("the hook's CodeUri holds its code and event only (no requirements to download at build)",
         sorted(p.name for p in code_dir.iterdir() if p.name != "__pycache__"), sorted([source_file.name, "pre-traffic-event.json"]))
    c.eq("the hook sends Terraform's canned event, byte for byte",
         (code_dir / "pre-traffic-event.json").read_bytes(), (root / "terraform" / "pre-traffic-event.json").read_bytes())
    c.true("a Python runtime (its boto3 is all the hook needs)", hp["Runtime"].startswith("python3."), hp["Runtime"])
    spec = importlib.util.spec_from_file_location("pre_traffic_hook", source_file)
    hook_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook_module)
    c.true(f"{source_file.name} defines {function}", callable(getattr(hook_module, function, None)))
    hook_env = hp["Environment"]["Variables"]
    c.eq("the hook checks the version this deploy publishes, with the stack's token settings", hook_env, {
        "PODMUTATOR_VERSION_ARN": {"Ref": "Function.Version"},
        "PODMUTATOR_PATH_TOKEN_ENABLED": {"Ref": "PathTokenEnabled"},
        "PODMUTATOR_PATH_TOKEN_SECRET_ARN": {"Ref": "PathTokenSecretArn"},
    })
    source = source_file.read_text(encoding="utf-8")
    c.true("the hook reads each variable it is given", all(f'"{k}"' in source for k in hook_env))
    cfg = hook_module.CONFIG
    call = cfg.connect_timeout + cfg.read_timeout
    attempts = cfg.retries["max_attempts"]
    c.true(f"the hook's timeout ({hp['Timeout']} s) exceeds its three calls' worst case ({3 * attempts} x {call} s), so it always reports",
           hp["Timeout"] > 3 * attempts * call)
    c.true("the hook waits longer for the version than the function can run",
           cfg.read_timeout > int(template["Parameters"]["LambdaTimeoutSeconds"]["MaxValue"]))
    c.eq("the hook's log group", hp.get("LoggingConfig", {}).get("LogGroup"), {"Ref": "PreTrafficHookLogGroup"})
    for check_on, token_on, secret, refused in [
        ("true", "true", TOKEN_SECRET_ARN, []),
        ("true", "true", "", ["PreTrafficCheckNeedsTokenSecret"]),
        ("true", "false", "", []),
        ("false", "true", "", []),
        ("false", "true", TOKEN_SECRET_ARN, []),
    ]:
        ev = Evaluator(template, dict(base, PreTrafficCheck=check_on, PathTokenEnabled=token_on, PathTokenSecretArn=secret))
        tag = f"[check={check_on}, token={token_on}, secret={'set' if secret else 'empty'}]"
        c.eq(f"{tag} rules refused", failed_rules(template, ev), refused)
        if refused:
            continue
        c.eq(f"{tag} the pre-traffic hook", ev.value(pref["Hooks"]), {"PreTraffic": "<PreTrafficHook>"} if check_on == "true" else {})
        deploy_role = ev.value(r["CodeDeployRole"]["Properties"])
        c.eq(f"{tag} CodeDeploy's role is assumed by CodeDeploy of this account", deploy_role["AssumeRolePolicyDocument"]["Statement"], [{
            "Effect": "Allow", "Principal": {"Service": "codedeploy.amazonaws.com"}, "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": PSEUDO["AWS::AccountId"]}}}])
        deploy_stmts = {s["Sid"]: s for p in deploy_role["Policies"] for s in p["PolicyDocument"]["Statement"]}
        c.eq(f"{tag} CodeDeploy moves this function's live alias only", (sorted(deploy_stmts["MoveTheLiveAlias"]["Action"]), deploy_stmts["MoveTheLiveAlias"]["Resource"]),
             (["lambda:GetAlias", "lambda:GetProvisionedConcurrencyConfig", "lambda:UpdateAlias"], ["<Function>", "<Function.Arn>:live"]))
        c.eq(f"{tag} CodeDeploy's statements", sorted(deploy_stmts), ["MoveTheLiveAlias"] + (["RunThePreTrafficHook"] if check_on == "true" else []))
        if check_on != "true":
            c.true(f"{tag} no hook", not ev.exists("PreTrafficHook"))
            continue
        name = ev.value(hp["FunctionName"])
        c.true(f"{tag} the hook's name ({name}) is this stack's and fits Lambda's 64 characters",
               re.fullmatch(r"podmutator-pre-traffic-[0-9a-f]{8}", name) is not None and len(name) <= 64, name)
        c.eq(f"{tag} CodeDeploy invokes this stack's hook only", (deploy_stmts["RunThePreTrafficHook"]["Action"], deploy_stmts["RunThePreTrafficHook"]["Resource"]),
             ("lambda:InvokeFunction", f"arn:aws:lambda:eu-west-1:123456789012:function:{name}"))
        hook_role = ev.value(r["PreTrafficHookRole"]["Properties"])
        c.eq(f"{tag} the hook's role is assumed by Lambda of this account", hook_role["AssumeRolePolicyDocument"]["Statement"], [{
            "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": PSEUDO["AWS::AccountId"]}}}])
        stmts = [s for p in hook_role["Policies"] for s in p["PolicyDocument"]["Statement"]]
        got = {s["Sid"]: (s["Action"], s["Resource"]) for s in stmts}
        want = {
            "WriteOwnLogs": (["logs:CreateLogStream", "logs:PutLogEvents"], "<PreTrafficHookLogGroup>"),
            "InvokeTheFunctionsVersions": ("lambda:InvokeFunction", "<Function.Arn>:*"),
            "ReportToThisDeploymentGroup": (
                "codedeploy:PutLifecycleEventHookExecutionStatus",
                "arn:aws:codedeploy:eu-west-1:123456789012:deploymentgroup:<ServerlessDeploymentApplication>/<FunctionDeploymentGroup>",
            ),
        }
        if token_on == "true":
            want["ReadThePathToken"] = ("secretsmanager:GetSecretValue", TOKEN_SECRET_ARN)
        c.eq(f"{tag} the hook invokes the function's versions, reads the token's secret (with the token on) and reports to this deployment group, nothing else", got, want)
        c.true(f"{tag} every hook statement allows", all(s["Effect"] == "Allow" and not s.get("Condition") for s in stmts))

    # --- docs/deploy.md documents every parameter and output -------------------------------
    docs = (root / "docs" / "deploy.md").read_text(encoding="utf-8")
    for name in list(template["Parameters"]) + list(template["Outputs"]):
        c.true(f"docs/deploy.md documents {name}", f"`{name}`" in docs)
    with open(sys.argv[4], "w", encoding="utf-8") as f:
        json.dump(rendered, f)
    c.finish()


if __name__ == "__main__":
    main()
