#!/usr/bin/env python3
"""Instructions per invocation of the whole Lambda loop, under callgrind (Python stdlib only).

Driven by scripts/bench-loop-instructions.sh. The function binary runs as Lambda runs it,
against a loopback Runtime API (scripts/bench/runtime_api.py's server, 127.0.0.1 only), under
`valgrind --tool=callgrind`, for N and then 2N invocations of one event; the difference over N
is the count per invocation, start-up and exit excluded. Each variant is one configuration of
the same binary and event:

  default   the configuration's logs (RUST_LOG=info) and its EMF metrics line
  no-emf    the same, metrics off
  quiet     metrics off and RUST_LOG=off: no line at all

and the breakdown is their differences, beside what the instruction harness (benches/
instructions.rs, --harness; the same N and 2N method) counts for the same case's event (the
event's bytes deserialised, the transport's handler, the reply serialised):

  the Runtime API client   quiet - harness: the GET /next and POST /response round trips
                           through lambda_runtime's hyper client, the event's headers, the
                           tokio wake-ups, the invocation's span and context
  event, review, reply     the harness's count
  the EMF line             default's metrics on - off
  the log lines            no-emf - quiet

Every response is checked: 200 with an allowed review (a patch or none, as --mutated says).
Exit status 1 on a wrong answer, a crash or an error report.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import marginal, total_of  # noqa: E402
from runtime_api import Invocation, Server, check_reply, function_env  # noqa: E402

VARIANTS = {
    "default": {"RUST_LOG": "info"},
    "no-emf": {"RUST_LOG": "info", "metrics": False},
    "quiet": {"RUST_LOG": "off", "metrics": False},
}
TIMEOUT_S = 600  # a hang guard only: callgrind runs the function about 50 times slower


def lambda_env(port, config, rust_log):
    return dict(
        function_env(),
        AWS_LAMBDA_RUNTIME_API="127.0.0.1:%d" % port,
        PODMUTATOR_CONFIG=json.dumps(config),
        RUST_LOG=rust_log,
    )


def run(binary, event, n, config, rust_log, mutated, out):
    """Total instructions of one process that answers `n` invocations, then stops on SIGTERM."""
    server = Server()
    env = lambda_env(server.server_address[1], config, rust_log)
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=%s" % out, binary]
    # Files, not pipes: a pipe nobody reads until the end fills (64 KiB, about 70 invocations'
    # lines) and stops the function in its next write.
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, start_new_session=True)
    failure = None
    try:
        for i in range(n):
            inv = Invocation(event)
            server.state.push(inv)
            if not inv.done.wait(TIMEOUT_S):
                failure = "no response to invocation %d (exit status %r)" % (i + 1, proc.poll())
                break
            why = inv.error or check_reply(inv.response, mutated)
            if why:
                failure = "invocation %d: %s" % (i + 1, why)
                break
    finally:
        # Lambda freezes a sandbox; here the process is stopped so that callgrind writes its
        # profile, while it waits for the next event.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=TIMEOUT_S)
        server.stop()
    stdout.seek(0)
    stderr.seek(0)
    lines = stdout.read().decode("utf-8", "replace").splitlines()
    stderr = stderr.read().decode("utf-8", "replace")
    if failure:
        raise RuntimeError("%s; the function's stderr ends:\n%s" % (failure, stderr[-3000:]))
    return total_of(out), lines


def per_invocation(binary, event, n, config, rust_log, mutated, out_dir, name):
    t1, _ = run(binary, event, n, config, rust_log, mutated, Path(out_dir) / ("%s.%d.out" % (name, n)))
    t2, lines = run(binary, event, 2 * n, config, rust_log, mutated, Path(out_dir) / ("%s.%d.out" % (name, 2 * n)))
    # The 2N run's stdout lines, printed as a check that each configuration logs what it says.
    return (t2 - t1) / n, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the function binary (podmutator)")
    ap.add_argument("--harness", required=True, help="the instruction harness (benches/instructions.rs)")
    ap.add_argument("--case", default="bare", help="the harness's case whose event is sent")
    ap.add_argument("--config", required=True,
                    help="the configuration the harness builds the case with, JSON (PODMUTATOR_CONFIG)")
    ap.add_argument("--mutated", action="store_true", help="the case's pod is patched")
    ap.add_argument("-n", type=int, default=50, help="invocations in the first run (the second has 2N)")
    ap.add_argument("--keep", help="keep the profiles in this directory")
    args = ap.parse_args()

    event = subprocess.run([args.harness, args.case, "--event"], check=True, capture_output=True).stdout
    base = json.loads(args.config)
    out_dir = args.keep or tempfile.mkdtemp(prefix="loop-instructions-")
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    try:
        harness, _, _ = marginal(args.harness, args.case, args.n, out_dir)
        print("harness  %12s instructions / review" % format(round(harness), ","), file=sys.stderr)
        for name, v in VARIANTS.items():
            config = json.loads(json.dumps(base))
            if v.get("metrics") is False:
                config.setdefault("metrics", {})["enabled"] = False
            counts[name], lines = per_invocation(args.binary, event, args.n, config, v["RUST_LOG"],
                                                 args.mutated, out_dir, name)
            print("%-8s %12s instructions / invocation; stdout %d lines over %d invocations"
                  % (name, format(round(counts[name]), ","), len(lines), 2 * args.n), file=sys.stderr)
    except RuntimeError as e:
        sys.exit("bench-loop-instructions: FAILED: %s" % e)
    finally:
        if not args.keep:
            for f in Path(out_dir).glob("*.out"):
                f.unlink()
            os.rmdir(out_dir)

    whole = counts["default"]
    parts = [
        ("the Runtime API client and the loop", counts["quiet"] - harness),
        ("event, review and reply (the harness)", harness),
        ("the EMF metrics line", counts["default"] - counts["no-emf"]),
        ("the log lines", counts["no-emf"] - counts["quiet"]),
    ]
    print("| part | instructions / invocation | share |")
    print("|---|---:|---:|")
    for name, v in parts:
        print("| %s | %s | %.1f%% |" % (name, format(round(v), ","), 100 * v / whole))
    print("| **whole loop** | **%s** | 100%% |" % format(round(whole), ","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
