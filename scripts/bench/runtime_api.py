#!/usr/bin/env python3
"""A loopback Lambda Runtime API for cold-start measurements (Python stdlib only).

Serves the two documented endpoints a function needs for one invocation:

    GET  /2018-06-01/runtime/invocation/next            -> the event, with the Lambda-Runtime-*
                                                           headers (request id, deadline, ARN)
    POST /2018-06-01/runtime/invocation/{id}/response   -> 202
    (and .../{id}/error, /runtime/init/error, which count as failures)

For each of --starts cold starts it spawns the function binary with AWS_LAMBDA_RUNTIME_API set
(host:port, as Lambda sets it), hands it one event, and records:

    init_ms   process start -> first GET /next (the runtime is ready)
    first_ms  process start -> the response POST has arrived (what the target is about)
    hwm_kb    VmHWM of the process right after its response (peak RSS of the function's image)

and, with --time-v, 3 more starts under GNU `time -v` for its "Maximum resident set size" (a
child forked from this Python process would inherit Python's RSS in ru_maxrss, so the figure is
taken under `time`, a small C program, as a cross-check of VmHWM).

The process is then killed (a Lambda sandbox is frozen, not stopped, after the response), and
the next start begins. One untimed start comes first to warm the page cache. A warm-path figure
is also taken: after the first response the same process gets --warm more events, timed from
event delivery to response.

Exit status: 0 when every start answered 200 with an allowed review carrying a JSON Patch;
1 on any crash, error report, timeout or wrong answer. Timings are never judged here.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/2018-06-01/runtime"


class Invocation:
    """One event waiting for one response."""

    def __init__(self, body: bytes):
        self.id = str(uuid.uuid4())
        self.body = body
        self.delivered_at = None
        self.answered_at = None
        self.response = None
        self.error = None
        self.done = threading.Event()


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.queue = []  # invocations not yet delivered
        self.by_id = {}
        self.available = threading.Condition(self.lock)
        self.generation = 0  # bumped per start; stale long-polls give up

    def reset(self):
        with self.lock:
            self.queue.clear()
            self.by_id.clear()
            self.generation += 1
            self.available.notify_all()

    def push(self, inv):
        with self.lock:
            self.queue.append(inv)
            self.by_id[inv.id] = inv
            self.available.notify_all()


class Server(ThreadingHTTPServer):
    """One server (own port, own state) per start, so a killed function's in-flight GET /next
    can never take the next start's event."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = State()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self):
        self.state.reset()
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address):
        # A killed function resets its keep-alive connection (and its pending long poll): normal.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, code, body=b"", headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self):
        if self.path != PREFIX + "/invocation/next":
            self._reply(404, b'{"errorMessage":"not found"}')
            return
        state = self.server.state
        with state.lock:
            gen = state.generation
            # Long poll, as Lambda does, until an event arrives or this start is over.
            while not state.queue and state.generation == gen:
                state.available.wait(timeout=1.0)
            if state.generation != gen:
                self.close_connection = True
                return
            inv = state.queue.pop(0)
        inv.delivered_at = time.perf_counter()
        deadline_ms = int((time.time() + 30) * 1000)
        self._reply(
            200,
            inv.body,
            {
                "Lambda-Runtime-Aws-Request-Id": inv.id,
                "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:podmutator",
                "Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
            },
        )

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        now = time.perf_counter()
        parts = self.path[len(PREFIX) :].strip("/").split("/")
        inv = None
        if len(parts) == 3 and parts[0] == "invocation":
            inv = self.server.state.by_id.get(parts[1])
        if inv is None:
            # /init/error or an unknown id: the function failed to start.
            sys.stderr.write("runtime_api: %s %s\n" % (self.path, body[:500].decode("utf-8", "replace")))
            for pending in list(self.server.state.by_id.values()):
                pending.error = "%s: %s" % (self.path, body[:500].decode("utf-8", "replace"))
                pending.done.set()
            self._reply(202, b'{"status":"OK"}')
            return
        inv.answered_at = now
        if parts[2] == "response":
            inv.response = body
        else:
            inv.error = body.decode("utf-8", "replace")
        inv.done.set()
        self._reply(202, b'{"status":"OK"}')


def check_reply(raw, patched=True):
    """None when the Lambda reply is a 200 allowing the pod, with a JSON Patch exactly when
    `patched`, else why not."""
    try:
        reply = json.loads(raw)
        if reply.get("statusCode") != 200:
            return "statusCode %r" % reply.get("statusCode")
        review = json.loads(reply["body"])
        resp = review["response"]
        if resp.get("allowed") is not True or (resp.get("patchType") == "JSONPatch") != patched:
            return "review response %s" % json.dumps(resp)[:300]
    except (ValueError, KeyError, TypeError) as e:
        return "reply is not an API Gateway response around a review: %s: %r" % (e, raw[:300])
    return None


def read_hwm_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def child_of(pid, timeout=5.0):
    """The (only) child of `pid`, e.g. the function under /usr/bin/time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.0005)
    return None


def one_start(binary, base_env, event, warm, timeout, time_v=None):
    """Spawn, invoke once (+ warm), stop. Returns a dict of figures or raises RuntimeError.

    With `time_v` (the path of GNU time) the function runs under `time -v`, and its "Maximum
    resident set size" is returned as `time_v_kb` (timings of such starts are not used)."""
    server = Server()
    env = dict(base_env, AWS_LAMBDA_RUNTIME_API="127.0.0.1:%d" % server.server_address[1])
    first = Invocation(event)
    server.state.push(first)
    cmd = [time_v, "-v", binary] if time_v else [binary]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # Its own process group, killed whole at the end: a wrapper (`time -v`, `strace -f`) can
        # die first and leave the function running with the stderr pipe open.
        start_new_session=True,
    )
    pid = child_of(proc.pid) if time_v else proc.pid
    try:
        if pid is None:
            raise RuntimeError("%s started no child" % time_v)
        if not first.done.wait(timeout):
            raise RuntimeError("no response within %.0f s (exit status %r)" % (timeout, proc.poll()))
        if first.error:
            raise RuntimeError("the function reported an error: %s" % first.error)
        why = check_reply(first.response)
        if why:
            raise RuntimeError("wrong answer: %s" % why)
        warm_ms = []
        for _ in range(warm):
            inv = Invocation(event)
            server.state.push(inv)
            if not inv.done.wait(timeout) or inv.error or check_reply(inv.response):
                raise RuntimeError("warm invocation failed: %s" % (inv.error or check_reply(inv.response or b"")))
            warm_ms.append((inv.answered_at - inv.delivered_at) * 1e3)
        if proc.poll() is not None:
            raise RuntimeError("the function exited (status %r) after answering" % proc.returncode)
        hwm = read_hwm_kb(pid)
    finally:
        if pid is not None and pid != proc.pid:
            # Under `time -v`: kill the function, and time reports and exits on its own.
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            # The function, or a wrapper that exec'd (`strace -o`): SIGTERM first, so a tracer
            # flushes its log, then SIGKILL for whatever is left of the group.
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=2)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        server.stop()
        stderr = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    time_v_kb = None
    if time_v:
        for line in stderr.splitlines():
            if "Maximum resident set size" in line:
                time_v_kb = int(line.split(":")[-1])
        stderr = "\n".join(l for l in stderr.splitlines() if not l.startswith(("\t", "Command ")))
    if stderr.strip():
        sys.stderr.write("function stderr: %s\n" % stderr.strip()[:2000])
    return {
        # The first event is handed out on the first GET /next: its delivery is "runtime ready".
        "init_ms": (first.delivered_at - t0) * 1e3,
        "first_ms": (first.answered_at - t0) * 1e3,
        "invoke_ms": (first.answered_at - first.delivered_at) * 1e3,
        "hwm_kb": hwm,
        "time_v_kb": time_v_kb,
        "warm_ms": warm_ms,
    }


def function_env():
    """What Lambda sets for a function (the Runtime API's address aside), and PATH."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_LAMBDA_FUNCTION_NAME": "podmutator",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/podmutator",
        "AWS_LAMBDA_LOG_STREAM_NAME": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "_HANDLER": "bootstrap",
        "LAMBDA_TASK_ROOT": "/var/task",
    }


def exec_baseline(binary, env, n):
    """Process start -> exit of `binary --version` (exec, dynamic loading, main, exit)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([binary, "--version"], env=env, stdout=subprocess.DEVNULL, check=True)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--event", required=True, help="Lambda event JSON file (the invocation payload)")
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--warm", type=int, default=20, help="extra invocations per start, for the warm figure")
    ap.add_argument("--timeout", type=float, default=15.0)
    ap.add_argument("--json", help="write the raw figures here")
    ap.add_argument("--time-v", help="GNU time: 3 more starts under `time -v` cross-check the peak RSS")
    args = ap.parse_args()

    with open(args.event, "rb") as f:
        event = f.read()
    json.loads(event)

    env = function_env()
    for k in ("PODMUTATOR_CONFIG", "PODMUTATOR_CONFIG_FILE", "RUST_LOG"):
        if k in os.environ:
            env[k] = os.environ[k]

    failures = 0
    runs = []
    try:
        one_start(args.binary, env, event, 0, args.timeout)  # untimed: page cache
    except RuntimeError as e:
        print("warm-up start failed: %s" % e, file=sys.stderr)
        failures += 1
    for i in range(args.starts):
        try:
            runs.append(one_start(args.binary, env, event, args.warm if i == 0 else 0, args.timeout))
        except RuntimeError as e:
            print("start %d failed: %s" % (i + 1, e), file=sys.stderr)
            failures += 1
    checks = []
    if args.time_v:
        for _ in range(3):
            try:
                checks.append(one_start(args.binary, env, event, 0, args.timeout, args.time_v))
            except RuntimeError as e:
                print("start under time -v failed: %s" % e, file=sys.stderr)
                failures += 1
    baseline = exec_baseline(args.binary, env, args.starts)

    if runs:
        first = [r["first_ms"] for r in runs]
        init = [r["init_ms"] for r in runs]
        invoke = [r["invoke_ms"] for r in runs]
        hwm = [r["hwm_kb"] for r in runs if r["hwm_kb"]]
        time_v = [r["time_v_kb"] for r in checks if r["time_v_kb"]]
        warm = runs[0]["warm_ms"]
        row = "%-44s %9s %9s %9s %9s"
        print(row % ("cold start (%d starts)" % len(runs), "median", "p90", "max", "min"))
        for name, vals in [
            ("process start -> first response, ms", first),
            ("  of which start -> runtime ready, ms", init),
            ("  of which first invocation, ms", invoke),
            ("warm invocation (%d, same process), ms" % len(warm), warm),
            ("baseline: `podmutator --version`, ms", baseline),
        ]:
            if vals:
                print(row % (name, "%.2f" % statistics.median(vals), "%.2f" % pct(vals, 0.9),
                             "%.2f" % max(vals), "%.2f" % min(vals)))
        for name, vals in [
            ("peak RSS (VmHWM after response), MiB", hwm),
            ("peak RSS (`time -v` max RSS, %d starts), MiB" % len(time_v), time_v),
        ]:
            if vals:
                mib = [v / 1024 for v in vals]
                print(row % (name, "%.1f" % statistics.median(mib), "%.1f" % pct(mib, 0.9),
                             "%.1f" % max(mib), "%.1f" % min(mib)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "time_v": checks, "baseline_ms": baseline, "failures": failures}, f, indent=1)
    if failures:
        print("FAILED: %d start(s) did not answer correctly" % failures, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
