-- wrk script for scripts/bench-load.sh: POST one AdmissionReview (the file named by
-- $REVIEW_FILE) per request over keep-alive connections, and print the run's figures as one
-- parseable line (latencies in microseconds, as wrk measures them).
-- With REVIEW_FILE empty, plain GETs (for /healthz, the transport's ceiling).
local file = os.getenv("REVIEW_FILE") or ""
if file ~= "" then
  local f = assert(io.open(file, "rb"))
  wrk.method = "POST"
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = "application/json"
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d "
      .. "p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d mean_us=%.1f\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
