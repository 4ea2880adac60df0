#include "serving_options.hpp"

namespace conveyor::cli {

service::serving_policy serving_policy_of(const config::serving_section& s) {
  service::serving_policy p;
  switch (s.batching) {
    case config::batching_mode::continuous: p.batching = service::batching_mode::continuous; break;
    case config::batching_mode::dynamic: p.batching = service::batching_mode::dynamic; break;
    case config::batching_mode::fixed: p.batching = service::batching_mode::fixed; break;
  }
  p.max_batch_delay_ms = s.max_batch_delay_ms;
  p.job_queue_size = s.job_queue_size;
  p.max_queued_tokens = s.max_queued_tokens;
  p.use_job_ticket = s.use_job_ticket;
  p.response_timeout_s = s.response_timeout_s;
  p.prefix_caching = s.prefix_caching;
  p.queued_steps = s.queued_steps;
  return p;
}

service::local_service_options local_service_options_of(const config::deployment& d, int threads) {
  service::local_service_options o;
  o.stages = d.parallel.stages;
  o.threads = threads;
  o.max_seqs_per_step = d.serving.max_batch_size;
  o.max_step_tokens = d.serving.max_batch_tokens;
  o.kv_block_size = d.serving.kv_block_size;
  o.kv_blocks = d.serving.kv_blocks > 0 ? d.serving.kv_blocks : 512;  // CPU: a fixed pool, as serve
  o.max_context = d.serving.max_context;
  o.policy = serving_policy_of(d.serving);
  o.quant = std::string(config::to_string(d.model.quantization));
  o.quant_lm_head = d.model.quantize_lm_head;
  o.draft_dir = d.model.draft;
  o.draft_layers = d.model.draft_layers;
  o.spec_k = d.model.spec_k;
  o.ngram_min = d.model.ngram_min;
  o.ngram_max = d.model.ngram_max;
  o.ngram_corpus = d.model.ngram_corpus;
  o.warm_up_batches = config::warm_up_batches(d);
  return o;
}

}  // namespace conveyor::cli
