#!/usr/bin/env bash
# curl against `conveyor serve-local --http 127.0.0.1:0` on the tiny-llama fixture: HF's greedy tokens
# by ids, an SSE stream read to [DONE], errors with their status codes, and /metrics.
# usage: curl_gateway_test.sh CONVEYOR_BIN FIXTURES_DIR
set -uo pipefail
bin=${1:?usage: curl_gateway_test.sh CONVEYOR_BIN FIXTURES_DIR}
fixtures=${2:?}
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$work/server.err" ] && sed 's/^/  server: /' "$work/server.err"; exit 1; }

"$bin" serve-local --model "$fixtures/tiny-llama" --listen 127.0.0.1:0 --http 127.0.0.1:0 --threads 1 \
  >"$work/server.out" 2>"$work/server.err" &
pid=$!
for _ in $(seq 100); do
  grep -q "HTTP on" "$work/server.out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || fail "serve-local exited"
  sleep 0.1
done
addr=$(grep -o "HTTP on [0-9.]*:[0-9]*" "$work/server.out" | awk '{print $3}')
[ -n "$addr" ] || fail "no 'HTTP on' line"
url="http://$addr"

# HF's greedy tokens for the fixture's 7-token prompt.
body=$(curl -sS --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":[989,229,186,822,100,504,324],"max_tokens":24,"temperature":0,"ignore_eos":true}') || fail "completions"
want='"token_ids":[371,119,801,572,692,735,572,698,641,53,1005,620,931,415,46,170,897,736,36,194,330,256,635,529]'
grep -qF "$want" <<<"$body" || fail "golden tokens: $body"
grep -qF '"finish_reason":"length"' <<<"$body" || fail "finish_reason: $body"

# A stream read to [DONE]: the ids of its chunks are the same tokens.
curl -sS -N --max-time 60 "$url/v1/completions" -d '{"prompt":[989,229,186,822,100,504,324],"max_tokens":24,
  "temperature":0,"ignore_eos":true,"stream":true}' >"$work/sse" || fail "stream"
[ "$(grep -c '^data: ' "$work/sse")" -ge 3 ] || fail "too few events: $(cat "$work/sse")"
[ "$(grep '^data: ' "$work/sse" | tail -n 1)" = "data: [DONE]" ] || fail "no [DONE] at the end"
ids=$(grep '^data: {' "$work/sse" | grep -o '"token_ids":\[[0-9,]*\]' | grep -o '[0-9][0-9,]*' | paste -sd, -)
[ "$ids" = "371,119,801,572,692,735,572,698,641,53,1005,620,931,415,46,170,897,736,36,194,330,256,635,529" ] \
  || fail "streamed ids $ids"

# Errors: status codes and OpenAI's error object.
code() { curl -sS -o "$work/err" -w '%{http_code}' --max-time 30 "$@"; }
[ "$(code "$url/v1/completions" -d '{"prompt":[1,99999]}')" = 400 ] || fail "out-of-vocabulary id not 400"
grep -qF '"param":"prompt"' "$work/err" || fail "error param: $(cat "$work/err")"
[ "$(code "$url/v1/completions" -d 'nope')" = 400 ] || fail "bad JSON not 400"
[ "$(code "$url/v1/completions" -d '{"prompt":"text"}')" = 400 ] || fail "text without tokenizer not 400"
[ "$(code "$url/v1/completions" -d '{"prompt":[1],"model":"other"}')" = 404 ] || fail "wrong model not 404"
[ "$(code "$url/v1/completions" -d '{"prompt":[1],"max_tokens":500,"ignore_eos":true,"timeout":0.02}')" = 504 ] \
  || fail "deadline not 504: $(cat "$work/err")"
[ "$(code "$url/nowhere")" = 404 ] || fail "unknown route not 404"
[ "$(code "$url/health")" = 200 ] || fail "health"
[ "$(code "$url/ready")" = 200 ] || fail "ready"

# Metrics: the names dashboards use, moved by the traffic above.
curl -sS --max-time 30 "$url/metrics" >"$work/metrics" || fail "metrics"
for name in conveyor_requests_running conveyor_requests_waiting conveyor_kv_cache_usage_ratio \
  conveyor_time_to_first_token_seconds_bucket conveyor_inter_token_latency_seconds_count \
  conveyor_e2e_request_latency_seconds_sum conveyor_request_queue_time_seconds_count \
  'conveyor_stage_busy_seconds_total{stage="0"}'; do
  grep -qF "$name" "$work/metrics" || fail "metric $name missing"
done
grep -qE '^conveyor_generation_tokens_total (4[89]|[5-9][0-9]|[0-9]{3,})$' "$work/metrics" \
  || fail "generation tokens did not move: $(grep generation_tokens_total "$work/metrics")"
grep -qF 'conveyor_request_finish_total{reason="deadline"} 1' "$work/metrics" || fail "deadline not counted"
echo "curl_gateway_test: ok (golden ids, SSE to [DONE], 400/404/504, metrics)"
