// conveyor plan FILE.toml: the dry run of a deployment. Prints stage → host → GPUs → layers and the
// memory every GPU needs, and fails with the reason when the config contradicts itself or does not
// fit. Starts no process and touches no GPU: it reads the config, config.json and the checkpoint's
// tensor headers only.
#include <cstdio>

#include "command.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/placement/memory_estimate.hpp"
#include "conveyor/placement/placement.hpp"
#include "conveyor/placement/plan_report.hpp"
#include "deployment_args.hpp"

namespace conveyor::cli {

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "conveyor plan: %s\n", message.c_str());
  return 1;
}

}  // namespace

int plan_main(const args& argv) {
  auto parsed = parse_file_and_flags(argv);
  if (!parsed) return fail(parsed.err().message);
  auto loaded = load_deployment_and_model(parsed->first, parsed->second);
  if (!loaded) return fail(loaded.err().message);
  const auto& d = loaded->deployment;
  // What serve would find wrong in the n-gram datastore before starting a worker (cluster::start
  // reads it there), found by the dry run too: the file, and ids beyond the vocabulary.
  if (d.model.spec_k > 0 && d.model.draft == "ngram" && !d.model.ngram_corpus.empty()) {
    auto ids = engine::read_token_ids(d.model.ngram_corpus);
    if (!ids) return fail("model.ngram_corpus: " + ids.err().message);
    for (std::size_t i = 0; i < ids->size(); ++i) {
      if ((*ids)[i] >= loaded->model.vocab_size) {
        return fail("model.ngram_corpus: token " + std::to_string(i) + " is id " + std::to_string((*ids)[i]) +
                    ", outside the model's vocabulary of " + std::to_string(loaded->model.vocab_size));
      }
    }
  }
  auto plan = placement::place(d, loaded->model);
  if (!plan) return fail(plan.err().message);
  auto tensors = placement::read_tensor_shapes(d.model.dir);
  if (!tensors) return fail(tensors.err().message);
  const auto memory = placement::estimate_memory(*plan, d, loaded->model, *tensors);
  std::printf("conveyor plan: %s\n%s", loaded->file.c_str(),
              placement::format_plan(*plan, memory, d, loaded->model).c_str());
  std::fflush(stdout);
  if (auto fit = placement::check_fit(memory, *plan); !fit.ok()) return fail(fit.err().message);
  return 0;
}

}  // namespace conveyor::cli
