#!/usr/bin/env bash
# The serving policy from the outside. conveyor batch: golden tokens in input order, an error line for
# a bad line (exit 3), a rerun after an interruption completes the file, a two-stage cluster gives the
# same tokens. serve-local --config: [serving] reaches the scheduler and its errors reach the client.
# usage: serving_cli_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$(cd "$2" && pwd)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
config() {  # config FILE STAGES BATCHING
  cat >"$1" <<TOML
[model]
dir = "$fx/tiny-llama"
[parallel]
stages = $2
[serving]
batching = "$3"
max_batch_size = 2
kv_blocks = 64
TOML
}
# The four tiny-llama prompts (tests/fixtures/tiny-llama/golden.json) and a line with a typo.
p1='[989,229,186,822,100,504,324]'
g1='[371,119,801,572,692,735,572,698,641,53,1005,620,931,415,46,170,897,736,36,194,330,256,635,529]'
{
  echo "{\"id\": \"a\", \"prompt_ids\": $p1, \"max_tokens\": 24, \"ignore_eos\": true}"
  echo "{\"id\": \"b\", \"prompt_ids\": [1], \"max_tokens\": 5}"
  echo "{\"id\": \"c\", \"prompt_ids\": $p1, \"max_tokens\": 24, \"ignore_eos\": true, \"temprature\": 1}"
  echo ""
  echo "{\"id\": \"d\", \"prompt_ids\": $p1, \"max_tokens\": 24, \"ignore_eos\": true}"
  echo "{\"id\": \"e\", \"prompt_ids\": [5, 6, 7], \"max_tokens\": 7, \"ignore_eos\": true, \"temperature\": 0.8, \"seed\": 3}"
} >"$dir/in.jsonl"
tokens_of() { [ -s "$1" ] || { echo "(no output)"; return; }; sed -E 's/.*"tokens":(\[[0-9,]*\]).*/\1/' "$1"; }

config "$dir/static.toml" 1 static  # 4 requests in batches of 2, the tail flushed at the end
"$bin" batch --config "$dir/static.toml" --input "$dir/in.jsonl" --output "$dir/out.jsonl" --quiet 2>"$dir/err"
rc=$?
[ $rc = 3 ] && ok "exit_3_when_a_line_fails" || bad "exit code $rc (want 3): $(cat "$dir/err")"
[ "$(wc -l <"$dir/out.jsonl")" = 5 ] && ok "one_line_per_request" || bad "lines: $(cat "$dir/out.jsonl")"
ids=$(sed -E 's/^\{"id":"([a-z])".*/\1/' "$dir/out.jsonl" | tr -d '\n')
[ "$ids" = abcde ] && ok "input_order" || bad "order: $ids"
[ "$(tokens_of "$dir/out.jsonl" | head -1)" = "$g1" ] && ok "golden_tokens" || bad "tokens: $(sed -n 1p "$dir/out.jsonl")"
grep -q '"id":"c","error":{"code":"invalid_argument","message":"line 3: unknown key \\"temprature\\"' "$dir/out.jsonl" \
  && ok "bad_line_reported" || bad "no error line for c: $(cat "$dir/out.jsonl")"

# An interrupted run: two results and half a line. The rerun skips a and b and finishes the file.
head -c "$(( $(head -2 "$dir/out.jsonl" | wc -c) + 20 ))" "$dir/out.jsonl" >"$dir/cut.jsonl"
"$bin" batch --config "$dir/static.toml" --input "$dir/in.jsonl" --output "$dir/cut.jsonl" --quiet 2>"$dir/err2"
grep -q "5 lines (2 done before, 1 errors" "$dir/err2" && ok "rerun_skips_finished_ids" || bad "rerun: $(cat "$dir/err2")"
if [ -s "$dir/out.jsonl" ] && diff <(tokens_of "$dir/out.jsonl") <(tokens_of "$dir/cut.jsonl") >/dev/null; then ok "rerun_output_equals_full_run"
else bad "rerun output differs: $(cat "$dir/cut.jsonl")"; fi

# Two stages: a cluster of worker processes, continuous batching; the same tokens.
config "$dir/cluster.toml" 2 continuous
"$bin" batch --config "$dir/cluster.toml" --input "$dir/in.jsonl" --output "$dir/cluster.jsonl" --quiet 2>"$dir/err3"
grep -q "starting 2 stage workers" "$dir/err3" && ok "two_stages_run_a_cluster" || bad "cluster: $(cat "$dir/err3")"
if [ -s "$dir/out.jsonl" ] && diff <(tokens_of "$dir/out.jsonl") <(tokens_of "$dir/cluster.jsonl") >/dev/null; then ok "cluster_equals_local"
else bad "cluster output differs: $(cat "$dir/cluster.jsonl")"; fi

grep -q "engine: KV cache 64 blocks, 0 preemptions; stage 0 (at its last heartbeat): [0-9]* steps" "$dir/err3" \
  && ok "batch_reports_the_engine" || bad "no engine line: $(cat "$dir/err3")"
# A KV cache of 2 blocks holds one 31-token sequence: whoever runs beside it is preempted,
# and the engine line says so (the tokens do not change).
config "$dir/tight.toml" 1 continuous
sed -i 's/kv_blocks = 64/kv_blocks = 2/' "$dir/tight.toml"
"$bin" batch --config "$dir/tight.toml" --input "$dir/in.jsonl" --output "$dir/tight.jsonl" --quiet 2>"$dir/err9"
if grep -q "engine: KV cache 2 blocks, [1-9][0-9]* preemptions" "$dir/err9" &&
   [ "$(tokens_of "$dir/tight.jsonl" | head -1)" = "$g1" ]; then ok "batch_reports_preemptions"
else bad "tight KV: $(cat "$dir/err9") $(sed -n 1p "$dir/tight.jsonl")"; fi

# Static batches in the cluster: the coordinator flushes the short tail when the input ends.
config "$dir/cluster-static.toml" 2 static
if timeout 60 "$bin" batch --config "$dir/cluster-static.toml" --input "$dir/in.jsonl" --output "$dir/cs.jsonl" --quiet \
     2>"$dir/err5"; [ $? = 3 ] && [ -s "$dir/out.jsonl" ] && diff <(tokens_of "$dir/out.jsonl") <(tokens_of "$dir/cs.jsonl") >/dev/null; then
  ok "cluster_static_batches_finish"
else bad "cluster static: $(cat "$dir/err5" "$dir/cs.jsonl")"; fi

# Speculative decoding ([model] spec_k, draft = the model's first 2 layers), in process and in a
# two-stage cluster (drafts in the step plans, rollback by the scheduler): the same tokens, seeded too.
for st in 1 2; do
  config "$dir/spec$st.toml" $st continuous
  sed -i 's|^\[parallel\]|draft_layers = 2\nspec_k = 3\n[parallel]|' "$dir/spec$st.toml"
  timeout 60 "$bin" batch --config "$dir/spec$st.toml" --input "$dir/in.jsonl" --output "$dir/spec$st.jsonl" --quiet 2>"$dir/err6"
  if [ -s "$dir/out.jsonl" ] && diff <(tokens_of "$dir/out.jsonl") <(tokens_of "$dir/spec$st.jsonl") >/dev/null; then
    ok "speculative_equals_plain_stages_$st"
  else bad "speculative ($st stages): $(cat "$dir/err6" "$dir/spec$st.jsonl")"; fi
  # The n-gram proposer (draft = "ngram"): prompt lookup + a corpus of the first prompt and its
  # golden tokens, every third one changed (proposals kept and rejected); the same tokens.
  tr -d '[]' <<<"$p1,$g1" | tr ',' '\n' | awk 'NR % 3 == 0 { $1 = ($1 + 1) % 1000 } { print }' >"$dir/corpus.ids"
  config "$dir/ngram$st.toml" $st continuous
  sed -i "s|^\[parallel\]|draft = \"ngram\"\nspec_k = 3\nngram_min = 1\nngram_max = 3\nngram_corpus = \"$dir/corpus.ids\"\n[parallel]|" "$dir/ngram$st.toml"
  timeout 60 "$bin" batch --config "$dir/ngram$st.toml" --input "$dir/in.jsonl" --output "$dir/ngram$st.jsonl" --quiet 2>"$dir/err7"
  if [ -s "$dir/out.jsonl" ] && diff <(tokens_of "$dir/out.jsonl") <(tokens_of "$dir/ngram$st.jsonl") >/dev/null; then
    ok "ngram_speculative_equals_plain_stages_$st"
  else bad "ngram speculative ($st stages): $(cat "$dir/err7" "$dir/ngram$st.jsonl")"; fi
done
# Bad n-gram keys are config errors that name the keys.
config "$dir/badngram.toml" 1 continuous
sed -i 's|^\[parallel\]|draft = "ngram"\nspec_k = 3\nngram_min = 4\nngram_max = 2\n[parallel]|' "$dir/badngram.toml"
"$bin" batch --config "$dir/badngram.toml" --input "$dir/in.jsonl" --output "$dir/bad.jsonl" --quiet 2>"$dir/err8"
rc=$?
[ $rc = 1 ] && grep -qE "model.ngram_min = 4 .*is above model.ngram_max = 2" "$dir/err8" && ok "ngram_bad_config" \
  || bad "bad n-gram config: rc=$rc $(cat "$dir/err8")"

"$bin" batch --config "$dir/static.toml" --input "$dir/missing.jsonl" --output "$dir/x.jsonl" 2>"$dir/err4"
rc=$?
[ $rc = 1 ] && grep -q "cannot read the input" "$dir/err4" && ok "missing_input" || bad "missing input: rc=$rc $(cat "$dir/err4")"
# serve-local with a static batch of 4 and a 0.5 s response timeout: a lone request never starts and
# the client hears why over RPC (errc::deadline_exceeded).
config "$dir/timeout.toml" 1 static
sed -i 's/max_batch_size = 2/max_batch_size = 4\nresponse_timeout_s = 0.5/' "$dir/timeout.toml"
"$bin" serve-local --model "$fx/tiny-llama" --config "$dir/timeout.toml" --listen 127.0.0.1:0 >"$dir/sl.out" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$dir/sl.out" && break; sleep 0.1; done
addr=$(sed -nE 's/.*listening on ([0-9.:]+).*/\1/p' "$dir/sl.out")
out=$("$bin" client generate --connect "$addr" --prompt-ids 1,2,3 --max-new-tokens 4 2>&1)
rc=$?
kill "$server"; wait "$server" 2>/dev/null
[ $rc = 1 ] && grep -q "deadline exceeded.*before it started" <<<"$out" && ok "serve_local_config_deadline" \
  || bad "serve-local deadline: rc=$rc $out $(cat "$dir/sl.out")"
# The same through `conveyor serve` (two stage workers): the coordinator's timer expires the request.
config "$dir/serve.toml" 2 static
sed -i 's/max_batch_size = 2/max_batch_size = 4\nresponse_timeout_s = 0.5/' "$dir/serve.toml"
printf '[frontend]\nrpc_listen = "127.0.0.1:0"\n' >>"$dir/serve.toml"
"$bin" serve --config "$dir/serve.toml" >"$dir/serve.out" 2>&1 &
server=$!
for _ in $(seq 300); do grep -q "listening on" "$dir/serve.out" && break; sleep 0.1; done
addr=$(sed -nE 's/.*listening on ([0-9.:]+).*/\1/p' "$dir/serve.out")
out=$("$bin" client generate --connect "$addr" --prompt-ids 1,2,3 --max-new-tokens 4 2>&1)
rc=$?
kill "$server"; wait "$server" 2>/dev/null
[ $rc = 1 ] && grep -q "deadline exceeded.*before it started" <<<"$out" && ok "serve_cluster_deadline" \
  || bad "serve deadline: rc=$rc $out $(cat "$dir/serve.out")"
exit $fail
