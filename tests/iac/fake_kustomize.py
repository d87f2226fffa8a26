"""A stand-in for kustomize in tests/kustomize.rs, which runs docs/deploy.md's in-cluster commands
as written where kustomize itself is not installed: exactly `kustomize edit set image
NAME=NEWNAME@DIGEST`, the pinning step, in the current directory's kustomization.yaml. Like
kustomize, it replaces the `images` entry of that name or adds one (`name`, `newName`,
`digest`). Anything else is an error, so a change in the documented command shows up here.
"""

import pathlib
import sys

import yaml

args = sys.argv[1:]
if args[:3] != ["edit", "set", "image"] or len(args) != 4 or "=" not in args[3] or "@" not in args[3]:
    sys.exit(f"fake kustomize: unexpected call {args}")
name, image = args[3].split("=", 1)
new_name, digest = image.split("@", 1)
path = pathlib.Path("kustomization.yaml")
doc = yaml.safe_load(path.read_text(encoding="utf-8"))
images = [i for i in doc.get("images") or [] if i.get("name") != name]
images.append({"digest": digest, "name": name, "newName": new_name})
doc["images"] = images
path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
