// conveyor: one executable, many subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "command.hpp"

namespace {

void usage(std::FILE* out) {
  std::fputs(
      "usage: conveyor <command> [flags]\n"
      "commands:\n"
      "  generate   run a model in this process and print new token ids\n"
      "             --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--max-new-tokens N]\n"
      "             [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stages K] [--tp N]\n"
      "             [--format json|text] [--ignore-eos] [--threads N] [--batch N] [--timing]\n"
      "             [--device cpu|cuda] [--dtype f32|bf16] [--quant none|int8|fp8] [--quant-lm-head]\n"
      "             [--logits-out FILE]   (the prompt's logits as raw float32, for comparisons)\n"
      "             speculative: [--draft DIR|ngram] [--draft-layers N] [--spec-k K] [--spec-exact]\n"
      "             [--ngram-min N] [--ngram-max N] [--ngram-corpus IDS] [--batch-invariant on|off]\n"
      "  serve      start a cluster (coordinator + one worker process per stage) and serve RPC\n"
      "             [--config FILE.toml] [--model DIR] [--stages K] [--chunks C] [--tp N]\n"
      "             [--listen HOST:PORT] [--http HOST:PORT]   (configs/ holds commented examples)\n"
      "  serve-local  serve RPC from an in-process engine (no cluster): --model DIR [--listen HOST:PORT]\n"
      "             [--http HOST:PORT]   (--http: OpenAI-compatible HTTP + /metrics, coordinator/http)\n"
      "             [--config FILE.toml]   (its [serving] batching, queue caps, job tickets, timeout)\n"
      "  plan       dry run of a deployment: stage -> host -> GPUs -> layers and memory per GPU\n"
      "             FILE.toml [--model DIR] [--stages K] [--tp N]   (starts nothing)\n"
      "  launch     start the coordinator here and every worker where FILE.toml places it (local,\n"
      "             ssh or slurm), then serve RPC: FILE.toml [--model DIR] [--stages K] [--tp N]\n"
      "             [--listen HOST:PORT] [--http HOST:PORT]\n"
      "  worker     one stage-worker process (started by serve/launch): --coordinator HOST:PORT\n"
      "             --stage K | --slurm --placement LIST   [--address A] [--token-stdin]\n"
      "  batch      run a JSONL file of requests offline, results in input order, resumable:\n"
      "             --config FILE.toml --input prompts.jsonl --output results.jsonl [--model DIR]\n"
      "             [--engine auto|local|cluster] [--threads N] [--window N] [--quiet]\n"
      "             (exit 3: some lines failed; each has an \"error\" result line)\n"
      "  client     talk to a server over Cap'n Proto RPC (--connect HOST:PORT [--timeout S])\n"
      "             generate (--prompt-ids 1,2,3 | --prompt TEXT --tokenizer DIR) [--max-new-tokens N]\n"
      "               [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop-ids 2,3]\n"
      "               [--ignore-eos] [--deadline S] [--format text|json]\n"
      "             health (exit 0 when ready) | stats | info   (one JSON object each)\n"
      "  help       this text\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  conveyor::cli::args rest(argv + 2, argv + argc);
  if (cmd == "generate") return conveyor::cli::generate_main(rest);
  if (cmd == "client") return conveyor::cli::client_main(rest);
  if (cmd == "serve-local") return conveyor::cli::serve_local_main(rest);
  if (cmd == "worker") return conveyor::cli::worker_main(rest);
  if (cmd == "serve") return conveyor::cli::serve_main(rest);
  if (cmd == "batch") return conveyor::cli::batch_main(rest);
  if (cmd == "plan") return conveyor::cli::plan_main(rest);
  if (cmd == "launch") return conveyor::cli::launch_main(rest);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "conveyor: unknown command \"%s\" (try: conveyor help)\n", cmd.c_str());
  return 2;
}
