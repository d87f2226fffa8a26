"""moto's server on 127.0.0.1 for tests/terraform_apply.rs, with the stubs moto needs here.

Usage: python moto_server.py

It listens on a port of 127.0.0.1 the system picks, and prints that port, alone on the first
line of its standard output, once it accepts connections: a test reads the line rather than
probing a port chosen beforehand, which another process may have taken meanwhile.

Stubs, and only these: moto's API Gateway v2 domain names come back without three attributes
that the real service fills in and the Terraform AWS provider reads:
  - domainNameConfigurations[].domainNameStatus: the provider waits for AVAILABLE after
    CreateDomainName;
  - domainNameConfigurations[].apiGatewayDomainName and .hostedZoneId: the alias target of the
    endpoint's Route 53 record (outputs dns_target_name / dns_target_zone_id).
They are filled in when absent. moto also returns "mutualTlsAuthentication": {} for a domain
created without it, where the service omits the key; the provider then plans to remove an empty
block on every run, so the empty object is dropped.
And moto's security group rules report a description only for CIDR rules; a rule that
references a group loses it, and the provider then plans to set it again on every run. The
description of the referenced-group pair is reported.
And moto's EKS clusters echo resourcesVpcConfig as sent: the service adds the VPC ID and the
cluster security group it creates, which modules/eks-network reads. The VPC is taken from the
first subnet and a cluster security group is created in it, as EKS does. And UpdateClusterConfig
replaces the whole resourcesVpcConfig in moto, where EKS replaces only the fields it names
(docs/deploy.md adds the control plane's security group with it): merged here.
And moto's Lambda functions drop LoggingConfig (log format, log group, levels): GetFunction
returns none, so every plan would show the module's logging_config as a change. It is kept from
CreateFunction / UpdateFunctionConfiguration and returned.
And moto evaluates S3 bucket policies without the request's context (aws:SecureTransport and
the like are never supplied) and answers a statement with a Condition on such a key with a
denial: the examples/backend-s3 bucket's "deny plain HTTP" statement would deny every request
(which, against AWS, all use TLS). A statement with a Condition evaluated without context is
neutral here, as it is in AWS for the tests' requests.
And moto refuses to create a Route 53 record set identical to one created and deleted before
(a reinstall's alias record) whenever another record follows it in the zone: its existence
check lists the zone from that name on rather than looking for the name. The check here looks
for the name and type.
And moto runs a function's code in Docker, which is not here: Invoke runs the zip's `bootstrap`
as a program instead, as Lambda does: with the function's environment (its variables, and
Lambda's own: AWS_LAMBDA_RUNTIME_API, the function's name, version and memory, the region,
credentials of the role, AWS_ENDPOINT_URL at this server), and a Runtime API on 127.0.0.1 that
hands it the event once and takes its answer (or its error). A zip holding podmutator's binary
(or a script that execs it) answers through that API as it does in Lambda. The event is also on
the program's standard input: a shell script that answers on its standard output is the
function's answer when it posts none. A non-zero exit before an answer is Lambda's
Runtime.ExitError.
And moto has no ECR pull-through cache rules: CreatePullThroughCacheRule,
DescribePullThroughCacheRules and DeletePullThroughCacheRule keep them in memory, by account,
region and repository prefix, with the service's errors for a prefix taken or unknown.
And moto has no Lambda GetAccountSettings (docs/scale.md's alarm reads the account's concurrency
limit from it): it answers with a new account's limits, 1,000 concurrent executions, less what
the account's functions reserve.
And moto keeps a stack's termination protection but has no UpdateTerminationProtection and
deletes a protected stack: the call sets it, and DeleteStack refuses a protected stack with the
service's ValidationError (docs/deploy.md protects the SAM stack this way).
Everything else is moto as released.
"""

import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

from moto.apigatewayv2 import models as apigwv2

# API Gateway's regional hosted zone in us-east-1 (the region the tests use).
REGIONAL_ZONE = "Z1UJRXOUMOOFQ8"


def _with_stubs(to_json):
    def wrapper(self, *args, **kwargs):
        d = to_json(self, *args, **kwargs)
        suffix = hashlib.sha256(self.domain_name.encode()).hexdigest()[:10]
        for c in d.get("domainNameConfigurations") or []:
            c.setdefault("domainNameStatus", "AVAILABLE")
            c.setdefault("apiGatewayDomainName", f"d-{suffix}.execute-api.us-east-1.amazonaws.com")
            c.setdefault("hostedZoneId", REGIONAL_ZONE)
        if not d.get("mutualTlsAuthentication"):
            d.pop("mutualTlsAuthentication", None)
        return d

    return wrapper


apigwv2.DomainName.to_json = _with_stubs(apigwv2.DomainName.to_json)

from moto.awslambda import models as awslambda  # noqa: E402

_init = awslambda.LambdaFunction.__init__
_get_configuration = awslambda.LambdaFunction.get_configuration
_update_configuration = awslambda.LambdaFunction.update_configuration


def _init_keeping_logging(self, account_id, spec, *args, **kwargs):
    _init(self, account_id, spec, *args, **kwargs)
    self._stub_logging_config = spec.get("LoggingConfig")


def _configuration_with_logging(self, *args, **kwargs):
    config = _get_configuration(self, *args, **kwargs)
    if getattr(self, "_stub_logging_config", None):
        config.setdefault("LoggingConfig", self._stub_logging_config)
    return config


def _update_keeping_logging(self, updates):
    if "LoggingConfig" in updates:
        self._stub_logging_config = updates["LoggingConfig"]
    return _update_configuration(self, updates)


class _RuntimeApi(http.server.BaseHTTPRequestHandler):
    """Lambda's Runtime API for one invocation: `next` hands out the event once (a second
    `next`, the runtime's wait for more work, waits until the invocation ends); the answer, the
    invocation's error or an init error is kept in `self.server.answer`."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        if not self.path.endswith("/runtime/invocation/next"):
            self.send_error(404)
            return
        with srv.lock:
            first, srv.handed_out = not srv.handed_out, True
        if not first:
            srv.ended.wait()
            self.send_error(410)
            return
        body = srv.event.encode()
        self.send_response(200)
        for name, value in [
            ("Lambda-Runtime-Aws-Request-Id", "moto-invocation"),
            ("Lambda-Runtime-Deadline-Ms", str(int((time.time() + srv.timeout) * 1000))),
            ("Lambda-Runtime-Invoked-Function-Arn", srv.arn),
            ("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Sampled=0"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ]:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        kind = "response" if self.path.endswith("/response") else "error"
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.answer = (kind, body, self.headers.get("Lambda-Runtime-Function-Error-Type"))
        self.server.answered.set()


def _run_bootstrap(self, event=None):
    event = event if isinstance(event, str) else json.dumps(event or {})
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RuntimeApi)
    api.daemon_threads = True
    # A runtime stopped while it waits for more work leaves a broken pipe: not worth a trace.
    api.handle_error = lambda *args: None
    api.event, api.timeout, api.arn = event, self.timeout, self.function_arn
    api.lock, api.handed_out, api.answer = threading.Lock(), False, None
    api.answered, api.ended = threading.Event(), threading.Event()
    threading.Thread(target=api.serve_forever, daemon=True).start()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **{k: str(v) for k, v in (self.environment_vars or {}).items()},
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{api.server_port}",
        "AWS_LAMBDA_FUNCTION_NAME": self.function_name,
        "AWS_LAMBDA_FUNCTION_VERSION": str(self.version),
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_size),
        "AWS_REGION": self.region,
        "AWS_DEFAULT_REGION": self.region,
        "AWS_ACCESS_KEY_ID": "role-account-id",
        "AWS_SECRET_ACCESS_KEY": "role-secret-key",
        "AWS_SESSION_TOKEN": "session-token",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{os.environ['MOTO_PORT']}",
    }
    with tempfile.TemporaryDirectory() as d:
        with zipfile.ZipFile(io.BytesIO(self.code_bytes)) as z:
            z.extractall(d)
        bootstrap = os.path.join(d, "bootstrap")
        os.chmod(bootstrap, 0o755)
        proc = subprocess.Popen([bootstrap], cwd=d, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = {}

        def run():
            out["stdout"], out["stderr"] = proc.communicate(event.encode())
            api.answered.set()

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        # Until the runtime answers or exits, whichever comes first; then it is stopped, as
        # Lambda freezes it.
        api.answered.wait()
        if api.answer is not None and proc.poll() is None:
            proc.kill()
        runner.join()
        api.ended.set()
        api.shutdown()
        api.server_close()
    logs = out["stderr"].decode(errors="replace")
    if api.answer is not None:
        kind, body, _ = api.answer
        return body, kind == "error", logs
    if proc.returncode != 0:
        # What Lambda answers for a runtime that exits before it answers.
        error = {"errorType": "Runtime.ExitError", "errorMessage": f"Runtime exited with error: exit status {proc.returncode}"}
        return json.dumps(error), True, logs
    return out["stdout"].decode(), False, logs


awslambda.LambdaFunction._invoke_lambda = _run_bootstrap
awslambda.LambdaFunction.__init__ = _init_keeping_logging
awslambda.LambdaFunction.get_configuration = _configuration_with_logging
awslambda.LambdaFunction.update_configuration = _update_keeping_logging

from moto.ec2.models import security_groups as ec2_sg  # noqa: E402


def _rule_description(self):
    return self.ip_range.get("Description") or (self.source_group or {}).get("Description")


ec2_sg.SecurityGroupRule.description = property(_rule_description)

from moto.ec2.models import ec2_backends  # noqa: E402
from moto.eks import models as eks  # noqa: E402

_cluster_init = eks.Cluster.__init__


def _cluster_with_vpc(self, name, role_arn, resources_vpc_config, account_id, region_name, *args, **kwargs):
    _cluster_init(self, name, role_arn, resources_vpc_config, account_id, region_name, *args, **kwargs)
    cfg = self.resources_vpc_config
    subnets = cfg.get("subnetIds") or []
    if subnets and "vpcId" not in cfg:
        ec2 = ec2_backends[account_id][region_name]
        vpc_id = ec2.get_subnet(subnets[0]).vpc_id
        sg = ec2.create_security_group(f"eks-cluster-sg-{name}", "EKS created security group", vpc_id=vpc_id)
        cfg["vpcId"] = vpc_id
        cfg["clusterSecurityGroupId"] = sg.id


eks.Cluster.__init__ = _cluster_with_vpc

_update_cluster_config = eks.EKSBackend.update_cluster_config


def _update_cluster_config_merged(self, name, resources_vpc_config, *args, **kwargs):
    # EKS replaces only the fields an UpdateClusterConfig names (docs/deploy.md adds a security
    # group this way); moto replaces the whole resourcesVpcConfig, losing the subnets and VPC.
    cluster = self.clusters.get(name)
    if cluster and resources_vpc_config:
        resources_vpc_config = {**cluster.resources_vpc_config, **resources_vpc_config}
    return _update_cluster_config(self, name, resources_vpc_config, *args, **kwargs)


eks.EKSBackend.update_cluster_config = _update_cluster_config_merged

from moto.iam import access_control  # noqa: E402

_statement_permits = access_control.IAMPolicyStatement.is_action_permitted


def _condition_without_context_is_neutral(self, action, resource="*", principal=None, incoming_condition_values=None):
    if self._statement.get("Condition") and not incoming_condition_values:
        return access_control.PermissionResult.NEUTRAL
    return _statement_permits(self, action, resource, principal, incoming_condition_values)


access_control.IAMPolicyStatement.is_action_permitted = _condition_without_context_is_neutral

from moto.route53 import models as route53  # noqa: E402

_change_record_sets = route53.Route53Backend.change_resource_record_sets


def _recreate_after_delete(self, zoneid, change_list):
    zone = self.get_hosted_zone(zoneid)
    for value in change_list:
        if value["Action"] == "CREATE" and value in zone.rr_changes:
            rrset = value["ResourceRecordSet"]
            name = rrset["Name"].rstrip(".") + "."
            if any(r.name == name and r.type == rrset["Type"] for r in zone.rrsets):
                raise route53.ResourceRecordAlreadyExists(name=name, _type=rrset["Type"])
            # Out of the journal, so that moto's own check does not run; the create goes back in.
            while value in zone.rr_changes:
                zone.rr_changes.remove(value)
    return _change_record_sets(self, zoneid, change_list)


route53.Route53Backend.change_resource_record_sets = _recreate_after_delete

from datetime import datetime, timezone  # noqa: E402

from moto.core.exceptions import ServiceException  # noqa: E402
from moto.core.responses import ActionResult  # noqa: E402
from moto.ecr.responses import ECRResponse  # noqa: E402

# ECR pull-through cache rules, by (account, region) and repository prefix.
_pull_through_rules = {}


class _RuleNotFound(ServiceException):
    code = "PullThroughCacheRuleNotFoundException"


class _RuleExists(ServiceException):
    code = "PullThroughCacheRuleAlreadyExistsException"


def _rules(self):
    return _pull_through_rules.setdefault((self.current_account, self.region), {})


def _create_pull_through_cache_rule(self):
    prefix = self._get_param("ecrRepositoryPrefix")
    if prefix in _rules(self):
        raise _RuleExists(f"A pull through cache rule with prefix '{prefix}' already exists in the registry with id '{self.current_account}'")
    rule = {"ecrRepositoryPrefix": prefix, "upstreamRegistryUrl": self._get_param("upstreamRegistryUrl"),
            "createdAt": datetime.now(timezone.utc), "registryId": self.current_account}
    for key in ("credentialArn", "customRoleArn", "upstreamRepositoryPrefix"):
        if self._get_param(key):
            rule[key] = self._get_param(key)
    _rules(self)[prefix] = rule
    return ActionResult(rule)


def _describe_pull_through_cache_rules(self):
    prefixes = self._get_param("ecrRepositoryPrefixes")
    rules = _rules(self)
    missing = [p for p in prefixes or [] if p not in rules]
    if missing:
        raise _RuleNotFound(f"The pull through cache rule with prefix '{missing[0]}' does not exist in the registry with id '{self.current_account}'")
    return ActionResult({"pullThroughCacheRules": [r for p, r in rules.items() if not prefixes or p in prefixes]})


def _delete_pull_through_cache_rule(self):
    prefix = self._get_param("ecrRepositoryPrefix")
    rule = _rules(self).pop(prefix, None)
    if rule is None:
        raise _RuleNotFound(f"The pull through cache rule with prefix '{prefix}' does not exist in the registry with id '{self.current_account}'")
    return ActionResult(rule)


ECRResponse.create_pull_through_cache_rule = _create_pull_through_cache_rule
ECRResponse.describe_pull_through_cache_rules = _describe_pull_through_cache_rules
ECRResponse.delete_pull_through_cache_rule = _delete_pull_through_cache_rule


def _account_settings(request, full_url, headers):
    import re

    from moto.awslambda.models import lambda_backends
    from moto.core import DEFAULT_ACCOUNT_ID

    # The region of the request's signature (Credential=KEY/DATE/REGION/lambda/aws4_request).
    region = re.search(r"Credential=[^/]+/[^/]+/([^/]+)/", headers.get("Authorization", "")).group(1)
    reserved = sum(f.reserved_concurrency or 0
                   for f in lambda_backends[DEFAULT_ACCOUNT_ID][region].list_functions())
    return 200, {}, json.dumps({
        "AccountLimit": {"TotalCodeSize": 80530636800, "CodeSizeUnzipped": 262144000, "CodeSizeZipped": 52428800,
                         "ConcurrentExecutions": 1000, "UnreservedConcurrentExecutions": 1000 - reserved},
        "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0},
    })


from moto.awslambda import urls as _lambda_urls  # noqa: E402

_lambda_urls.url_paths[r"{0}/(?P<api_version>[^/]+)/account-settings/?$"] = _account_settings

from moto.cloudformation import models as _cfn  # noqa: E402
from moto.cloudformation import responses as _cfn_responses  # noqa: E402
from moto.cloudformation.exceptions import ValidationError as _CfnValidationError  # noqa: E402
from moto.core.responses import ActionResult  # noqa: E402


def _update_termination_protection(self):
    stack = self.cloudformation_backend.get_stack(self._get_param("StackName"))
    stack.enable_termination_protection = str(self._get_param("EnableTerminationProtection")).lower() == "true"
    return ActionResult({"StackId": stack.stack_id})


_cfn_responses.CloudFormationResponse.update_termination_protection = _update_termination_protection
_delete_stack = _cfn.CloudFormationBackend.delete_stack


def _delete_stack_unless_protected(self, name_or_stack_id):
    for stack in self.stacks.values():
        if name_or_stack_id in (stack.stack_id, stack.name) and stack.enable_termination_protection:
            raise _CfnValidationError(
                message=f"Stack [{stack.name}] cannot be deleted while TerminationProtection is enabled")
    return _delete_stack(self, name_or_stack_id)


_cfn.CloudFormationBackend.delete_stack = _delete_stack_unless_protected

from werkzeug.serving import make_server  # noqa: E402

from moto.moto_server.werkzeug_app import (  # noqa: E402
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)

# What moto's own `moto_server` runs, on a listening socket made before the port is announced.
app = DomainDispatcherApplication(create_backend_app)
app.debug = True
server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
os.environ["MOTO_PORT"] = str(server.port)
print(server.port, flush=True)
# Nothing more on that pipe: the test stops reading after the port.
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)
sys.stdout = open(1, "w")
server.serve_forever()
