#!/usr/bin/env python3
"""Runs the shell commands of the README and docs/development.md exactly as they are written.

Every ```sh block of the documents is run, in order, in one bash session (so an `export` holds for
the commands after it, and a server the README starts answers development.md's commands), under
`set -euo pipefail`. Two kinds of line are
servers that a reader leaves running in one terminal while typing the rest in another; they are
started in the background and waited for (their own start line, not a sleep):

    cargo run ... serve ...      until it logs "serving https"
    cargo lambda watch ...       until it logs "starting Runtime server"

and stopped when the last document's commands are done. Each other command must exit 0, and a command
that sends a review (its text names /mutate--v1-pod or `cargo lambda invoke`) must print an
answer that admits the pod (`"allowed": true`, as JSON or inside a Lambda reply's body), the
decoded patch (`"op": "add"`) or, for the health check, `"ok"`. `scripts/test.sh` is not run again here: CI's first step is exactly that.

Usage: scripts/doc-commands.py [DOC[#NAME]...]   (default: README.md docs/development.md)
       DOC#NAME runs only the block of DOC that `<!-- doc-commands: NAME -->` names (the line
       before its opening fence), e.g. docs/performance.md#instructions-check: a block added
       above it, or moved, leaves the selection where it was.
Run from a clone's root; CI (.ci/run) runs it after the tests, on its clean clone.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "docs/development.md"]
# Lines a reader leaves running, and the line each logs once it answers.
SERVERS = [
    (re.compile(r"^cargo run\b.*\bserve\b"), "serving https"),
    (re.compile(r"^cargo lambda watch\b"), "starting Runtime server"),
]
# Run by CI itself, first; running it again here would double CI's time.
NOT_AGAIN = {"scripts/test.sh"}
# How long a server may take to print its start line: a build from a fresh clone included. A
# bound only so that a server that never starts fails CI instead of hanging it.
START_LIMIT_S = 1800


MARKER = re.compile(r"^<!-- doc-commands: ([a-z0-9-]+) -->$")


def blocks(path):
    """The ```sh blocks of a Markdown file: (line number, name, commands), each command's lines
    joined; the name is the marker on the line before the fence, or None."""
    out = []
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("```sh", "```bash", "```shell"):
            marker = MARKER.match(lines[i - 1].strip()) if i else None
            name = marker.group(1) if marker else None
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            commands, current = [], ""
            for line in body:
                stripped = line.strip()
                if not current and (not stripped or stripped.startswith("#")):
                    continue
                current += line.rstrip()
                if current.endswith("\\"):
                    current = current[:-1] + " "
                    continue
                # A pipe or `&&` at the end of a line goes on, as in the shell.
                if current.endswith(("|", "&&")):
                    current += " "
                    continue
                # A comment after the command is the reader's, not the shell's concern; keep it.
                commands.append(current.strip())
                current = ""
            if current:
                commands.append(current.strip())
            out.append((start, name, commands))
        i += 1
    return out


PRELUDE = r"""
set -euo pipefail
cd "$ROOT"
servers=()
stop_servers() {
	local pid
	for pid in "${servers[@]}"; do
		kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
	done
	for pid in "${servers[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
}
out_file=$(mktemp)
trap 'stop_servers; rm -f "$out_file"' EXIT
# start_server LOG NEEDLE COMMAND: COMMAND in its own process group, until LOG holds NEEDLE.
start_server() {
	local log=$1 needle=$2 cmd=$3
	echo "+ $cmd &   (waiting for \"$needle\")" >&2
	: >"$log"
	set -m
	bash -c "$cmd" >>"$log" 2>&1 &
	set +m
	local pid=$!
	servers+=("$pid")
	local waited=0
	until grep -q -- "$needle" "$log"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "doc-commands: the server stopped before it started: $cmd" >&2
			cat "$log" >&2
			exit 1
		fi
		if ((waited >= START_LIMIT_S)); then
			echo "doc-commands: no \"$needle\" after $START_LIMIT_S s: $cmd" >&2
			tail -n 40 "$log" >&2
			exit 1
		fi
		sleep 1
		waited=$((waited + 1))
	done
	echo "doc-commands: started after ${waited} s" >&2
}
# run_command KIND COMMAND: COMMAND as typed; its output is shown and, by KIND, checked.
run_command() {
	local kind=$1 cmd=$2 out
	echo "+ $cmd" >&2
	# In this shell, not a subshell: an `export` holds for the commands after it.
	eval "$cmd" >"$out_file"
	out=$(<"$out_file")
	# A long output (a profile's listing) is shown by its head.
	head -n 60 "$out_file"
	local lines
	lines=$(wc -l <"$out_file")
	((lines <= 60)) || echo "... ($lines lines)"
	case $kind in
	review)
		# An admitted review as JSON, or inside a Lambda reply's body; the decoded patch; the
		# health check.
		if ! grep -Eq '"allowed": ?true|\\"allowed\\":true|"op": ?"add"|"message": ?"ok"|\\"message\\":\\"ok\\"' <<<"$out"; then
			echo "doc-commands: the answer does not admit the pod: $cmd" >&2
			exit 1
		fi
		;;
	esac
}
"""


def selected(doc):
    """The blocks of `DOC` or, for `DOC#NAME`, the one block its marker names."""
    path, _, name = doc.partition("#")
    found = [(line, commands) for line, n, commands in blocks(path) if not name or n == name]
    if name and len(found) != 1:
        names = sorted({n for _, n, _ in blocks(path) if n})
        sys.exit(f"doc-commands: {path} has {len(found)} sh blocks named {name!r} (its names: {names})")
    return found


def script_for(docs):
    parts = [PRELUDE]
    n = 0
    for doc, line, commands in ((d, l, c) for d in docs for l, c in selected(d)):
        for cmd in commands:
            parts.append("echo " + shlex.quote(f"== {doc}, the block at line {line}") + " >&2")
            if cmd in NOT_AGAIN:
                note = f"doc-commands: {cmd} is CI's first step, not run again"
                parts.append("echo " + shlex.quote(note) + " >&2")
                continue
            server = next((needle for pattern, needle in SERVERS if pattern.search(cmd)), None)
            if server:
                n += 1
                log = os.path.join(tempfile.gettempdir(), f"doc-commands-{os.getpid()}-{n}.log")
                parts.append(f"start_server {shlex.quote(log)} {shlex.quote(server)} {shlex.quote(cmd)}")
                continue
            kind = "review" if ("mutate--v1-pod" in cmd or "cargo lambda invoke" in cmd) else "plain"
            parts.append(f"run_command {kind} {shlex.quote(cmd)}")
    return "\n".join(parts) + "\n"


def main(argv):
    docs = argv[1:] or DOCS
    for doc in docs:
        if not selected(doc):
            print(f"doc-commands: {doc} has no sh block", file=sys.stderr)
            return 1
    env = dict(os.environ, ROOT=ROOT, START_LIMIT_S=str(START_LIMIT_S))
    rc = subprocess.run(["bash", "-c", script_for(docs)], env=env).returncode
    if rc != 0:
        print(f"doc-commands: a command of {', '.join(docs)} failed (exit {rc})", file=sys.stderr)
        return 1
    print(f"doc-commands: every command of {', '.join(docs)} ran as written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
