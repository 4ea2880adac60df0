#pragma once
// inference_service over an in-process engine: the model split into `stages` layer ranges in this
// process, driven by the batch scheduler on one service thread. For users without a cluster, and as
// the real serving side in frontend tests.
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/service/serving_policy.hpp"

namespace conveyor::service {

struct local_service_options {
  int stages = 1;
  int max_seqs_per_step = 64;
  int max_step_tokens = 512;
  int kv_blocks = 512;
  int kv_block_size = 16;
  int max_context = 0;  ///< 0 = the model's max_position_embeddings
  int threads = 0;      ///< CPU threads for the matrix products, 0 = all
  std::string quant = "none";   ///< none | int8 (| fp8: refused by the CPU backend's config check)
  bool quant_lm_head = false;   ///< the LM head quantized too
  serving_policy policy;  ///< batching mode, admission control, deadlines, prefix caching
  /// Benchmarks only: sleep this long per step, to model a device whose step time hardly depends on
  /// the batch (a GPU's memory-bound decode) with the CPU fixture, whose steps are compute-bound.
  std::int64_t step_delay_us = 0;
  /// Speculative decoding (model.draft / model.draft_layers / model.spec_k): the draft model runs in
  /// this process next to the target; spec_k = 0 turns it off.
  std::string draft_dir;  ///< empty = the model itself (with draft_layers)
  int draft_layers = 0;   ///< > 0: only the draft's first layers + its final norm and head
  int spec_k = 0;
  int ngram_min = 2, ngram_max = 4;  ///< model.ngram_*: draft_dir "ngram" (prompt lookup, no draft model)
  std::string ngram_corpus;
  /// Decode batch sizes of the warm-up steps each stage runs before the service takes requests
  /// (engine::warm_up, after a 16-token prefill); empty = none (config::warm_up_batches).
  std::vector<int> warm_up_batches;
};

result<std::unique_ptr<inference_service>> make_local_inference_service(const std::string& model_dir,
                                                                        const local_service_options& options);

}  // namespace conveyor::service
