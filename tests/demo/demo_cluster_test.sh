#!/usr/bin/env bash
# The demo's path from the outside: text in, text out of models/demo through a 2-stage cluster of
# worker processes (conveyor serve + conveyor client, tokenised by the client), the same text as
# `conveyor generate` in one process, greedy and sampled; and the flags' errors.
# usage: demo_cluster_test.sh CONVEYOR_BINARY MODEL_DIR
set -u
bin=$1; model=$(cd "$2" && pwd)
fail=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1"; else printf 'FAIL %s:\n  one process: %s\n  cluster:     %s\n' "$1" "$2" "$3"; fail=1; fi; }
tmp=$(mktemp -d); server=""; trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
prompt="In the beginning"
sampled=(--temperature 0.8 --top-k 40 --seed 7)

one_greedy=$("$bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 48 --format text)
one_sampled=$("$bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 48 --format text "${sampled[@]}")
one_json=$("$bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 8 --format json)

"$bin" serve --model "$model" --stages 2 --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
server=$!
for _ in $(seq 1 300); do grep -qs "listening on" "$tmp/out" && break; kill -0 $server 2>/dev/null || break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out")
[ -n "$addr" ] || { echo "FAIL serve did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
run() { "$bin" client generate --connect "$addr" --tokenizer "$model" --prompt "$prompt" "$@"; }
two_greedy=$(run --max-new-tokens 48)
two_sampled=$(run --max-new-tokens 48 "${sampled[@]}")
two_json=$(run --max-new-tokens 8 --format json)

check greedy_text_same_as_one_process "$one_greedy" "$two_greedy"
check sampled_text_same_as_one_process "$one_sampled" "$two_sampled"
# The tokens and text fields of both JSON outputs (the client's adds timings).
fields() { sed -E 's/.*"tokens":(\[[^]]*\]).*"text":("([^"\\]|\\.)*").*/\1 \2/' <<<"$1"; }
check json_tokens_and_text "$(fields "$one_json")" "$(fields "$two_json")"
# Readable: words of the KJV, not ids or byte soup.
if grep -qw "the" <<<"$two_greedy" &&
   [ "$(tr -cd 'A-Za-z ' <<<"$two_greedy" | wc -c)" -ge $(( ${#two_greedy} * 9 / 10 )) ]; then
  echo "ok   readable: $prompt$two_greedy" | head -3
else
  echo "FAIL not readable: $two_greedy"; fail=1
fi
[ "$one_greedy" != "$one_sampled" ] && echo "ok   sampling_changes_the_text" || { echo "FAIL sampled = greedy"; fail=1; }

out=$("$bin" client generate --connect "$addr" --prompt "$prompt" 2>&1); rc=$?
if [ $rc != 0 ] && grep -q -- "--tokenizer" <<<"$out"; then echo "ok   prompt_needs_tokenizer"; else echo "FAIL: rc=$rc $out"; fail=1; fi
out=$("$bin" generate --model "$model" --prompt "$prompt" --prompt-ids 1,2 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "one of them" <<<"$out"; then echo "ok   prompt_and_ids_exclusive"; else echo "FAIL: rc=$rc $out"; fail=1; fi
out=$("$bin" generate --model "$model" --prompt "" 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "empty" <<<"$out"; then echo "ok   empty_prompt"; else echo "FAIL: rc=$rc $out"; fail=1; fi
out=$("$bin" client generate --connect "$addr" --prompt "$prompt" --tokenizer /nonexistent/t 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "/nonexistent/t" <<<"$out"; then echo "ok   missing_tokenizer_named"; else echo "FAIL: rc=$rc $out"; fail=1; fi

kill -TERM $server; wait $server; server=""

# Progress: into a file (serve's stderr above) plain lines, one per step of each stage (those the
# coordinator saw: a fast stage may pass loading between two looks); on a terminal (script(1) gives
# the command a pty) a bar redrawn in place.
if grep -q "conveyor serve: stage 1: started" "$tmp/err" && grep -q "conveyor serve: all 2 stages ready" "$tmp/err" &&
   ! grep -q $'\r' "$tmp/err"; then
  echo "ok   startup_progress_plain_lines"
else
  echo "FAIL startup progress lines:"; cat "$tmp/err"; fail=1
fi
printf '{"id":"a","prompt":"In the beginning","max_tokens":4}\n{"id":"b","prompt":"And God said","max_tokens":4}\n' >"$tmp/in.jsonl"
printf '[model]\ndir = "%s"\n' "$model" >"$tmp/batch.toml"
batch=("$bin" batch --config "$tmp/batch.toml" --input "$tmp/in.jsonl" --engine local)
"${batch[@]}" --output "$tmp/plain.jsonl" 2>"$tmp/plain.err"
if grep -q "conveyor batch: \[#\{30\}\] 2/2" "$tmp/plain.err" && ! grep -q $'\r' "$tmp/plain.err" &&
   grep -q '"text"' "$tmp/plain.jsonl"; then
  echo "ok   batch_progress_plain_lines"
else
  echo "FAIL batch progress (not a terminal):"; cat "$tmp/plain.err"; fail=1
fi
if command -v script >/dev/null; then
  script -qec "$(printf '%q ' "${batch[@]}") --output $tmp/tty.jsonl" /dev/null >"$tmp/tty.out" 2>&1
  if grep -q $'\r\033\[Kconveyor batch: \[#\{30\}\] 2/2' "$tmp/tty.out"; then
    echo "ok   batch_progress_bar_on_a_terminal"
  else
    echo "FAIL batch progress (terminal):"; cat -v "$tmp/tty.out"; fail=1
  fi
fi
exit $fail
