"""Applies each golden case's JSON Patch to its original pod with Python's `jsonpatch`.

An implementation independent of ours (tests/golden.rs compares the results with the pod our
own application of the patch gives). Reads one JSON array from stdin,
`[{"name": str, "doc": {...}, "patch": [...]}, ...]`, and writes one JSON array to stdout,
`[{"name": str, "result": {...}} | {"name": str, "error": str}, ...]`, in the same order, so
all cases run in one process.
"""

import json
import sys

import jsonpatch


def main() -> int:
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        try:
            patch = jsonpatch.JsonPatch(case["patch"])
            result = patch.apply(case["doc"], in_place=False)
            out.append({"name": case["name"], "result": result})
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            out.append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
