"""A stand-in for kubectl in tests/terraform_apply.rs: keeps MutatingWebhookConfigurations as
JSON files in $FAKE_KUBE_DIR, and understands exactly the three calls modules/registration
makes (server-side apply from stdin, get of the revision annotation, delete). Anything else is
an error, so a change in the module's commands shows up here.
"""

import json
import os
import pathlib
import sys

store = pathlib.Path(os.environ["FAKE_KUBE_DIR"])
args = sys.argv[1:]
with open(store / "calls.log", "a", encoding="utf-8") as log:
    log.write(json.dumps(args) + "\n")

if args[:1] == ["apply"]:
    want = ["apply", "--server-side", "--force-conflicts", "--field-manager", "podmutator-terraform", "-f", "-"]
    if args != want:
        sys.exit(f"fake kubectl: unexpected apply arguments {args}")
    obj = json.load(sys.stdin)
    if obj.get("kind") != "MutatingWebhookConfiguration":
        sys.exit("fake kubectl: not a MutatingWebhookConfiguration")
    (store / f"{obj['metadata']['name']}.json").write_text(json.dumps(obj), encoding="utf-8")
    print(f"mutatingwebhookconfiguration.admissionregistration.k8s.io/{obj['metadata']['name']} serverside-applied")
elif args[:2] == ["get", "mutatingwebhookconfiguration"]:
    path = store / f"{args[2]}.json"
    if path.exists():
        obj = json.loads(path.read_text(encoding="utf-8"))
        print(obj["metadata"].get("annotations", {}).get("podmutator.io/terraform-revision", ""), end="")
elif args[:2] == ["delete", "mutatingwebhookconfiguration"]:
    (store / f"{args[2]}.json").unlink(missing_ok=True)
    print(f'mutatingwebhookconfiguration.admissionregistration.k8s.io "{args[2]}" deleted')
else:
    sys.exit(f"fake kubectl: unexpected call {args}")
