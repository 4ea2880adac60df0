#!/usr/bin/env bash
# serving.prefix_caching from the deployment file reaches the scheduler, in one process (serve-local
# --config) and in a cluster of two stage workers (serve): the 100-token golden prompt sent twice hits
# its 6 cached blocks (96 tokens) with caching on and nothing with it off; the tokens are HF's greedy
# ones every time. The counters are read with `conveyor client stats` (RPC Stats fields 11..).
# usage: prefix_caching_config_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$(cd "$2" && pwd)
dir=$(mktemp -d)
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# tests/fixtures/tiny-llama/golden.json, prompt 3 (100 tokens) and its 24 greedy tokens.
prompt=881,853,661,850,960,441,653,397,924,607,961,543,815,399,171,754,262,771,911,714,942,378,159,852,670,575,204,1004,748,541,698,31,198,146,689,751,182,98,586,145,491,221,37,45,57,128,917,312,656,548,667,234,314,185,834,553,645,414,516,804,749,97,586,658,54,929,684,672,539,789,810,40,98,814,586,467,181,602,770,710,764,194,977,842,715,718,529,333,152,578,873,928,1006,756,255,872,444,37,328,848
greedy="544 10 417 824 497 133 894 371 458 381 610 992 132 805 609 211 667 250 722 244 1012 871 394 231"

config() {  # config FILE STAGES CACHING
  cat >"$1" <<TOML
[model]
dir = "$fx/tiny-llama"
[parallel]
stages = $2
[frontend]
rpc_listen = "127.0.0.1:0"
[serving]
kv_blocks = 64
kv_block_size = 16
prefix_caching = $3
TOML
}
stat() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"; }

run_case() {  # run_case NAME COMMAND... : starts the server, two requests, reads stats
  local name=$1; shift
  "$@" >"$dir/$name.out" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "listening on" "$dir/$name.out" && break; sleep 0.1; done
  addr=$(sed -nE 's/.*listening on ([0-9.:]+).*/\1/p' "$dir/$name.out" | head -1)
  local a b s
  a=$("$bin" client generate --connect "$addr" --prompt-ids "$prompt" --max-new-tokens 24 --ignore-eos 2>&1)
  b=$("$bin" client generate --connect "$addr" --prompt-ids "$prompt" --max-new-tokens 24 --ignore-eos 2>&1)
  s=$("$bin" client stats --connect "$addr" 2>&1)
  kill "$server"; wait "$server" 2>/dev/null; server=
  [ "$a" = "$greedy" ] && [ "$b" = "$greedy" ] && ok "${name}_golden_tokens" || bad "$name tokens: $a / $b $(tail -5 "$dir/$name.out")"
  hits=$(stat prefix_cache_hit_tokens "$s")
  queried=$(stat prefix_cache_queried_tokens "$s")
  echo "     $name: prefix_cache_hit_tokens=$hits queried=$queried"
}

config "$dir/on1.toml" 1 true
run_case serve_local_on "$bin" serve-local --model "$fx/tiny-llama" --config "$dir/on1.toml" --listen 127.0.0.1:0 --threads 1
[ "$hits" = 96 ] && ok "serve_local_on_hits_96" || bad "serve-local on: hits=$hits"
config "$dir/off1.toml" 1 false
run_case serve_local_off "$bin" serve-local --model "$fx/tiny-llama" --config "$dir/off1.toml" --listen 127.0.0.1:0 --threads 1
[ "$hits" = 0 ] && [ "$queried" = 0 ] && ok "serve_local_off_no_hits" || bad "serve-local off: hits=$hits queried=$queried"

config "$dir/on2.toml" 2 true
run_case serve_cluster_on "$bin" serve --config "$dir/on2.toml"
[ "$hits" = 96 ] && ok "serve_cluster_on_hits_96" || bad "serve on: hits=$hits"
config "$dir/off2.toml" 2 false
run_case serve_cluster_off "$bin" serve --config "$dir/off2.toml"
[ "$hits" = 0 ] && [ "$queried" = 0 ] && ok "serve_cluster_off_no_hits" || bad "serve off: hits=$hits queried=$queried"
exit $fail
