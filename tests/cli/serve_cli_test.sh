#!/usr/bin/env bash
# conveyor serve + conveyor client from the outside: a 2-stage cluster of worker processes, golden
# tokens through the Cap'n Proto client, health, a bad config, and a clean stop on SIGTERM.
# usage: serve_cli_test.sh CONVEYOR_BINARY FIXTURES_DIR CONFIGS_DIR
set -u
bin=$1; fx=$2; configs=$3
fail=0
tmp=$(mktemp -d); trap 'kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
"$bin" serve --model "$fx/tiny-llama" --stages 2 --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
server=$!
for _ in $(seq 1 300); do grep -q "listening on" "$tmp/out" && break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out")
[ -n "$addr" ] || { echo "FAIL serve did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
want="371 119 801 572 692 735 572 698 641 53 1005 620 931 415 46 170 897 736 36 194 330 256 635 529"
got=$("$bin" client generate --connect "$addr" --prompt-ids 989,229,186,822,100,504,324 --max-new-tokens 24 --ignore-eos --format text)
if [ "$got" = "$want" ]; then echo "ok   golden_through_rpc"; else echo "FAIL golden: $got"; fail=1; fi
health=$("$bin" client health --connect "$addr")
if grep -q '"ready":true' <<<"$health" && [ "$(grep -o '"state":"ready"' <<<"$health" | wc -l)" = 2 ]; then
  echo "ok   health_two_ready_stages"
else
  echo "FAIL health: $health"; fail=1
fi
workers=$(pgrep -f "conveyor worker" -P "$server" | wc -l)
if [ "$workers" = 2 ]; then echo "ok   two_worker_processes"; else echo "FAIL workers: $workers"; fail=1; fi
kill -TERM $server
for _ in $(seq 1 100); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
if kill -0 $server 2>/dev/null; then echo "FAIL server still running after SIGTERM"; fail=1; else echo "ok   stops_on_sigterm"; fi
sleep 0.5
if pgrep -f "conveyor worker --coordinator" >/dev/null && [ -n "$(pgrep -f "conveyor worker --coordinator" -P $server)" ]; then
  echo "FAIL workers left behind"; fail=1
else
  echo "ok   no_workers_left"
fi
# Bad input at start: one clear line, non-zero exit.
printf '[parallel]\nstages = 0\n' >"$tmp/bad.toml"
out=$("$bin" serve --config "$tmp/bad.toml" --model "$fx/tiny-llama" 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "bad.toml:2:10: parallel.stages" <<<"$out"; then echo "ok   bad_config_names_position"; else echo "FAIL bad config: rc=$rc $out"; fail=1; fi
out=$("$bin" serve --model "$fx/tiny-llama" --stages 9 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "stages" <<<"$out"; then echo "ok   too_many_stages"; else echo "FAIL stages: rc=$rc $out"; fail=1; fi
out=$("$bin" serve --config "$configs/laptop.toml" --model /nonexistent/m 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "/nonexistent/m" <<<"$out"; then echo "ok   missing_model"; else echo "FAIL missing model: rc=$rc $out"; fail=1; fi
exit $fail
