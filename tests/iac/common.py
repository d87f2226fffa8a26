"""Shared by the IaC agreement checks: a collector that reports every disagreement at once."""

import json
import sys

# Everything the function role may do (SAM and Terraform alike); anything else is a finding.
ALLOWED_ACTIONS = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "secretsmanager:GetSecretValue",
    "secretsmanager:BatchGetSecretValue",
    "secretsmanager:DescribeSecret",
    "kms:Decrypt",
    # embedded.entrypointLookup on ECR, only with the repositories named.
    "ecr:GetAuthorizationToken",
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
}


class Checks:
    """Collects failed expectations so one run shows all of them."""

    def __init__(self, name):
        self.name = name
        self.count = 0
        self.failures = []

    def eq(self, what, got, want):
        self.count += 1
        if got != want:
            self.failures.append(f"{what}: got {got!r}, want {want!r}")

    def true(self, what, cond, detail=""):
        self.count += 1
        if not cond:
            self.failures.append(f"{what}{': ' + str(detail) if detail else ''}")

    def finish(self):
        if self.failures:
            print(f"{self.name}: {len(self.failures)} of {self.count} checks disagree:", file=sys.stderr)
            for f in self.failures:
                print(f"  - {f}", file=sys.stderr)
            sys.exit(1)
        print(f"{self.name}: all {self.count} checks agree", file=sys.stderr)


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def expected_webhooks(expect):
    """name -> (path, mesh) as the function routes them (from the Rust constants)."""
    r = expect["routes"]
    return {
        expect["secretsWebhookName"]: (r["secrets"], False),
        "managed-pod.podmutator.io": (r["managedPod"], True),
        "managed-namespace.podmutator.io": (r["managedNamespace"], True),
        expect["imageBuilderWebhookName"]: (r["imageBuilder"], False),
        "images.podmutator.io": (r["images"], False),
    }


def registration_paths(registration, mesh, features=()):
    """Paths of the entries registered with mesh on or off and the optional features
    (`feature`: imageBuilder, images) that are switched on, in registration order. The secrets
    entry (feature `secrets`) is always registered."""
    return [
        w["path"]
        for w in registration["webhooks"]
        if (mesh or not w["mesh"]) and w.get("feature", None) in (None, "secrets", *features)
    ]
