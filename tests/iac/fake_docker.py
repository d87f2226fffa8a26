"""A stand-in for the Docker CLI in the tests, for docs/deploy.md's fetcher image: `docker login
--username AWS --password-stdin REGISTRY` (the password read from stdin) and `docker buildx build
--platform P -t REGISTRY/REPO:TAG --push .` (the build context must hold the Dockerfile). No image
is built: the push puts an image index naming each platform into the ECR repository through
boto3 (moto, at AWS_ENDPOINT_URL), so that the registry answers for the tag as after a real push.
Each call is appended, as JSON, to calls.jsonl beside this script's link (FAKE_DOCKER_LOG).
"""

import hashlib
import json
import os
import pathlib
import sys

import boto3
from botocore.exceptions import ClientError

args = sys.argv[1:]
log = pathlib.Path(os.environ["FAKE_DOCKER_LOG"])


def record(call):
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(call) + "\n")


if args[:1] == ["login"]:
    # `login --username AWS --password-stdin REGISTRY` (the flag takes no value).
    if args[1:3] != ["--username", "AWS"] or args[3] != "--password-stdin" or len(args) != 5:
        sys.exit(f"fake docker: unexpected arguments {args}")
    password = sys.stdin.read().strip()
    if not password:
        sys.exit("Error: Cannot perform an interactive login from a non TTY device")
    record({"login": args[4], "password_sha256": hashlib.sha256(password.encode()).hexdigest()})
    print("Login Succeeded")
    sys.exit(0)
if args[:2] == ["buildx", "build"]:
    rest = args[2:]
    if rest[-1:] != ["."] or "--push" not in rest:
        sys.exit(f"fake docker: unexpected arguments {args}")
    words = [a for a in rest[:-1] if a != "--push"]
    opts = dict(zip(words[::2], words[1::2]))
    if len(words) % 2 or sorted(opts) != ["--platform", "-t"]:
        sys.exit(f"fake docker: unexpected arguments {args}")
    if not pathlib.Path("Dockerfile").is_file():
        sys.exit("ERROR: failed to solve: failed to read dockerfile: open Dockerfile: no such file or directory")
    registry, _, path = opts["-t"].partition("/")
    repository, _, tag = path.rpartition(":")
    platforms = opts["--platform"].split(",")
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + hashlib.sha256(p.encode()).hexdigest(), "size": 1,
             "platform": {"os": p.split("/")[0], "architecture": p.split("/")[1]}}
            for p in platforms
        ],
    }
    try:
        boto3.client("ecr").put_image(repositoryName=repository, imageManifest=json.dumps(index), imageTag=tag)
    except ClientError as e:
        sys.exit(f"ERROR: failed to push {opts['-t']}: {e.response['Error']['Message']}")
    record({"build": opts["-t"], "registry": registry, "platforms": platforms})
    sys.exit(0)
sys.exit(f"fake docker: unexpected arguments {args}")
