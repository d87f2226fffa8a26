"""Reads every SAM command of docs/deploy.md as SAM CLI reads it, and checks what it would deploy.

Usage: python check_sam_runbook.py REPO_ROOT WORK_DIR STEPS_OUT_JSON

The commands are taken from the document itself: every `sam ...` command of its ```sh blocks
(continued lines joined) and inline code, and every inline `Name=value ...` span (a parameter
override written in the prose). Placeholders such as `<hex>` become the example values of
PLACEHOLDERS (an unknown one is an error), and a command may hold no shell expansion, so that what
is read here is what a shell would pass. Each command is then parsed by SAM CLI's own click
command, in WORK_DIR, which holds the repository's samconfig.toml and template.yaml where
`sam build` puts it (target/sam/build/template.yaml, samconfig.toml's template_file):

- nothing may be dropped: every `Name=` word after `--parameter-overrides` must come out of SAM's
  parser (CfnParameterOverridesType) with a value (it refuses `Name=` as its own argument, drops
  it inside a quoted string, and keeps only the last of two `--parameter-overrides`);
- each name is a template parameter and each value fits its AllowedPattern, AllowedValues,
  lengths and bounds.

Each `sam deploy` then goes through SAM CLI's own code to the change set it would create
(DeployContext.merge_parameters, Deployer.create_changeset) against a stand-in CloudFormation
client that resolves the parameters as CloudFormation does (a value, UsePreviousValue, or the
template's default), and the stack's Rules and the function's PODMUTATOR_CONFIG are evaluated
with tests/iac/check_sam.py's evaluator:

- every deploy of "Path B: SAM" is a first deploy: not guided, every parameter without a
  default given, every Rule holding, the token's hash in the function's config;
- that first deploy with --guided, answered as docs/deploy.md says (Enter, the hash, `none`),
  deploys the same stack, and its PreviousPathTokenSha256 prompt refuses an empty answer;
- the deploys of every other section run in order on the installed ALB stack: the rotation's
  first leaves the function with [new hash, the hash deployed before] and its last with the new
  one alone; the removal's lifts the ALB's deletion protection and changes nothing else;
- each of those deploys that changes the function's configuration publishes a version for the
  `live` alias to move to, as SAM's own translator (samtranslator) writes the stack: a new
  Version resource, or a new description of it, which CloudFormation can only replace. SAM names
  the version after the code and the template's text, not after the parameters' values, so
  without that a rotation would leave `live` on the version holding the old hash alone; a change
  of another parameter publishes one only with a new ConfigRevision, as the document says;
- the reinstall (Path B's first deploy again, with the override the removal section writes)
  names nothing the deleted stack retained (its cache rules; its log groups have names
  CloudFormation generates) and rewrites images as the deleted stack did.

Every step is written to STEPS_OUT_JSON (section, line, command, resolved parameters, config; and
for a first deploy the stack's Outputs), for tests/iac.rs to start the function's `check-config` on
each config and to run the registration step on a first deploy's outputs. Run by tests/iac.rs with the
python of .venv (scripts/tools.sh path python), which has SAM CLI and cfn-lint.
"""

import copy
import json
import os
import pathlib
import re
import shlex
import shutil
import sys

import botocore.exceptions
import click
from click.testing import CliRunner
from samcli.cli.main import cli as sam_cli
from samcli.commands._utils.template import get_template_parameters
from samcli.commands.deploy.deploy_context import DeployContext
from samcli.commands.deploy.guided_context import GuidedContext
from samcli.commands.deploy.utils import sanitize_parameter_overrides
from samcli.lib.deploy.deployer import Deployer
from samcli.yamlhelper import yaml_parse
from samtranslator.translator.transform import transform as sam_transform

from cfnlint.decode import decode_str

from check_sam import IMAGES_VARIANTS, Evaluator, failed_rules
from common import Checks

HASH = "0123456789abcdef" * 4
NEW_HASH = "fedcba9876543210" * 4
ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:podmutator-path-token-AbCdEf"
NEW_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:podmutator-path-token-GhIjKl"
# What the reader puts in place of each placeholder of docs/deploy.md. The rotation starts from
# the first deploy, so the hash deployed so far is the first deploy's.
PLACEHOLDERS = {
    "<hex>": HASH,
    "<arn>": ARN,
    "<new hash>": NEW_HASH,
    "<new arn>": NEW_ARN,
    "<the hash deployed so far>": HASH,
    "<the podmutator image by digest>": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/podmutator@sha256:" + "0" * 64,
    "<a new revision>": "2026-12-06",
}
STACK_NAME = "podmutator"
INSTALL_SECTION = "Path B: SAM"
ROTATION_SECTION = "Rotating the path token"
REMOVAL_SECTION = "Removal and reinstall"
# An inline span of parameter overrides: every word `Name=value`, Name a CloudFormation
# parameter's (CamelCase) name.
OVERRIDE_WORD = re.compile(r"^[A-Z][a-z][A-Za-z0-9]*=")


def documented_commands(doc):
    """(section, line, kind, text) for every SAM command and override span of the document; kind
    is "command" (a `sam ...` command) or "overrides" (an inline `Name=value ...` span)."""
    out = []
    section = None
    lines = doc.splitlines()
    prose = []  # (line number, text) of the current paragraph

    def flush():
        text = " ".join(t for _, t in prose)
        first = prose[0][0] if prose else 0
        for m in re.finditer(r"`([^`]+)`", text):
            span = " ".join(m.group(1).split())
            if span.startswith("sam "):
                out.append((section, first, "command", span))
            elif OVERRIDE_WORD.match(span):
                out.append((section, first, "overrides", span))
        prose.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            flush()
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                stripped = lines[i].strip()
                if stripped.startswith("sam "):
                    start = i + 1
                    text = stripped
                    while text.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        text = text[:-1] + " " + lines[i].strip()
                    out.append((section, start, "command", text))
                i += 1
            i += 1
            continue
        m = re.match(r"^(#{2,6}) (.*)$", line)
        if m:
            flush()
            if len(m.group(1)) == 2:
                section = m.group(2).strip()
        elif not line.strip():
            flush()
        else:
            prose.append((i + 1, line))
        i += 1
    flush()
    return out


def fill(text, c, where):
    """The text with its placeholders replaced; an unknown placeholder or a shell expansion is a
    finding (the test would not read what a shell passes)."""
    for k, v in PLACEHOLDERS.items():
        text = text.replace(k, v)
    left = re.findall(r"<[^<>]*>", text)
    c.eq(f"{where}: every placeholder is one the test knows (PLACEHOLDERS)", left, [])
    c.true(f"{where}: no shell expansion in a SAM command", "$" not in text and "`" not in text, text)
    return text


def override_keys(args):
    """The names each `Name=...` word after --parameter-overrides gives, read independently of
    SAM's parser: a quoted argument holding several overrides is split on whitespace."""
    keys = []
    taking = False
    for a in args:
        if a.startswith("--"):
            taking = a == "--parameter-overrides"
            continue
        if taking:
            for word in a.split():
                m = re.match(r"^([^=\s]+)=", word)
                keys.append(m.group(1) if m else word)
    return keys


def parse(args):
    """SAM CLI's own reading of `sam <args>`: its click command, options from samconfig.toml
    (in the working directory) included. Returns (command name, click context) or raises
    click's error."""
    top = sam_cli.make_context("sam", list(args), resilient_parsing=False)
    name, cmd, rest = sam_cli.resolve_command(top, list(top.protected_args) + list(top.args))
    return name, cmd.make_context(name, rest, parent=top)


def constraint_problems(name, value, p):
    """Why CloudFormation would refuse `value` for parameter `p` (empty when it accepts it)."""
    out = []
    t = p["Type"]
    if not isinstance(value, str):
        return [f"{name}: not a string: {value!r}"]
    if t == "Number":
        try:
            n = float(value)
        except ValueError:
            return [f"{name}={value!r} is not a number"]
        if "MinValue" in p and n < float(p["MinValue"]):
            out.append(f"{name}={value} is below MinValue {p['MinValue']}")
        if "MaxValue" in p and n > float(p["MaxValue"]):
            out.append(f"{name}={value} is above MaxValue {p['MaxValue']}")
        if "AllowedValues" in p and n not in [float(x) for x in p["AllowedValues"]]:
            out.append(f"{name}={value} is not in AllowedValues {p['AllowedValues']}")
    elif t == "CommaDelimitedList":
        if "AllowedValues" in p:
            for item in [s.strip() for s in value.split(",")]:
                if item not in [str(x) for x in p["AllowedValues"]]:
                    out.append(f"{name}: {item!r} is not in AllowedValues {p['AllowedValues']}")
    elif t == "String":
        if "AllowedValues" in p and value not in [str(x) for x in p["AllowedValues"]]:
            out.append(f"{name}={value!r} is not in AllowedValues {p['AllowedValues']}")
        if "AllowedPattern" in p and re.fullmatch(p["AllowedPattern"], value) is None:
            out.append(f"{name}={value!r} does not match AllowedPattern {p['AllowedPattern']}")
        if "MaxLength" in p and len(value) > int(p["MaxLength"]):
            out.append(f"{name}={value!r} is longer than MaxLength {p['MaxLength']}")
        if "MinLength" in p and len(value) < int(p["MinLength"]):
            out.append(f"{name}={value!r} is shorter than MinLength {p['MinLength']}")
    else:
        out.append(f"{name}: parameter type {t} is not checked here")
    return out


class FakeCloudFormation:
    """The CloudFormation client SAM CLI's Deployer calls: a stack that exists (with its
    parameters' names) or not; the change set SAM would create is recorded, not created."""

    def __init__(self, parameters):
        self.parameters = parameters
        self.change_set = None

    def describe_stacks(self, StackName):
        if self.parameters is None:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "ValidationError", "Message": f"Stack with id {StackName} does not exist"}},
                "DescribeStacks",
            )
        return {"Stacks": [{"StackName": StackName, "StackStatus": "UPDATE_COMPLETE"}]}

    def get_template_summary(self, StackName):
        return {"Parameters": [{"ParameterKey": k} for k in self.parameters]}

    def create_change_set(self, **kwargs):
        self.change_set = kwargs
        return {"Id": "arn:aws:cloudformation:eu-west-1:123456789012:changeSet/samcli-deploy/0", "StackId": STACK_NAME}


def change_set(template_text, template_dict, overrides, stack):
    """The change set `sam deploy` creates with these overrides on `stack` (None: no stack yet),
    through SAM CLI's own code: (ChangeSetType, Parameters)."""
    parameters = DeployContext.merge_parameters(template_dict, overrides)
    client = FakeCloudFormation(stack)
    Deployer(client).create_changeset(
        stack_name=STACK_NAME,
        cfn_template=template_text,
        parameter_values=parameters,
        capabilities=["CAPABILITY_IAM"],
        role_arn=None,
        notification_arns=None,
        s3_uploader=None,
        tags=[],
    )
    return client.change_set["ChangeSetType"], client.change_set["Parameters"]


def resolve(template, sent, stack, c, where):
    """The stack's parameter values once CloudFormation applies the change set's Parameters: a
    value, the previous one (UsePreviousValue), or the template's default."""
    params = template["Parameters"]
    given = {}
    for s in sent:
        c.true(f"{where}: {s['ParameterKey']} is a template parameter", s["ParameterKey"] in params)
        c.true(f"{where}: {s['ParameterKey']} sent once", s["ParameterKey"] not in given)
        given[s["ParameterKey"]] = s
    values = {}
    for name, p in params.items():
        s = given.get(name, {})
        if "ParameterValue" in s:
            values[name] = s["ParameterValue"]
        elif s.get("UsePreviousValue"):
            c.true(f"{where}: {name} has a previous value to keep", stack is not None and name in stack)
            values[name] = (stack or {}).get(name, "")
        elif "Default" in p:
            values[name] = str(p["Default"])
        else:
            c.true(f"{where}: the required parameter {name} is given (it has no default)", False)
            values[name] = ""
    for name, value in values.items():
        for problem in constraint_problems(name, value, params[name]):
            c.true(f"{where}: CloudFormation accepts every value", False, problem)
    return values


def typed(template, values):
    """The stack's values as check_sam's Evaluator takes them (lists and numbers typed)."""
    out = {}
    for name, v in values.items():
        t = template["Parameters"][name]["Type"]
        if t == "CommaDelimitedList":
            out[name] = [s.strip() for s in v.split(",")] if v != "" else []
        elif t == "Number":
            out[name] = int(v)
        else:
            out[name] = v
    return out


def rendered(template, values):
    ev = Evaluator(template, typed(template, values))
    config = function_config(template, ev)
    attrs = {}
    if ev.exists("LoadBalancer"):
        attrs = {a["Key"]: a["Value"] for a in ev.value(template["Resources"]["LoadBalancer"]["Properties"]["LoadBalancerAttributes"])}
    return failed_rules(template, ev), config, attrs


def outputs(template, values):
    """The stack's Outputs for `values`, as describe-stacks lists them (an output whose
    Condition does not hold is not there; a resource's attribute is a placeholder)."""
    ev = Evaluator(template, typed(template, values))
    return {name: ev.value(o["Value"]) for name, o in template["Outputs"].items()
            if "Condition" not in o or ev.condition(o["Condition"])}


# The property that names a resource of each type the template retains; without it
# CloudFormation generates a name, which no later stack repeats.
NAME_PROPERTY = {
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::ECR::PullThroughCacheRule": "EcrRepositoryPrefix",
}


def named(template, ev, retained=False):
    """(type, name) of each resource the stack names itself (retained: only those it keeps
    when deleted). A retained resource of a type NAME_PROPERTY does not list is an error."""
    out = set()
    for k, r in template["Resources"].items():
        if retained and r.get("DeletionPolicy") != "Retain":
            continue
        if retained and r["Type"] not in NAME_PROPERTY:
            raise SystemExit(f"{k}: a retained {r['Type']}: add the property that names it to NAME_PROPERTY")
        prop = NAME_PROPERTY.get(r["Type"])
        if prop and ev.exists(k) and prop in r.get("Properties", {}):
            out.add((r["Type"], ev.value(r["Properties"][prop])))
    return out


def function_config(template, ev):
    return json.loads(ev.value(template["Resources"]["Function"]["Properties"]["Environment"]["Variables"]["PODMUTATOR_CONFIG"]))


class NoPolicyTemplates:
    """SAM's policy-template loader, for a template that uses none."""

    def load(self):
        return {}


def published_version(template_dict, template, values):
    """The version a deploy with `values` moves the `live` alias to, as SAM's own translator
    writes the stack (the code the same throughout): its Version resource's logical id and
    description. CloudFormation publishes a version when either changes: a new logical id is a
    new resource, and a version's Description can only be replaced."""
    t = copy.deepcopy(template_dict)
    for k, r in t["Resources"].items():
        if r["Type"] == "AWS::Serverless::Function":
            r["Properties"]["CodeUri"] = f"s3://artefacts/{k}.zip"
    out = sam_transform(t, values, NoPolicyTemplates())["Resources"]
    version = out["FunctionAliaslive"]["Properties"]["FunctionVersion"]["Fn::GetAtt"][0]
    description = out[version]["Properties"].get("Description")
    return version, Evaluator(template, typed(template, values)).value(description)


def guided_answers(params, overrides):
    """What docs/deploy.md tells the reader to answer `--guided`'s prompts: Enter (the command
    line's value or the template's default), except the NoEcho hashes, which SAM asks for with
    no default whatever the command line says: the hash for PathTokenSha256, and `none` for
    PreviousPathTokenSha256, first tried empty (which must be refused)."""
    answers = []
    for name, p in params.items():
        if not p.get("NoEcho"):
            answers.append("")
        elif name == "PreviousPathTokenSha256":
            answers += ["", "none"]
        else:
            answers.append(overrides.get(name, ""))
    return answers


def main():
    root = pathlib.Path(sys.argv[1])
    work = pathlib.Path(sys.argv[2])
    c = Checks("docs/deploy.md's SAM commands")

    # Where `sam build` leaves the template, as samconfig.toml's deploy section names it.
    built = work / "target" / "sam" / "build" / "template.yaml"
    built.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "template.yaml", built)
    shutil.copy(root / "template.yaml", work / "template.yaml")
    shutil.copy(root / "samconfig.toml", work / "samconfig.toml")
    os.chdir(work)
    # SAM's translator reads the region (for ARNs' partition) from boto3's session.
    os.environ.setdefault("AWS_DEFAULT_REGION", "eu-west-1")
    template_text = built.read_text(encoding="utf-8")
    template_dict = yaml_parse(template_text)
    template, matches = decode_str(template_text)
    c.eq("template decodes", [str(m) for m in matches], [])
    params = template["Parameters"]

    doc = (root / "docs" / "deploy.md").read_text(encoding="utf-8")
    found = documented_commands(doc)
    steps = []
    install = None  # the first ALB deploy's stack
    sequences = {}  # section -> [(line, command, args, overrides)]
    first_deploys = []
    reinstall = []  # the reinstall's overrides, written inline in the removal section

    for section, line, kind, text in found:
        where = f"docs/deploy.md:{line} ({section})"
        text = fill(text, c, where)
        args = shlex.split(text, comments=True)
        if kind == "overrides":
            args = ["sam", "deploy", "--parameter-overrides", *args]
        c.eq(f"{where}: a sam command", args[:1], ["sam"])
        try:
            name, ctx = parse(args[1:])
        except click.exceptions.ClickException as e:
            c.true(f"{where}: SAM CLI reads `{text}`", False, e.format_message())
            continue
        if name != "deploy":
            continue
        overrides = dict(ctx.params.get("parameter_overrides") or {})
        c.eq(f"{where}: SAM CLI reads every override written (none dropped)", sorted(overrides), sorted(override_keys(args[2:])))
        c.eq(f"{where}: each override written once", len(overrides), len(override_keys(args[2:])))
        for k, v in overrides.items():
            c.true(f"{where}: {k} is a template parameter", k in params)
            c.true(f"{where}: {k} has a value (SAM CLI cannot send an empty one)", v != "")
            if k in params:
                for problem in constraint_problems(k, v, params[k]):
                    c.true(f"{where}: CloudFormation accepts {k}", False, problem)
        if kind == "overrides":
            if section == REMOVAL_SECTION:
                reinstall.append((where, overrides))
            continue
        c.eq(f"{where}: samconfig.toml is read (stack name)", ctx.params.get("stack_name"), STACK_NAME)
        c.eq(f"{where}: samconfig.toml is read (the built template)", ctx.params.get("template_file"), str(built))
        c.eq(f"{where}: not guided (no parameter prompt)", ctx.params.get("guided"), False)
        if section == INSTALL_SECTION:
            first_deploys.append((line, text, args, overrides))
        else:
            sequences.setdefault(section, []).append((line, text, args, overrides))

    # docs/migration.md's staged rollout gives SAM overrides too: each must reach CloudFormation
    # as written (an empty value is dropped by SAM CLI) and be one the template accepts.
    migration = (root / "docs" / "migration.md").read_text(encoding="utf-8")
    spans = documented_commands(migration)
    c.true("docs/migration.md gives SAM overrides (the staged rollout)", len(spans) >= 2, str(spans))
    for section, line, kind, text in spans:
        where = f"docs/migration.md:{line} ({section})"
        args = shlex.split(text)
        if kind == "overrides":
            args = ["sam", "deploy", "--parameter-overrides", *args]
        name, ctx = parse(args[1:])
        if name != "deploy":
            continue
        overrides = dict(ctx.params.get("parameter_overrides") or {})
        c.eq(f"{where}: SAM CLI reads every override written (none dropped)", sorted(overrides), sorted(override_keys(args[2:])))
        for k, v in overrides.items():
            c.true(f"{where}: {k} is a template parameter", k in params)
            c.true(f"{where}: {k} has a value (SAM CLI cannot send an empty one)", v != "")
            if k in params:
                for problem in constraint_problems(k, v, params[k]):
                    c.true(f"{where}: CloudFormation accepts {k}", False, problem)

    # --- first deploys ---------------------------------------------------------------------
    c.true("docs/deploy.md's Path B has a first deploy for each endpoint",
           sorted({o.get("EndpointType") for _, _, _, o in first_deploys}) == ["alb", "http-api"],
           str([o.get("EndpointType") for _, _, _, o in first_deploys]))
    for line, text, args, overrides in first_deploys:
        where = f"docs/deploy.md:{line} (first deploy, {overrides.get('EndpointType')})"
        kind, sent = change_set(template_text, template_dict, overrides, None)
        c.eq(f"{where}: creates the stack", kind, "CREATE")
        values = resolve(template, sent, None, c, where)
        refused, config, attrs = rendered(template, values)
        c.eq(f"{where}: every Rule holds", refused, [])
        c.eq(f"{where}: the function holds the token's hash alone", config["http"].get("pathTokenSha256"), HASH)
        c.eq(f"{where}: the secret's ARN is recorded", values["PathTokenSecretArn"], ARN)
        steps.append({"section": INSTALL_SECTION, "line": line, "command": text, "changeSetType": kind, "parameters": values, "config": config,
                      "outputs": outputs(template, values)})
        if install is None and values["EndpointType"] == "alb":
            install = values
            c.eq(f"{where}: the ALB is protected from deletion", attrs.get("deletion_protection.enabled"), "true")

            # The same command with --guided, answered as the document says.
            gwhere = f"docs/deploy.md:{line} with --guided"
            _, gctx = parse(args[1:] + ["--guided"])
            c.eq(f"{gwhere}: guided", gctx.params.get("guided"), True)
            prompted = get_template_parameters(template_file=str(built))
            c.eq(f"{gwhere}: the hashes are the NoEcho parameters (asked without a default)",
                 sorted(k for k, p in prompted.items() if p.get("NoEcho")), ["PathTokenSha256", "PreviousPathTokenSha256"])
            answers = guided_answers(prompted, dict(gctx.params["parameter_overrides"]))
            with CliRunner().isolation(input="\n".join(answers) + "\n") as (out, _):
                try:
                    got = GuidedContext.__new__(GuidedContext).prompt_parameters(
                        prompted, dict(gctx.params["parameter_overrides"]), "", "")
                except click.exceptions.Abort:
                    got = {}
                    c.true(f"{gwhere}: the prompts take the documented answers", False)
                unread = sys.stdin.read()
            transcript = out.getvalue().decode()
            c.eq(f"{gwhere}: every answer was asked for", unread, "")
            c.eq(f"{gwhere}: an empty PreviousPathTokenSha256 is refused and asked again",
                 transcript.count("Parameter PreviousPathTokenSha256"), 2)
            gkind, gsent = change_set(template_text, template_dict, sanitize_parameter_overrides(got), None)
            gvalues = resolve(template, gsent, None, c, gwhere)
            c.eq(f"{gwhere}: deploys the same stack", gvalues, values)
            steps.append({"section": INSTALL_SECTION, "line": line, "command": text + " --guided", "changeSetType": gkind,
                          "parameters": gvalues, "config": rendered(template, gvalues)[1]})
    c.true("an ALB first deploy to run the other sections on", install is not None)
    if install is None:
        c.finish()

    # --- every other section, in order, on the installed stack ------------------------------
    c.true(f"'{ROTATION_SECTION}' has SAM deploys", ROTATION_SECTION in sequences, str(sorted(sequences)))
    c.true(f"'{REMOVAL_SECTION}' has a SAM deploy", REMOVAL_SECTION in sequences, str(sorted(sequences)))
    installed = (rendered(template, install)[1], published_version(template_dict, template, install))
    for section, commands in sequences.items():
        stack = dict(install)
        configs = []
        before, before_version = installed
        for line, text, args, overrides in commands:
            where = f"docs/deploy.md:{line} ({section})"
            kind, sent = change_set(template_text, template_dict, overrides, stack)
            c.eq(f"{where}: updates the stack", kind, "UPDATE")
            stack = resolve(template, sent, stack, c, where)
            refused, config, attrs = rendered(template, stack)
            c.eq(f"{where}: every Rule holds", refused, [])
            configs.append(config["http"].get("pathTokenSha256"))
            version = published_version(template_dict, template, stack)
            if config != before:
                c.true(f"{where}: changes the function's configuration, so it publishes a version for live",
                       version != before_version, str(version))
            before, before_version = config, version
            steps.append({"section": section, "line": line, "command": text, "changeSetType": kind, "parameters": stack, "config": config})
        if section == ROTATION_SECTION:
            c.true(f"{section}: a deploy leaves the function with [new hash, the hash deployed before]",
                   [NEW_HASH, HASH] in configs, str(configs))
            c.eq(f"{section}: the last deploy leaves the new hash alone", configs[-1], NEW_HASH)
            if [NEW_HASH, HASH] in configs:
                c.true(f"{section}: both hashes before the new one alone", configs.index([NEW_HASH, HASH]) < len(configs) - 1)
            c.eq(f"{section}: the previous hash is dropped", stack["PreviousPathTokenSha256"], "none")
            c.eq(f"{section}: the stack names the new token's secret", stack["PathTokenSecretArn"], NEW_ARN)
        if section == REMOVAL_SECTION:
            c.eq(f"{section}: the ALB's deletion protection is lifted", attrs.get("deletion_protection.enabled"), "false")
            c.eq(f"{section}: nothing else changes",
                 {k: v for k, v in stack.items() if v != install[k]}, {"AlbDeletionProtection": "false"})

    # Any other parameter the function reads: a new version only with a new ConfigRevision.
    changed = dict(install, EmbeddedDeadlineMs=str(int(install["EmbeddedDeadlineMs"]) + 1))
    c.true("EmbeddedDeadlineMs is in the function's configuration",
           rendered(template, changed)[1] != installed[0])
    c.eq("SAM publishes no version for a change of another parameter alone (why ConfigRevision is)",
         published_version(template_dict, template, changed), installed[1])
    c.true("a new ConfigRevision publishes one",
           published_version(template_dict, template, dict(changed, ConfigRevision="2026-12-06")) != installed[1])
    longest = {k: "f" * params[k]["MaxLength"] for k in ("ConfigRevision", "PathTokenSha256", "PreviousPathTokenSha256")}
    length = len(published_version(template_dict, template, dict(install, **longest))[1] or "")
    c.true("the version's description fits Lambda's 256 characters at its parameters' longest", length <= 256, str(length))

    # --- a reinstall after `sam delete` ----------------------------------------------------
    # Path B's first deploy again, in an account that keeps what the deleted stack retained
    # (DeletionPolicy: Retain). The deleted stack made every cache rule; the new one, with the
    # override the section writes, must name nothing still there and rewrite images as the
    # deleted one did. The retained log groups collide with nothing because CloudFormation names
    # them: none may be given a name of its own.
    c.eq(f"'{REMOVAL_SECTION}' writes the reinstall's override", [o for _, o in reinstall],
         [{"EcrPullThroughCacheCreateRules": "false"}])
    deleted = dict(typed(template, install), **IMAGES_VARIANTS["all"])
    kept = named(template, Evaluator(template, deleted), retained=True)
    c.true("the deleted stack kept the cache rules under their names", len(kept) >= 5, str(sorted(kept)))
    images = function_config(template, Evaluator(template, deleted))["images"]
    for where, o in reinstall:
        again = Evaluator(template, dict(deleted, **o))
        c.eq(f"{where}: every Rule holds on the reinstall", failed_rules(template, again), [])
        c.eq(f"{where}: the reinstall names nothing the deleted stack kept",
             sorted(named(template, again) & kept), [])
        c.eq(f"{where}: the reinstall rewrites images as the deleted stack did",
             function_config(template, again)["images"], images)
    c.eq("the retained log groups are named by CloudFormation",
         [k for k, r in template["Resources"].items()
          if r["Type"] == "AWS::Logs::LogGroup" and r.get("DeletionPolicy") == "Retain"
          and "LogGroupName" in r.get("Properties", {})], [])

    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(steps, f)
    c.finish()


if __name__ == "__main__":
    main()
