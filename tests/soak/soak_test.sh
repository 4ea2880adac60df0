#!/usr/bin/env bash
# Soak (issue 10, "Load"): `conveyor serve` with a 2-stage CPU cluster of worker processes, then
# conveyor_soak holds CONCURRENCY streaming RPC requests in flight for DURATION seconds and checks none
# lost, none duplicated, the server's counts, and flat RSS of the server and both workers after WARMUP.
# usage: soak_test.sh CONVEYOR_BINARY SOAK_BINARY MODEL_DIR DURATION_S WARMUP_S CONCURRENCY [MAX_NEW_TOKENS]
set -u
bin=$1; soak=$2; model=$3; duration=$4; warmup=$5; concurrency=$6; new_tokens=${7:-8}
tmp=$(mktemp -d); server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
# A queue that holds every client (the default 100 would reject most of them as overloaded, which is
# correct behaviour but not what this test measures), and a KV cache that cannot hold them all at
# once, so requests wait, start and finish all the time.
cat >"$tmp/soak.toml" <<TOML
[parallel]
stages = 2
[serving]
batching = "continuous"
max_batch_size = 64
max_batch_tokens = 1024
job_queue_size = $((concurrency + 100))
kv_block_size = 16
kv_blocks = 96
max_context = 256
response_timeout_s = 600
[frontend]
rpc_listen = "127.0.0.1:0"
TOML
"$bin" serve --config "$tmp/soak.toml" --model "$model" >"$tmp/out" 2>"$tmp/err" &
server=$!
for _ in $(seq 1 600); do grep -q "listening on" "$tmp/out" && break; kill -0 $server 2>/dev/null || break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out" | head -1)
[ -n "$addr" ] || { echo "FAIL serve did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
# 1,000 client threads each keep a stream open; their stacks are what this process needs most.
ulimit -s 1024
"$soak" --connect "$addr" --server-pid "$server" --concurrency "$concurrency" --connections 16 \
  --duration-s "$duration" --warmup-s "$warmup" --max-new-tokens "$new_tokens"
rc=$?
if ! kill -0 $server 2>/dev/null; then echo "FAIL the server died during the soak"; cat "$tmp/err"; exit 1; fi
exit $rc
