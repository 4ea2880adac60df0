#!/usr/bin/env bash
# conveyor client against conveyor serve-local, from the outside: golden tokens streamed over RPC,
# health/stats/info, one clear line per bad input, and a client killed mid-stream frees its blocks.
# usage: client_cli_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$2
fail=0
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Port 0: the server picks a free port and prints it.
"$bin" serve-local --model "$fx/tiny-llama" --listen 127.0.0.1:0 --threads 1 >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
addr=
for _ in $(seq 1 200); do
  addr=$(sed -n 's/^conveyor serve-local: listening on \([^ ]*\) .*/\1/p' "$work/server.out")
  [ -n "$addr" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.05
done
if [ -z "$addr" ]; then
  echo "FAIL server did not start: $(cat "$work/server.out" "$work/server.err")"; exit 1
fi
echo "ok   server listening on $addr"

check() {  # check NAME EXPECTED_RC REGEX -- ARGS...
  local name=$1 want_rc=$2 regex=$3; shift 4
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ] || ! grep -qE -- "$regex" <<<"$out"; then
    echo "FAIL $name: rc=$rc (want $want_rc), output: $out"; fail=1; return
  fi
  if [ "$want_rc" != 0 ] && [ "$(wc -l <<<"$out")" != 1 ]; then
    echo "FAIL $name: error should be one line, got: $out"; fail=1; return
  fi
  echo "ok   $name"
}
stat() {  # stat KEY: one number from conveyor client stats
  "$bin" client stats --connect "$addr" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}

# tiny-llama prompt 1 and its 24 HF greedy tokens (tests/fixtures/tiny-llama/golden.json).
ids=989,229,186,822,100,504,324
golden='371,119,801,572,692,735,572,698,641,53,1005,620,931,415,46,170,897,736,36,194,330,256,635,529'
check golden_json 0 "^\{\"tokens\":\[$golden\],\"finish_reason\":\"length\",\"prompt_tokens\":7,\"completion_tokens\":24" -- \
  client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --format json
check golden_text 0 "^${golden//,/ }\$" -- client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 24 --ignore-eos
check sampled 0 '"tokens":\[[0-9]+(,[0-9]+){7}\]' -- \
  client generate --connect "$addr" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-k 50 --top-p 0.9 --seed 7 --ignore-eos --format json
a=$("$bin" client generate --connect "$addr" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --seed 7 --ignore-eos)
b=$("$bin" client generate --connect "$addr" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --seed 7 --ignore-eos)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   seed_is_reproducible"; else echo "FAIL seed: '$a' / '$b'"; fail=1; fi
check health 0 '^\{"ready":true,"stages":\[\{"stage":0,"tp_rank":0,"state":"ready"' -- client health --connect "$addr"
check info 0 '"model_type":"llama".*"vocab_size":1024' -- client info --connect "$addr"
check stats 0 '"kv_blocks_free":[0-9]+' -- client stats --connect "$addr"

check id_out_of_vocab 1 '^conveyor client: prompt id 99999 at position 1 is outside the vocabulary \[0, 1024\)$' -- \
  client generate --connect "$addr" --prompt-ids 1,99999
check context_overflow 1 'exceeds the context limit' -- client generate --connect "$addr" --prompt-ids 1 --max-new-tokens 100000
check bad_top_p 1 'top-p' -- client generate --connect "$addr" --prompt-ids 1 --top-p 0
check bad_ids 1 'prompt-ids.*"x"' -- client generate --connect "$addr" --prompt-ids 1,x
check missing_connect 1 '--connect HOST:PORT is required' -- client generate --prompt-ids 1
check missing_prompt 1 '--prompt-ids' -- client generate --connect "$addr"
check unknown_sub 1 'unknown subcommand "frob"' -- client frob
check refused 1 "cannot connect to 127.0.0.1:1" -- client health --connect 127.0.0.1:1 --timeout 2
check bad_format 1 'format' -- client generate --connect "$addr" --prompt-ids 1 --format xml

# A client killed mid-stream (SIGKILL: no goodbye): the server cancels its request and frees its blocks.
before=$(stat tokens_generated)
"$bin" client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 500 --ignore-eos >"$work/killed.out" 2>&1 &
victim=$!
for _ in $(seq 1 400); do [ -s "$work/killed.out" ] && break; sleep 0.01; done
kill -9 "$victim" 2>/dev/null; wait "$victim" 2>/dev/null
freed=no
for _ in $(seq 1 100); do
  total=$(stat kv_blocks_total); free=$(stat kv_blocks_free); running=$(stat requests_running); calls=$(stat rpc_generate_calls)
  if [ -n "$total" ] && [ "$free" = "$total" ] && [ "$running" = 0 ] && [ "$calls" = 0 ]; then freed=yes; break; fi
  sleep 0.05
done
generated=$(( $(stat tokens_generated) - before ))
if [ "$freed" = yes ] && [ "$generated" -lt 500 ]; then echo "ok   killed_client_frees_blocks ($generated of 500 tokens generated)"; else echo "FAIL killed client: $("$bin" client stats --connect "$addr")"; fail=1; fi
# The server still serves.
check after_kill 0 "^\{\"tokens\":\[$golden\]" -- client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --format json

# SIGTERM stops the server cleanly.
kill -TERM "$server_pid"
if wait "$server_pid"; then echo "ok   sigterm_stops_cleanly"; else echo "FAIL server exit status $? : $(cat "$work/server.err")"; fail=1; fi
server_pid=
exit $fail
