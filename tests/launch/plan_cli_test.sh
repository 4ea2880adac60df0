#!/usr/bin/env bash
# conveyor plan from the outside: the table for the laptop example and for GPUs on two hosts, the
# memory check, and config contradictions, each one clear line and a non-zero exit.
# usage: plan_cli_test.sh CONVEYOR FIXTURES_DIR CONFIGS_DIR
set -u
bin=$1; fx=$2; configs=$3
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

out=$("$bin" plan "$configs/laptop.toml" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "^stage  host       address    worker  CUDA_VISIBLE_DEVICES  layers" <<<"$out" \
   && grep -q "^0      localhost  127.0.0.1  0       (cpu)                 0-1 (2 layers)" <<<"$out" \
   && grep -q "^1      localhost  127.0.0.1  1       (cpu)                 2-3 (2 layers)" <<<"$out"; then
  ok laptop_table
else
  bad "laptop: rc=$rc"; echo "$out"
fi

gpus() {
  cat >"$tmp/gpus.toml" <<TOML
[model]
dir = "$fx/tiny-llama"
device = "cuda"
[parallel]
type = "pptp"
stages = 4
tp = 2
[placement]
parallel_level = 2
device_ids = [2, 3, 4, 5]
[[placement.hosts]]
name = "node-a"
address = "192.0.2.10"
gpus = 8
gpu_memory_gib = $1
[[placement.hosts]]
name = "node-b"
address = "192.0.2.11"
gpus = 8
gpu_memory_gib = $1
[cluster]
listen = "192.0.2.10:7700"
[serving]
max_batch_size = 8
max_context = 512
[launch]
method = "ssh"
TOML
}
gpus 80
out=$("$bin" plan "$tmp/gpus.toml" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "pptp, 4 stages × tp 2; 4 workers of 2 GPUs on 2 hosts; launch ssh" <<<"$out" \
   && grep -q "^0      node-a  192.0.2.10  0       2,3 " <<<"$out" && grep -q "^1      node-a  192.0.2.10  1       4,5 " <<<"$out" \
   && grep -q "^2      node-b  192.0.2.11  2       2,3 " <<<"$out" && grep -q "^3      node-b  192.0.2.11  3       4,5 " <<<"$out" \
   && grep -q "^node-b  5    3 " <<<"$out" && grep -q "80.00 GiB (0% used)" <<<"$out"; then
  ok gpu_table_two_hosts
else
  bad "gpus: rc=$rc"; echo "$out"
fi

gpus 0.0001
out=$("$bin" plan "$tmp/gpus.toml" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "conveyor plan: the deployment does not fit in GPU memory:" <<<"$out" \
   && grep -q "host node-a GPU 2 (stage 0) needs" <<<"$out"; then
  ok does_not_fit
else
  bad "fit: rc=$rc"; echo "$out"
fi

printf '[model]\ndir = "%s"\n[placement]\nnproc_per_node = 2\nparallel_level = 2\n' "$fx/tiny-llama" >"$tmp/both.toml"
out=$("$bin" plan "$tmp/both.toml" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "both.toml:5:[0-9]*: placement.nproc_per_node = 2 (.*both.toml:4:[0-9]*) and placement.parallel_level = 2 are both set" <<<"$out"; then
  ok contradiction_names_both_keys
else
  bad "both: rc=$rc"; echo "$out"
fi

printf '[model]\ndir = "%s"\n' "$fx/tiny-llama" >"$tmp/cpu.toml"
out=$("$bin" plan "$tmp/cpu.toml" --stages 9 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "parallel.stages = 9: the model has 4 layers" <<<"$out"; then ok too_many_stages; else bad "stages: rc=$rc $out"; fi
out=$("$bin" plan 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "no deployment file" <<<"$out"; then ok no_file; else bad "no file: rc=$rc $out"; fi

# The n-gram datastore is checked before anything starts: a missing file, an id beyond the vocabulary.
ngram() { printf '[model]\ndir = "%s"\ndraft = "ngram"\nspec_k = 3\nngram_corpus = "%s"\n' "$fx/tiny-llama" "$1" >"$tmp/ngram.toml"; }
ngram "missing.ids"
out=$("$bin" plan "$tmp/ngram.toml" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "model.ngram_corpus: cannot read the token file $tmp/missing.ids" <<<"$out"; then ok ngram_corpus_missing; else bad "ngram corpus missing: rc=$rc $out"; fi
echo "5 6 70000" >"$tmp/ids.txt"; ngram "ids.txt"
out=$("$bin" plan "$tmp/ngram.toml" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "token 2 is id 70000, outside the model's vocabulary of 1024" <<<"$out"; then ok ngram_corpus_vocab; else bad "ngram corpus vocab: rc=$rc $out"; fi
echo "5 6 7" >"$tmp/ids.txt"
out=$("$bin" plan "$tmp/ngram.toml" 2>&1); rc=$?
if [ $rc = 0 ]; then ok ngram_corpus_fine; else bad "ngram corpus fine: rc=$rc $out"; fi
exit $fail
