#!/usr/bin/env python3
"""Rebuild the Lambda event fixtures in events/ from events/templates/ and an AdmissionReview.

Stdlib only; runs with the machine's plain python3. Output is deterministic: running it twice
gives identical bytes.

  scripts/make-events.py                      rewrite events/*.json
  scripts/make-events.py --check              exit 1 if any events/*.json is stale (for CI)
  scripts/make-events.py --refresh-templates  re-run `sam local generate-event` (the pinned SAM
                                              from scripts/tools.sh) into events/templates/,
                                              then rewrite events/*.json

Templates (events/templates/):
  apigateway-aws-proxy.json       sam local generate-event apigateway aws-proxy       (REST, v1)
  apigateway-http-api-proxy.json  sam local generate-event apigateway http-api-proxy  (HTTP API, v2)
  alb-request.json                sam local generate-event alb request                (ALB)
  function-url-request.json       hand-written: SAM has no Function URL generator; AWS's documented
                                  Function URL payload (HTTP API v2 format, AuthType NONE)

What is changed from a template: method, path and query string (kube-apiserver calls a webhook
as POST <path>?timeout=10s, 10s being the default timeoutSeconds); the body; the request
headers (those kube-apiserver's webhook client sends replace the sample's browser headers); and
fields a real event lacks for our deployment (cookies, JWT/mTLS sections, stage variables,
path parameters of a catch-all route). Header names are lowercased where the service lowercases
them (HTTP API, Function URL, ALB) and kept as sent (Go's canonical case) for API Gateway REST.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "events"
TEMPLATES = EVENTS / "templates"
REVIEW = ROOT / "tests" / "fixtures" / "reviews" / "flyte-task-k8s-env.json"

MUTATE_PATH = "/mutate--v1-pod"
HEALTHZ_PATH = "/healthz"
# kube-apiserver appends the webhook's timeout to every call.
QUERY = {"timeout": "10s"}
RAW_QUERY = "timeout=10s"

# The REST sample's apiId; the HTTP API sample's placeholders ("api-id", "id") are replaced by it.
APIGW_API_ID = "1234567890"
APIGW_HOST = f"{APIGW_API_ID}.execute-api.us-east-1.amazonaws.com"
# RFC 5737 documentation address for the caller in the v2 / ALB / Function URL events (the HTTP
# API sample's "192.168.0.1/32" is not a valid sourceIp).
CLIENT_IP = "203.0.113.10"

# Headers as kube-apiserver's webhook client (client-go REST client) sends them.
KUBE_USER_AGENT = "kube-apiserver-admission"
KUBE_HEADERS = {
    "Accept": "application/json, */*",
    "Accept-Encoding": "gzip",
    "Content-Type": "application/json",
    "User-Agent": KUBE_USER_AGENT,
}
# Browser headers of the SAM samples that a webhook call does not carry, and the HTTP API
# sample's placeholders.
DROP_HEADERS = {
    "accept-language",
    "cache-control",
    "upgrade-insecure-requests",
    "header1",
    "header2",
}
TRACE_ID = "Root=1-6740a2f1-3c1e5b7d9f0a2c4e6b8d0f13"

SAM_TEMPLATES = {
    "apigateway-aws-proxy.json": ["apigateway", "aws-proxy"],
    "apigateway-http-api-proxy.json": ["apigateway", "http-api-proxy"],
    "alb-request.json": ["alb", "request"],
}


def load(name: str) -> dict:
    with open(TEMPLATES / name, encoding="utf-8") as f:
        return json.load(f)


def review_body() -> str:
    with open(REVIEW, encoding="utf-8") as f:
        review = json.load(f)
    return json.dumps(review, separators=(",", ":"), ensure_ascii=False)


def b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def headers(base: dict, *, lowercase: bool, body: str | None, extra: dict | None = None) -> dict:
    """The template's headers minus browser-only ones, plus kube-apiserver's, sorted by name."""
    out = {k: v for k, v in base.items() if k.lower() not in DROP_HEADERS}
    wanted = dict(KUBE_HEADERS)
    if body is None:
        wanted = {"Accept": "*/*", "User-Agent": wanted["User-Agent"]}
        out = {k: v for k, v in out.items() if k.lower() not in ("content-type", "content-length")}
    else:
        wanted["Content-Length"] = str(len(body.encode("utf-8")))
    wanted["X-Amzn-Trace-Id"] = TRACE_ID
    wanted.update(extra or {})
    for name, value in wanted.items():
        # replace an existing header whatever its case, keeping the template's spelling
        existing = [k for k in out if k.lower() == name.lower()]
        for k in existing:
            del out[k]
        out[existing[0] if existing else name] = value
    if lowercase:
        out = {k.lower(): v for k, v in out.items()}
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def apigw_rest(body: str) -> dict:
    ev = load("apigateway-aws-proxy.json")
    hdrs = headers(ev["headers"], lowercase=False, body=body, extra={"Host": APIGW_HOST})
    out = {}
    for key, value in ev.items():
        if key == "body":
            value = body
        elif key == "path":
            value = MUTATE_PATH
        elif key == "resource":
            value = "/{proxy+}"
        elif key == "httpMethod":
            value = "POST"
        elif key == "isBase64Encoded":
            value = False
        elif key == "queryStringParameters":
            value = dict(QUERY)
        elif key == "multiValueQueryStringParameters":
            value = {k: [v] for k, v in QUERY.items()}
        elif key == "pathParameters":
            value = {"proxy": MUTATE_PATH.lstrip("/")}
        elif key == "stageVariables":
            value = None
        elif key == "headers":
            value = hdrs
        elif key == "multiValueHeaders":
            value = {k: [v] for k, v in hdrs.items()}
        elif key == "requestContext":
            value = copy.deepcopy(value)
            stage = value["stage"]
            value["path"] = f"/{stage}{MUTATE_PATH}"
            value["resourcePath"] = "/{proxy+}"
            value["httpMethod"] = "POST"
            value["apiId"] = APIGW_API_ID
            value["identity"]["userAgent"] = KUBE_USER_AGENT
        out[key] = value
    return out


def v2_event(template: str, *, method: str, path: str, body: str | None, base64_body: bool,
             host: str) -> dict:
    """HTTP API payload v2 (also the Function URL payload)."""
    ev = load(template)
    hdrs = headers(ev["headers"], lowercase=True, body=body,
                   extra={"Host": host, "X-Forwarded-For": CLIENT_IP,
                          "X-Forwarded-Port": "443", "X-Forwarded-Proto": "https"})
    ua = hdrs["user-agent"]
    out = {}
    for key, value in ev.items():
        if key in ("cookies", "pathParameters", "stageVariables"):
            continue  # absent: no cookies sent, catch-all route, no stage variables
        if key == "routeKey":
            value = "$default"
        elif key == "rawPath":
            value = path
        elif key == "rawQueryString":
            value = RAW_QUERY if body is not None else ""
        elif key == "queryStringParameters":
            if body is None:
                continue
            value = dict(QUERY)
        elif key == "headers":
            value = hdrs
        elif key == "body":
            if body is None:
                continue
            value = b64(body) if base64_body else body
        elif key == "isBase64Encoded":
            value = bool(base64_body and body is not None)
        elif key == "requestContext":
            value = copy.deepcopy(value)
            value.pop("authentication", None)  # no mutual TLS
            value.pop("authorizer", None)  # no JWT / IAM authorizer
            value["http"].update(method=method, path=path, sourceIp=CLIENT_IP, userAgent=ua)
            value["routeKey"] = "$default"
            value["stage"] = "$default"
        out[key] = value
    if "queryStringParameters" not in out and body is not None:
        # the template had no query string: the field goes right after the headers
        out = {k2: v2 for k, v in out.items()
               for k2, v2 in ([(k, v), ("queryStringParameters", dict(QUERY))]
                              if k == "headers" else [(k, v)])}
    return out


def apigw_http(body: str | None, *, method: str, path: str) -> dict:
    ev = v2_event("apigateway-http-api-proxy.json", method=method, path=path, body=body,
                  base64_body=False, host=APIGW_HOST)
    rc = ev["requestContext"]
    rc["apiId"] = APIGW_API_ID
    rc["domainName"] = APIGW_HOST
    rc["domainPrefix"] = APIGW_API_ID
    rc["requestId"] = "Wx3kPjQ0IAMEVxA="  # the sample's is "id"; real ones look like this
    if body is None:
        ev["headers"]["user-agent"] = "curl/8.14.1"
        rc["http"]["userAgent"] = "curl/8.14.1"
    return ev


def function_url(body: str) -> dict:
    tpl = load("function-url-request.json")
    return v2_event("function-url-request.json", method="POST", path=MUTATE_PATH, body=body,
                    base64_body=True, host=tpl["requestContext"]["domainName"])


def alb(body: str) -> dict:
    ev = load("alb-request.json")
    hdrs = headers(ev["headers"], lowercase=True, body=body,
                   extra={"X-Forwarded-For": CLIENT_IP, "X-Forwarded-Port": "443",
                          "X-Forwarded-Proto": "https"})
    out = {}
    for key, value in ev.items():
        if key == "httpMethod":
            value = "POST"
        elif key == "path":
            value = MUTATE_PATH
        elif key == "queryStringParameters":
            value = dict(QUERY)
        elif key == "headers":
            value = hdrs
        elif key == "body":
            value = b64(body)
        elif key == "isBase64Encoded":
            value = True
        out[key] = value
    return out


def render(ev: dict) -> bytes:
    return (json.dumps(ev, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def build() -> dict[str, bytes]:
    body = review_body()
    return {
        "apigw-rest-mutate.json": render(apigw_rest(body)),
        "apigw-http-mutate.json": render(apigw_http(body, method="POST", path=MUTATE_PATH)),
        "apigw-http-healthz.json": render(apigw_http(None, method="GET", path=HEALTHZ_PATH)),
        "alb-mutate.json": render(alb(body)),
        "function-url-mutate.json": render(function_url(body)),
    }


def refresh_templates() -> None:
    sam = subprocess.run([str(ROOT / "scripts" / "tools.sh"), "path", "sam"], check=True,
                         capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, SAM_CLI_TELEMETRY="0")
    for name, args in SAM_TEMPLATES.items():
        out = subprocess.run([sam, "local", "generate-event", *args], check=True,
                             capture_output=True, env=env).stdout
        json.loads(out)  # must be JSON
        (TEMPLATES / name).write_bytes(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if events/*.json are stale")
    ap.add_argument("--refresh-templates", action="store_true",
                    help="regenerate the SAM templates with the pinned aws-sam-cli first")
    args = ap.parse_args()
    if args.refresh_templates:
        refresh_templates()
    stale = []
    for name, data in build().items():
        path = EVENTS / name
        current = path.read_bytes() if path.exists() else None
        if current == data:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_bytes(data)
    if stale:
        print("stale event fixtures (run scripts/make-events.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
