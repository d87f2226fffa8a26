"""A stand-in for kubectl in tests/terraform_apply.rs and tests/iac.rs: keeps
MutatingWebhookConfigurations as JSON files in $FAKE_KUBE_DIR, and understands exactly the calls
modules/registration makes (server-side apply from stdin, get of the revision annotation,
delete), a client-side `apply -f -` that creates (docs/deploy.md's SAM registration), those
scripts/registration-drift.sh makes (create --dry-run=client -o json, get -f -
-o json --show-managed-fields, diff --server-side), and the `replace -f -` docs/deploy.md
restores foreign fields with. Anything else is an error, so a change in their commands shows up
here. A leading `--kubeconfig FILE` stands for KUBECONFIG.

With $FAKE_KUBE_CLUSTER set, every call must come with a kubeconfig whose current context is
that EKS cluster (what tests/iac/fake_aws.py's `eks update-kubeconfig` writes), as a real
kubectl would need credentials for it.

The stored object is what the API server would hold: server-side apply merges as the server
does, by field manager (metadata.managedFields, FieldsV1): the manager's fields are set, those
it set before and no longer applies are removed unless another manager owns them, and every
other manager's fields stay (--force-conflicts moves the contested ones to the applier).
`webhooks` and `matchConditions` are lists keyed by `name`, every other list is atomic. The
server's own fields are written as it writes them (uid, creationTimestamp, resourceVersion,
generation) and so are the defaults it fills into each webhook entry (failurePolicy,
matchPolicy, namespaceSelector, objectSelector, reinvocationPolicy, timeoutSeconds). A test may
also write the file directly, as another manager or a `kubectl edit` would change the object.

`diff` answers as kubectl does: the live object against the server-side dry-run apply, both
without managedFields, as `diff -u` of their JSON, exit status 0 when equal, 1 when not. So a
field another manager owns is on both sides and never in the diff, as with a real server.
`replace` puts the object as given (an update of the whole object): every field it lacks goes,
other managers' included.
"""

import copy
import datetime
import difflib
import json
import os
import pathlib
import sys
import uuid

import yaml

store = pathlib.Path(os.environ["FAKE_KUBE_DIR"])
args = sys.argv[1:]
with open(store / "calls.log", "a", encoding="utf-8") as log:
    log.write(json.dumps(args) + "\n")

kubeconfig = os.environ.get("KUBECONFIG")
if args[:1] == ["--kubeconfig"] and len(args) > 1:
    kubeconfig, args = args[1], args[2:]

cluster = os.environ.get("FAKE_KUBE_CLUSTER")
if cluster:
    try:
        config = json.loads(pathlib.Path(kubeconfig).read_text(encoding="utf-8"))
    except (TypeError, OSError, ValueError) as e:
        sys.exit(f"fake kubectl: no kubeconfig for cluster {cluster}: {e!r}")
    if not config.get("current-context", "").endswith(f":cluster/{cluster}"):
        sys.exit(f"fake kubectl: the kubeconfig's context {config.get('current-context')!r} is not cluster {cluster}")

KIND = "mutatingwebhookconfiguration.admissionregistration.k8s.io"
API_VERSION = "admissionregistration.k8s.io/v1"
KEYED = ("f:webhooks", "f:matchConditions")
# What the API server fills into a webhook entry that leaves them out (admissionregistration/v1).
DEFAULTS = {
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "reinvocationPolicy": "Never",
    "timeoutSeconds": 10,
}


def stored(name):
    path = store / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def save(obj):
    (store / f"{obj['metadata']['name']}.json").write_text(json.dumps(obj), encoding="utf-8")


def from_stdin():
    obj = yaml.safe_load(sys.stdin)
    if not isinstance(obj, dict) or obj.get("kind") != "MutatingWebhookConfiguration":
        sys.exit("fake kubectl: not a MutatingWebhookConfiguration")
    return obj


# --- field sets: paths of FieldsV1 keys ("f:<field>", 'k:{"name":...}', "." for a list item) ---


def item_key(item):
    return "k:" + json.dumps({"name": item.get("name")}, separators=(",", ":"))


def fields(value, path=()):
    """The leaf paths an object sets (apiVersion, kind and metadata.name are its identity)."""
    out = set()
    if isinstance(value, dict) and value:
        for k, v in value.items():
            if path == () and k in ("apiVersion", "kind"):
                continue
            if path == ("f:metadata",) and k == "name":
                continue
            out |= fields(v, path + ("f:" + k,))
    elif isinstance(value, list) and path and path[-1] in KEYED:
        for item in value:
            out.add(path + (item_key(item), "."))
            out |= fields(item, path + (item_key(item),))
    else:
        out.add(path)
    return out


def to_tree(paths):
    tree = {}
    for p in paths:
        node = tree
        for e in p:
            node = node.setdefault(e, {})
    return tree


def from_tree(tree, path=()):
    out = set()
    for k, sub in tree.items():
        out |= from_tree(sub, path + (k,)) if sub else {path + (k,)}
    return out


def managed(obj):
    """manager -> (its managedFields entry, its field set)."""
    return {
        e["manager"]: (e, from_tree(e.get("fieldsV1", {})))
        for e in (obj or {}).get("metadata", {}).get("managedFields", [])
    }


def step(node, e):
    if e.startswith("f:"):
        return node.get(e[2:]) if isinstance(node, dict) else None
    name = json.loads(e[2:])["name"]
    return next((i for i in node if isinstance(i, dict) and i.get("name") == name), None) if isinstance(node, list) else None


def exists(obj, path):
    node = obj
    for e in path:
        if e == ".":
            return node is not None
        node = step(node, e)
        if node is None:
            return False
    return True


def remove(obj, path):
    """Removes one leaf path (an item's "." removes the item)."""
    if path[-1] == ".":
        parent, last = path[:-2], path[-2]
    else:
        parent, last = path[:-1], path[-1]
    node = obj
    for e in parent:
        node = step(node, e)
        if node is None:
            return
    if last.startswith("f:") and isinstance(node, dict):
        node.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(node, list):
        target = step(node, last)
        if path[-1] == "." and target is not None:
            node.remove(target)


def merge(live, applied, path=()):
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for k, v in applied.items():
            out[k] = merge(live[k], v, path + ("f:" + k,)) if k in live else copy.deepcopy(v)
        return out
    if isinstance(live, list) and isinstance(applied, list) and path and path[-1] in KEYED:
        out = list(live)
        for item in applied:
            at = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get("name") == item.get("name")), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = merge(out[at], item, path + (item_key(item),))
        return out
    return copy.deepcopy(applied)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(manager, operation, paths, previous=None):
    e = dict(previous or {"manager": manager, "operation": operation, "apiVersion": API_VERSION, "fieldsType": "FieldsV1"})
    e.update(time=now(), fieldsV1=to_tree(paths))
    return e


def as_server_writes(obj, live, bump):
    """The defaults and the server's own fields, as the API server writes them."""
    for w in obj.get("webhooks", []):
        for k, v in DEFAULTS.items():
            w.setdefault(k, copy.deepcopy(v))
    meta = obj["metadata"]
    old = (live or {}).get("metadata", {})
    meta["uid"] = old.get("uid") or str(uuid.uuid4())
    meta["creationTimestamp"] = old.get("creationTimestamp") or now()
    if live is None:
        meta["generation"] = 1
    else:
        meta["generation"] = old.get("generation", 1) + (obj.get("webhooks") != live.get("webhooks"))
    version = int(old.get("resourceVersion", "0"))
    meta["resourceVersion"] = str(version + 1 if bump else version)
    return obj


def server_side_apply(live, applied, manager, bump=True):
    new = fields(applied)
    if live is None:
        result = copy.deepcopy(applied)
        entries = [entry(manager, "Apply", new)]
    else:
        owners = managed(live)
        previous, old = owners.pop(manager, (None, set()))
        # --force-conflicts: what the applier sets is its own now.
        others = {m: (e, paths - new) for m, (e, paths) in owners.items()}
        kept = set().union(*(paths for _, paths in others.values()))
        result = copy.deepcopy(live)
        for p in sorted(old - new, key=len, reverse=True):
            if not any(q[: len(p)] == p for q in kept):
                remove(result, p)
        result = merge(result, applied)
        entries = [entry(manager, "Apply", new, previous)] + [entry(m, None, paths, e) for m, (e, paths) in others.items() if paths]
    result.setdefault("metadata", {})["managedFields"] = entries
    return as_server_writes(result, live, bump)


def without_managed_fields(obj):
    if obj is None:
        return None
    obj = copy.deepcopy(obj)
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def expect(want):
    if args != want:
        sys.exit(f"fake kubectl: unexpected arguments {args} (expected {want})")


if args == ["apply", "-f", "-"]:
    # docs/deploy.md's SAM registration, `... | kubectl apply -f -`: a client-side apply, which
    # creates the object with the last-applied annotation. Over an existing object (a three-way
    # merge) it is not emulated: an error here.
    obj = yaml.safe_load(sys.stdin.read())
    if obj.get("kind") != "MutatingWebhookConfiguration":
        sys.exit(f"fake kubectl: apply of a {obj.get('kind')!r}")
    path = store / f"{obj['metadata']['name']}.json"
    if path.exists():
        sys.exit("fake kubectl: a client-side apply over an existing object is not emulated")
    last = json.dumps(obj, separators=(",", ":"))
    obj["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = last
    save(as_server_writes(obj, None, True))
    print(f"mutatingwebhookconfiguration.admissionregistration.k8s.io/{obj['metadata']['name']} created")
elif args[:1] == ["apply"]:
    expect(["apply", "--server-side", "--force-conflicts", "--field-manager", "podmutator-terraform", "-f", "-"])
    obj = from_stdin()
    save(server_side_apply(stored(obj["metadata"]["name"]), obj, args[4]))
    print(f"{KIND}/{obj['metadata']['name']} serverside-applied")
elif args[:1] == ["create"]:
    expect(["create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-"])
    print(json.dumps(from_stdin(), indent=4))
elif args[:3] == ["get", "-f", "-"]:
    expect(["get", "-f", "-", "--ignore-not-found", "--show-managed-fields", "-o", "json"])
    live = stored(from_stdin()["metadata"]["name"])
    if live is not None:
        print(json.dumps(live, indent=4))
elif args[:2] == ["get", "mutatingwebhookconfiguration"]:
    expect(["get", "mutatingwebhookconfiguration", args[2] if len(args) > 2 else None, "--ignore-not-found", "-o",
            "jsonpath={.metadata.annotations.podmutator\\.io/terraform-revision} {.metadata.annotations.podmutator\\.io/terraform-instance}"])
    obj = stored(args[2])
    if obj is not None:
        notes = obj["metadata"].get("annotations", {})
        print(f"{notes.get('podmutator.io/terraform-revision', '')} {notes.get('podmutator.io/terraform-instance', '')}", end="")
elif args[:1] == ["diff"]:
    expect(["diff", "--server-side", "--force-conflicts", "--field-manager", args[4] if len(args) > 4 else None, "-f", "-"])
    obj = from_stdin()
    live = stored(obj["metadata"]["name"])
    merged = server_side_apply(live, obj, args[4], bump=False)
    name = f"admissionregistration.k8s.io.v1.MutatingWebhookConfiguration..{obj['metadata']['name']}"
    lines = list(difflib.unified_diff(
        json.dumps(without_managed_fields(live), indent=2, sort_keys=True).splitlines() if live is not None else [],
        json.dumps(without_managed_fields(merged), indent=2, sort_keys=True).splitlines(),
        fromfile=f"/tmp/LIVE-1/{name}", tofile=f"/tmp/MERGED-1/{name}", lineterm="",
    ))
    print("\n".join(lines))
    sys.exit(1 if lines else 0)
elif args[:1] == ["replace"]:
    expect(["replace", "-f", "-"])
    obj = from_stdin()
    live = stored(obj["metadata"]["name"])
    if live is None:
        sys.exit(f'Error from server (NotFound): error when replacing "STDIN": {KIND} "{obj["metadata"]["name"]}" not found')
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("managedFields", None)
    given = fields(obj)
    as_server_writes(obj, live, bump=True)
    # Each manager keeps what is still there; what no one owned is the replacer's.
    owners = {m: (e, {p for p in paths if exists(obj, p)}) for m, (e, paths) in managed(live).items()}
    owned = set().union(*(paths for _, paths in owners.values()))
    entries = [entry(m, None, paths, e) for m, (e, paths) in owners.items() if paths]
    mine = given - owned
    entries.append(entry("kubectl-replace", "Update", mine))
    obj["metadata"]["managedFields"] = entries
    save(obj)
    print(f"{KIND}/{obj['metadata']['name']} replaced")
elif args[:2] == ["delete", "mutatingwebhookconfiguration"]:
    (store / f"{args[2]}.json").unlink(missing_ok=True)
    print(f'{KIND} "{args[2]}" deleted')
else:
    sys.exit(f"fake kubectl: unexpected call {args}")
