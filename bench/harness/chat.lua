-- wrk script for bench/gateway.py: POST the body in BENCH_BODY with BENCH_AUTH as the bearer key to BENCH_PATH,
-- and print one JSON line of results (latencies in microseconds) for the bench to read.
wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH")
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTH")
if auth and auth ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. auth
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"bytes":%d,"non2xx":%d,"socket_errors":%d,' ..
    '"p50":%d,"p99":%d,"p999":%d,"mean":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, errors.status,
    errors.connect + errors.read + errors.write + errors.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.mean))
end
