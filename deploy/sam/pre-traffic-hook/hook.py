"""The SAM template's pre-traffic check (template.yaml, PreTrafficCheck): CodeDeploy's
BeforeAllowTraffic hook for the webhook function.

Before the `live` alias moves to a newly published version, CodeDeploy invokes this hook. It
invokes that version (never the alias) with the canned AdmissionReview of
pre-traffic-event.json, the event Terraform's check sends too (terraform/pre-traffic-event.json;
a test keeps the two identical): an ALB event through the path token, for a pod that asks for
nothing. The version passes when it answers status 200 with the review's uid and
`allowed: true`. Anything else, or an error on the way (the token's secret unreadable, the
invocation refused), is reported Failed: CodeDeploy then stops the deployment, CloudFormation
rolls the stack back, and the alias stays on the version it named. CodeDeploy's status carries
no message, so the reason is this hook's log line (the PreTrafficLogGroupName output).

Environment (template.yaml sets it):
  PODMUTATOR_VERSION_ARN            the version to check (!Ref Function.Version)
  PODMUTATOR_PATH_TOKEN_ENABLED     "true" or "false" (PathTokenEnabled)
  PODMUTATOR_PATH_TOKEN_SECRET_ARN  the token's secret (PathTokenSecretArn); with the token on,
                                    an empty one fails the check (a Rule refuses such a stack)

Needs only boto3, which the Lambda Python runtime has: no requirements file, so `sam build`
copies this directory as it is. The path token is never logged or returned: every text taken
from an answer or an error is cleaned of it first.
"""

import base64
import json
import logging
import os
import re

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

LOG = logging.getLogger("podmutator.pre_traffic")
LOG.setLevel(logging.INFO)

EVENT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pre-traffic-event.json")
# The event's path is /PATH_TOKEN/mutate--v1-pod: /<token>/ with the token on, / with it off.
PLACEHOLDER = "/PATH_TOKEN/"
# What the function accepts as a path token (crates/core/src/config/http.rs, check_path_token).
TOKEN = re.compile(r"[A-Za-z0-9_-]{32,}")
# Every call is bounded well within the hook's own timeout (template.yaml), so that the hook
# always reports: without a status CodeDeploy waits for its hook timeout, an hour.
CONFIG = Config(connect_timeout=5, read_timeout=20, retries={"mode": "standard", "max_attempts": 2})
# Longest excerpt of an answer quoted in a reason.
EXCERPT = 300

# One client per service for the life of the container (tests put stubbed ones here).
CLIENTS = {}


def client(name):
    if name not in CLIENTS:
        CLIENTS[name] = boto3.client(name, config=CONFIG)
    return CLIENTS[name]


class Refused(Exception):
    """The check failed; the message says how (never with the token in it)."""


class Token:
    """The path token once read, and the scrubbing of it from any text."""

    def __init__(self):
        self.value = None

    def scrub(self, text):
        text = str(text)
        if self.value:
            text = text.replace(self.value, "<path token>")
        return text


def excerpt(text):
    text = " ".join(str(text).split())
    return text if len(text) <= EXCERPT else text[:EXCERPT] + "..."


def read_token(env, token):
    arn = env.get("PODMUTATOR_PATH_TOKEN_SECRET_ARN", "")
    if not arn:
        raise Refused(
            "the path token is on but PathTokenSecretArn is empty, so the check cannot call "
            "through the token: deploy with PathTokenSecretArn=<the token's secret>, or "
            "PreTrafficCheck=false"
        )
    try:
        value = client("secretsmanager").get_secret_value(SecretId=arn).get("SecretString")
    except (ClientError, BotoCoreError) as e:
        raise Refused(f"cannot read the path token from {arn}: {describe(e)}") from None
    # As `podmutator webhook-config --path-token-file` reads it.
    value = (value or "").strip()
    token.value = value or None
    if not TOKEN.fullmatch(value):
        raise Refused(
            f"the secret {arn} does not hold a path token (at least 32 letters, digits, '-' or '_')"
        )
    return value


def describe(e):
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return f"{e.operation_name}: {err.get('Code', 'error')}: {err.get('Message', '')}".rstrip(": ")
    return f"{type(e).__name__}: {e}"


def answer_of(version, result):
    """The function's ALB answer: (statusCode, body text)."""
    raw = result["Payload"].read().decode("utf-8", "replace")
    if result.get("FunctionError"):
        try:
            err = json.loads(raw)
            what = f"{err.get('errorType', 'error')}: {err.get('errorMessage', '')}"
        except (ValueError, AttributeError):
            what = raw
        raise Refused(
            f"version {version} failed instead of answering (FunctionError {result['FunctionError']}): "
            f"{excerpt(what)}"
        )
    try:
        answer = json.loads(raw)
        status = answer["statusCode"]
        body = answer.get("body") or ""
        if answer.get("isBase64Encoded"):
            body = base64.b64decode(body).decode("utf-8", "replace")
    except (ValueError, KeyError, TypeError):
        raise Refused(f"version {version} answered what is not an ALB response: {excerpt(raw)}") from None
    return status, body


def message_of(body):
    """What an answer says about itself: the review's status message, or the error's message."""
    try:
        doc = json.loads(body)
    except ValueError:
        return excerpt(body) or "no body"
    if not isinstance(doc, dict):
        return excerpt(body)
    status = (doc.get("response") or {}).get("status") or {}
    return excerpt(status.get("message") or doc.get("message") or body)


def check(env, token):
    """Invokes the new version with the canned review; returns its ARN, or raises Refused."""
    version = env.get("PODMUTATOR_VERSION_ARN", "")
    if not version:
        raise Refused("PODMUTATOR_VERSION_ARN is not set: no version to check")
    enabled = env.get("PODMUTATOR_PATH_TOKEN_ENABLED", "")
    if enabled not in ("true", "false"):
        raise Refused(f"PODMUTATOR_PATH_TOKEN_ENABLED is {enabled!r}, not true or false")
    with open(EVENT_FILE, encoding="utf-8") as f:
        template = f.read()
    uid = json.loads(json.loads(template)["body"])["request"]["uid"]
    prefix = f"/{read_token(env, token)}/" if enabled == "true" else "/"
    event = template.replace(PLACEHOLDER, prefix)
    try:
        result = client("lambda").invoke(
            FunctionName=version, InvocationType="RequestResponse", Payload=event.encode("utf-8")
        )
    except (ClientError, BotoCoreError) as e:
        raise Refused(f"cannot invoke version {version}: {describe(e)}") from None
    status, body = answer_of(version, result)
    if status != 200:
        raise Refused(f"version {version} answered status {status}: {message_of(body)}")
    try:
        response = json.loads(body).get("response") or {}
    except (ValueError, AttributeError):
        raise Refused(f"version {version} answered status 200 without an AdmissionReview: {excerpt(body)}") from None
    if response.get("uid") != uid:
        raise Refused(
            f"version {version} answered status 200 with uid {response.get('uid')!r}, not the review's {uid!r}"
        )
    if response.get("allowed") is not True:
        raise Refused(
            f"version {version} answered status 200 with allowed: {json.dumps(response.get('allowed'))}: "
            f"{message_of(body)}"
        )
    return version


def handler(event, context):
    deployment = event["DeploymentId"]
    execution = event["LifecycleEventHookExecutionId"]
    token = Token()
    try:
        version = check(os.environ, token)
        status = "Succeeded"
        reason = (
            f"version {version} answered the canned AdmissionReview with status 200, its uid and "
            "allowed: true; CodeDeploy moves the live alias to it"
        )
    except Exception as e:  # noqa: BLE001 - every failure must still be reported, as Failed
        status = "Failed"
        reason = (
            f"{e if isinstance(e, Refused) else 'the check could not run: ' + describe(e)}; "
            "CodeDeploy stops the deployment and the live alias stays on the version it names "
            "(docs/deploy.md, \"Upgrade and roll back\")"
        )
    reason = token.scrub(reason)
    (LOG.info if status == "Succeeded" else LOG.error)("pre-traffic check %s: %s", status, reason)
    client("codedeploy").put_lifecycle_event_hook_execution_status(
        deploymentId=deployment, lifecycleEventHookExecutionId=execution, status=status
    )
    return {"status": status, "reason": reason}
