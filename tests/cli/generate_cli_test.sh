#!/usr/bin/env bash
# conveyor generate from the outside: golden tokens, stage splits, and one clear line per bad input.
# usage: generate_cli_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$2
fail=0
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
# tiny-llama prompt 1 and its 24 HF greedy tokens (tests/fixtures/tiny-llama/golden.json).
ids=989,229,186,822,100,504,324
want='\{"tokens":\[371,119,801,572,692,735,572,698,641,53,1005,620,931,415,46,170,897,736,36,194,330,256,635,529\]'
check golden_json 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos
check golden_4_stages 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --stages 4
check golden_tp2_stages2 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --stages 2 --tp 2
check golden_tp4 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --tp 4
check bad_tp 1 'allowed: 1, 2, 4' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --tp 3
check text_format 0 '^371 119 801' -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 3 --format text
check sampled_is_reproducible 0 '"tokens"' -- generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-k 50 --top-p 0.9 --seed 7
a=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 7 --ignore-eos)
b=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 7 --ignore-eos --stages 3)
c=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 8 --ignore-eos)
if [ "$a" = "$b" ] && [ "$a" != "$c" ]; then echo "ok   seed_fixes_samples_across_splits"; else echo "FAIL seed: $a / $b / $c"; fail=1; fi
# Speculative decoding: greedy output is the model's own, whatever the draft; stats in the JSON.
check spec_draft_layers 0 "$want.*\"speculative\":\{\"k\":3" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --draft-layers 2 --spec-k 3
check spec_other_draft_2_stages 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --stages 2 --draft "$fx/tiny-qwen2" --spec-k 4
check spec_self_draft_accepts_all 0 '"acceptance_rate":1.0000' -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --draft-layers 4
a_tokens=$(sed -E 's/.*"tokens":\[([^]]*)\].*/\1/' <<<"$a")
check spec_exact_sampling 0 "\"tokens\":\[$a_tokens\]" -- generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 7 --ignore-eos --draft-layers 3 --spec-exact
# Rejection sampling is seeded too: the same seed gives the same tokens, another seed others.
r1=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 0.8 --seed 7 --ignore-eos --draft-layers 3 --spec-k 3)
r2=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 0.8 --seed 7 --ignore-eos --draft-layers 3 --spec-k 3 --stages 2)
r3=$("$bin" generate --model "$fx/tiny-qwen2" --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 0.8 --seed 8 --ignore-eos --draft-layers 3 --spec-k 3)
if [ -n "$r1" ] && [ "$r1" = "$r2" ] && [ "$r1" != "$r3" ]; then echo "ok   spec_rejection_sampling_is_seeded"; else echo "FAIL spec seeded: $r1 / $r2 / $r3"; fail=1; fi
# --draft ngram: prompt lookup + a token-id corpus (the golden tokens with every third one changed,
# so proposals are both kept and rejected); the model's own tokens, and clear errors for bad flags.
corpus=$(mktemp); trap 'rm -f "$corpus"' EXIT
echo "$ids,$(sed -E 's/.*"tokens":\[([^]]*)\].*/\1/' <<<"$(grep -oE '"tokens":\[[0-9,]*\]' <<<"$("$bin" generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos)")")" \
  | tr ',' '\n' | awk 'NR % 3 == 0 { $1 = ($1 + 1) % 1000 } { print }' >"$corpus"
check spec_ngram_corpus 0 "$want.*\"accepted\":[1-9]" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --draft ngram --ngram-min 1 --ngram-max 3 --ngram-corpus "$corpus" --spec-k 4
check spec_ngram_2_stages 0 "$want" -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --stages 2 --draft ngram
check spec_ngram_min_above_max 1 'ngram-min \(4\) is above --ngram-max \(2\)' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft ngram --ngram-min 4 --ngram-max 2
check spec_ngram_flags_need_ngram 1 'need --draft ngram' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --ngram-max 3
check spec_ngram_no_layers 1 'not to --draft ngram' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft ngram --draft-layers 2
echo "1 2 x" >"$corpus"
check spec_ngram_bad_corpus 1 "ngram-corpus: .*byte 4 \('x'\)" -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft ngram --ngram-corpus "$corpus"
echo "1 2 5000" >"$corpus"
check spec_ngram_corpus_vocab 1 'corpus holds token id 5000, outside the model.s vocabulary' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft ngram --ngram-corpus "$corpus"
check spec_other_vocab 1 'vocabulary' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft "$fx/llama3-scaled"
check spec_k_without_draft 1 'needs a draft' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --spec-k 2
check spec_too_many_layers 1 'layers' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --draft-layers 9
check missing_dir 1 '/nonexistent/dir' -- generate --model /nonexistent/dir --prompt-ids 1
check bad_ids 1 'prompt-ids.*"x"' -- generate --model "$fx/tiny-llama" --prompt-ids 1,x,3
check id_out_of_vocab 1 'vocabulary' -- generate --model "$fx/tiny-llama" --prompt-ids 1,99999
check too_many_stages 1 'stages' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --stages 9
check unknown_flag 1 'unknown flag --bogus' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --bogus 3
check bad_format 1 'format' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --format xml
check bad_top_p 1 'top-p' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --top-p 0
check missing_model 1 'model' -- generate --prompt-ids 1
check unknown_command 2 'unknown command' -- frobnicate
check worker_port_trailing 1 'bad port in "127.0.0.1:80x"' -- worker --coordinator 127.0.0.1:80x
# Quantized weights (issue 12): int8 runs on the CPU (same tokens across a stage/TP split), bad
# values and fp8 on the CPU are one clear error.
check quant_int8 0 '"tokens":\[[0-9]' -- generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 8 --ignore-eos --quant int8
qa=$("$bin" generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 8 --ignore-eos --quant int8 --quant-lm-head)
qb=$("$bin" generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 8 --ignore-eos --quant int8 --quant-lm-head --stages 2 --tp 2)
if [ -n "$qa" ] && [ "$qa" = "$qb" ]; then echo "ok   quant_split_same_tokens"; else echo "FAIL quant split: $qa / $qb"; fail=1; fi
check quant_bad_value 1 'unknown quantization "int4".*"int8"' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --quant int4
check quant_fp8_cpu 1 'fp8 needs --device cuda' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --quant fp8
check quant_lm_head_alone 1 'quant-lm-head needs --quant' -- generate --model "$fx/tiny-llama" --prompt-ids 1 --quant-lm-head
# Weight loading shows a bar on a terminal (script(1) gives it one), and nothing off one.
if command -v script >/dev/null; then
  tty_out=$(script -qec "'$bin' generate --model '$fx/tiny-llama' --prompt-ids $ids --max-new-tokens 2 --stages 2 --tp 2" /dev/null)
  plain_err=$("$bin" generate --model "$fx/tiny-llama" --prompt-ids $ids --max-new-tokens 2 2>&1 >/dev/null)
  if grep -q 'loading weights: \[#*\] 8/8' <<<"$tty_out" && [ -z "$plain_err" ]; then echo "ok   loading_bar_on_a_terminal_only"
  else echo "FAIL loading bar: terminal: $tty_out / plain stderr: $plain_err"; fail=1; fi
else
  echo "skip loading_bar_on_a_terminal_only: no script(1)"
fi
exit $fail
