"""A stand-in for kubectl in tests/terraform_apply.rs: keeps MutatingWebhookConfigurations as
JSON files in $FAKE_KUBE_DIR, and understands exactly the calls modules/registration makes
(server-side apply from stdin, get of the revision annotation, delete) and those
scripts/registration-drift.sh makes (get -f - -o name, diff --server-side). Anything else is
an error, so a change in their commands shows up here.

With $FAKE_KUBE_CLUSTER set, every call must come with a KUBECONFIG whose current context is
that EKS cluster (what tests/iac/fake_aws.py's `eks update-kubeconfig` writes), as a real
kubectl would need credentials for it.

`diff` answers as kubectl does: the live object against the applied one, as `diff -u` of their
YAML (JSON here), exit status 0 when equal, 1 when not. Server-side apply by the object's only
field manager makes the applied object the merged one.
"""

import difflib
import json
import os
import pathlib
import sys

store = pathlib.Path(os.environ["FAKE_KUBE_DIR"])
args = sys.argv[1:]
with open(store / "calls.log", "a", encoding="utf-8") as log:
    log.write(json.dumps(args) + "\n")

cluster = os.environ.get("FAKE_KUBE_CLUSTER")
if cluster:
    try:
        config = json.loads(pathlib.Path(os.environ["KUBECONFIG"]).read_text(encoding="utf-8"))
    except (KeyError, OSError, ValueError) as e:
        sys.exit(f"fake kubectl: no kubeconfig for cluster {cluster}: {e!r}")
    if not config.get("current-context", "").endswith(f":cluster/{cluster}"):
        sys.exit(f"fake kubectl: the kubeconfig's context {config.get('current-context')!r} is not cluster {cluster}")

KIND = "mutatingwebhookconfiguration.admissionregistration.k8s.io"


def stored(name):
    path = store / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def from_stdin():
    obj = json.load(sys.stdin)
    if obj.get("kind") != "MutatingWebhookConfiguration":
        sys.exit("fake kubectl: not a MutatingWebhookConfiguration")
    return obj


if args[:1] == ["apply"]:
    want = ["apply", "--server-side", "--force-conflicts", "--field-manager", "podmutator-terraform", "-f", "-"]
    if args != want:
        sys.exit(f"fake kubectl: unexpected apply arguments {args}")
    obj = from_stdin()
    (store / f"{obj['metadata']['name']}.json").write_text(json.dumps(obj), encoding="utf-8")
    print(f"{KIND}/{obj['metadata']['name']} serverside-applied")
elif args == ["get", "-f", "-", "--ignore-not-found", "-o", "name"]:
    obj = from_stdin()
    if stored(obj["metadata"]["name"]) is not None:
        print(f"{KIND}/{obj['metadata']['name']}")
elif args[:2] == ["get", "mutatingwebhookconfiguration"]:
    want = ["get", "mutatingwebhookconfiguration", args[2] if len(args) > 2 else None, "--ignore-not-found", "-o",
            "jsonpath={.metadata.annotations.podmutator\\.io/terraform-revision} {.metadata.annotations.podmutator\\.io/terraform-instance}"]
    if args != want:
        sys.exit(f"fake kubectl: unexpected get arguments {args}")
    obj = stored(args[2])
    if obj is not None:
        notes = obj["metadata"].get("annotations", {})
        print(f"{notes.get('podmutator.io/terraform-revision', '')} {notes.get('podmutator.io/terraform-instance', '')}", end="")
elif args[:1] == ["diff"]:
    want = ["diff", "--server-side", "--force-conflicts", "--field-manager", "podmutator-terraform", "-f", "-"]
    if args != want:
        sys.exit(f"fake kubectl: unexpected diff arguments {args}")
    obj = from_stdin()
    live = stored(obj["metadata"]["name"])
    name = f"admissionregistration.k8s.io.v1.MutatingWebhookConfiguration..{obj['metadata']['name']}"
    lines = list(difflib.unified_diff(
        json.dumps(live, indent=2, sort_keys=True).splitlines() if live is not None else [],
        json.dumps(obj, indent=2, sort_keys=True).splitlines(),
        fromfile=f"/tmp/LIVE-1/{name}", tofile=f"/tmp/MERGED-1/{name}", lineterm="",
    ))
    print("\n".join(lines))
    sys.exit(1 if lines else 0)
elif args[:2] == ["delete", "mutatingwebhookconfiguration"]:
    (store / f"{args[2]}.json").unlink(missing_ok=True)
    print(f'{KIND} "{args[2]}" deleted')
else:
    sys.exit(f"fake kubectl: unexpected call {args}")
