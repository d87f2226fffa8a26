"""Runs the SAM template's pre-traffic hook (deploy/sam/pre-traffic-hook/hook.py) as Lambda would
run it, once per case, and records what it did.

Usage: python check_pre_traffic_hook.py REPO_ROOT TOKEN_FILE OUT_JSON

Each case runs the hook's `handler` with CodeDeploy's event and the environment template.yaml
gives it, inside moto (in process, nothing listens): the path token stored in a Secrets Manager
secret, the webhook function created and a version of it published. moto runs no function code,
so its Invoke runs the case's stand-in for that version instead: a version that answers as the
function does (200, the review's uid and allowed: true, through the token it accepts, else 404
"not found"), or one that answers 404, fails, refuses, names another uid or echoes the path.
moto has no CodeDeploy lifecycle hooks, so the CodeDeploy client is botocore's Stubber, which
checks the report against the service's model and expects exactly one, for this deployment and
execution.

OUT_JSON gets, for each case: the status reported to CodeDeploy, what the handler returned, the
hook's log lines, and every invocation (function, version, and which path it was sent: through
the token, without one, or another). Paths are recorded by kind, never as sent, and the token
(read from TOKEN_FILE) is written nowhere: tests/iac.rs checks every case and that the token is
in none of this output. Run by tests/iac.rs with the python of .venv (scripts/tools.sh path
python), which has boto3 and moto.
"""

import base64
import importlib.util
import io
import json
import logging
import os
import pathlib
import sys
import zipfile

for name, value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "eu-west-1",
    "AWS_REGION": "eu-west-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}.items():
    os.environ[name] = value
os.environ.pop("AWS_ENDPOINT_URL", None)
os.environ.pop("AWS_PROFILE", None)

import boto3  # noqa: E402
from botocore.stub import ANY, Stubber  # noqa: E402
from moto import mock_aws  # noqa: E402
from moto.awslambda import models as awslambda  # noqa: E402

DEPLOYMENT = "d-PRETRAFFIC1"
EXECUTION = "eyJkZXBsb3ltZW50SWQiOiJkLVBSRVRSQUZGSUMxIn0="
OTHER_TOKEN = "AnotherTokenTheVersionWasGiven0123456789abcdef"
SECTION = "/mutate--v1-pod"


def load_hook(root):
    path = root / "deploy" / "sam" / "pre-traffic-hook" / "hook.py"
    spec = importlib.util.spec_from_file_location("pre_traffic_hook", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alb(status, body, base64_body=False):
    text = json.dumps(body) if not isinstance(body, str) else body
    if base64_body:
        text = base64.b64encode(text.encode()).decode()
    return json.dumps({
        "statusCode": status,
        "statusDescription": f"{status} Test",
        "headers": {"content-type": "application/json"},
        "body": text,
        "isBase64Encoded": base64_body,
    })


def review_answer(event, allowed=True, uid=None, message=None):
    request = json.loads(event["body"])["request"]
    response = {"uid": request["uid"] if uid is None else uid, "allowed": allowed}
    if message:
        response["status"] = {"code": 403, "message": message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def webhook(accepts):
    """A version that answers as the function does: through the token it accepts (None: the
    token is off) the review allowed, on any other path 404 "not found"."""

    def answer(event):
        want = f"/{accepts}{SECTION}" if accepts else SECTION
        if event.get("path") != want:
            return alb(404, {"message": "not found"}), False
        return alb(200, review_answer(event)), False

    return answer


def cases(token):
    """name -> (environment beyond the version, secret value or None, the version's answer)."""
    on = {"PODMUTATOR_PATH_TOKEN_ENABLED": "true"}
    return {
        "answers-allowed": (on, token, webhook(token)),
        "answers-allowed-base64": (on, token, lambda e: (alb(200, review_answer(e), base64_body=True), False)),
        "accepts-another-token": (on, token, webhook(OTHER_TOKEN)),
        "function-error": (on, token, lambda e: (json.dumps({
            "errorType": "Runtime.ExitError",
            "errorMessage": "RequestId: 0000 Error: Runtime exited with error: exit status 1",
        }), True)),
        "answers-allowed-false": (on, token, lambda e: (alb(200, review_answer(
            e, allowed=False, message="refused by the version under test")), False)),
        "answers-another-uid": (on, token, lambda e: (alb(200, review_answer(e, uid="someone-else")), False)),
        "echoes-the-path": (on, token, lambda e: (alb(500, {"message": f"cannot route {e.get('path')}"}), False)),
        "token-off": ({"PODMUTATOR_PATH_TOKEN_ENABLED": "false"}, None, webhook(None)),
        "token-on-without-secret-arn": (dict(on, PODMUTATOR_PATH_TOKEN_SECRET_ARN=""), token, webhook(token)),
        "secret-missing": (dict(on, PODMUTATOR_PATH_TOKEN_SECRET_ARN="arn:aws:secretsmanager:eu-west-1:123456789012:secret:gone-AbCdEf"), token, webhook(token)),
        "secret-not-a-token": (on, "short", webhook("short")),
    }


def path_kind(path, token):
    if token and path == f"/{token}{SECTION}":
        return "token"
    if path == SECTION:
        return "no token"
    return "other"


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        line = f"{record.levelname} {record.getMessage()}"
        self.lines.append(line)
        print(f"  hook log: {line}", file=sys.stderr)


def run_case(hook, name, env, secret_value, answer, token):
    out = {"case": name, "invocations": [], "reported": []}
    with mock_aws():
        iam = boto3.client("iam")
        role = iam.create_role(RoleName="podmutator", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as z:
            z.writestr("bootstrap", "#!/bin/sh\n")
        lam = boto3.client("lambda")
        lam.create_function(FunctionName="podmutator", Runtime="provided.al2023", Role=role,
                            Handler="bootstrap", Code={"ZipFile": code.getvalue()})
        version = lam.publish_version(FunctionName="podmutator")
        out["published"] = version["Version"]
        environ = {"PODMUTATOR_VERSION_ARN": version["FunctionArn"]}
        if secret_value is not None:
            environ["PODMUTATOR_PATH_TOKEN_SECRET_ARN"] = boto3.client("secretsmanager").create_secret(
                Name="podmutator-path-token", SecretString=secret_value)["ARN"]
        else:
            # Never read with the token off: reading it would fail the check.
            environ["PODMUTATOR_PATH_TOKEN_SECRET_ARN"] = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:absent-AbCdEf"
        environ.update(env)

        def invoke(fn, event=None):
            out["invocations"].append({
                "function": fn.function_name,
                "version": str(fn.version),
                "path": path_kind(event.get("path"), token),
                "uid": json.loads(event["body"])["request"]["uid"],
            })
            payload, errored = answer(event)
            return payload, errored, ""

        awslambda.LambdaFunction._invoke_lambda = invoke

        codedeploy = boto3.client("codedeploy")
        codedeploy.meta.events.register(
            "provide-client-params.codedeploy.PutLifecycleEventHookExecutionStatus",
            lambda params, **_: out["reported"].append(params.get("status")),
        )
        stubber = Stubber(codedeploy)
        stubber.add_response(
            "put_lifecycle_event_hook_execution_status",
            {"lifecycleEventHookExecutionId": EXECUTION},
            {"deploymentId": DEPLOYMENT, "lifecycleEventHookExecutionId": EXECUTION, "status": ANY},
        )
        hook.CLIENTS.clear()
        hook.CLIENTS["codedeploy"] = codedeploy
        saved = {k: os.environ.get(k) for k in environ}
        os.environ.update(environ)
        try:
            with stubber:
                out["returned"] = hook.handler(
                    {"DeploymentId": DEPLOYMENT, "LifecycleEventHookExecutionId": EXECUTION}, None)
                stubber.assert_no_pending_responses()
        except Exception as e:  # recorded for the test to report
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            hook.CLIENTS.clear()
    return out


def main():
    root = pathlib.Path(sys.argv[1])
    token = pathlib.Path(sys.argv[2]).read_text(encoding="utf-8").strip()
    hook = load_hook(root)
    lines = Lines()
    hook.LOG.addHandler(lines)
    results = []
    for name, (env, secret_value, answer) in cases(token).items():
        print(f"pre-traffic hook, case {name}:", file=sys.stderr)
        lines.lines = []
        result = run_case(hook, name, env, secret_value, answer, token)
        result["logs"] = lines.lines
        results.append(result)
    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
