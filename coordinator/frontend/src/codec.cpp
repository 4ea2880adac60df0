#include "codec.hpp"

namespace conveyor::frontend::codec {

namespace {

wire::ErrorCode encode_code(errc code) {
  switch (code) {
    case errc::invalid_argument: return wire::ErrorCode::INVALID_ARGUMENT;
    case errc::not_found: return wire::ErrorCode::NOT_FOUND;
    case errc::bad_format: return wire::ErrorCode::BAD_FORMAT;
    case errc::unsupported: return wire::ErrorCode::UNSUPPORTED;
    case errc::out_of_memory: return wire::ErrorCode::OUT_OF_MEMORY;
    case errc::io: return wire::ErrorCode::IO;
    case errc::internal: return wire::ErrorCode::INTERNAL;
    case errc::overloaded: return wire::ErrorCode::OVERLOADED;
    case errc::deadline_exceeded: return wire::ErrorCode::DEADLINE_EXCEEDED;
  }
  return wire::ErrorCode::INTERNAL;
}

wire::FinishReason encode_finish(const std::string& reason) {
  if (reason == "stop") return wire::FinishReason::STOP;
  if (reason == "cancelled") return wire::FinishReason::CANCELLED;
  return wire::FinishReason::LENGTH;
}

template <class T, class List>
std::vector<T> to_vector(List in) {
  std::vector<T> out;
  out.reserve(in.size());
  for (auto x : in) out.push_back(x);  // capnp list iterators lack iterator_category (STACK.md)
  return out;
}

}  // namespace

service::generate_request decode_request(wire::GenerateRequest::Reader in) {
  service::generate_request r;
  r.prompt = to_vector<std::int32_t>(in.getPromptIds());
  r.max_new_tokens = in.getMaxNewTokens();
  auto s = in.getSampling();
  r.sampling.temperature = s.getTemperature();
  r.sampling.top_k = s.getTopK();
  r.sampling.top_p = s.getTopP();
  r.sampling.seed = s.getSeed();
  r.stop_ids = to_vector<std::int32_t>(in.getStopIds());
  r.ignore_eos = in.getIgnoreEos();
  r.deadline_s = in.getDeadlineS();
  return r;
}

void encode_summary(const service::generate_summary& in, wire::GenerateSummary::Builder out) {
  out.setPromptTokens(in.prompt_tokens);
  out.setCompletionTokens(in.completion_tokens);
  out.setFinishReason(encode_finish(in.finish_reason));
  out.initError().setCode(wire::ErrorCode::NONE);
  out.setQueueS(in.queue_s);
  out.setFirstTokenS(in.first_token_s);
  out.setTotalS(in.total_s);
}

void encode_error(const error& in, int prompt_tokens, int completion_tokens, wire::GenerateSummary::Builder out) {
  out.setPromptTokens(prompt_tokens);
  out.setCompletionTokens(completion_tokens);
  out.setFinishReason(wire::FinishReason::ERROR);
  auto e = out.initError();
  e.setCode(encode_code(in.code));
  e.setMessage(in.message);
}

void encode_health(const service::health_report& in, wire::Health::Builder out) {
  out.setReady(in.ready);
  auto stages = out.initStages(static_cast<unsigned>(in.stages.size()));
  for (unsigned i = 0; i < in.stages.size(); ++i) {
    const auto& s = in.stages[i];
    stages[i].setStage(s.stage);
    stages[i].setTpRank(s.tp_rank);
    stages[i].setState(s.state);
    stages[i].setDetail(s.detail);
  }
}

void encode_stats(const service::stats_report& in, wire::Stats::Builder out) {
  out.setRequestsRunning(in.requests_running);
  out.setRequestsWaiting(in.requests_waiting);
  out.setRequestsFinished(in.requests_finished);
  out.setRequestsFailed(in.requests_failed);
  out.setTokensGenerated(in.tokens_generated);
  out.setKvBlocksTotal(in.kv_blocks_total);
  out.setKvBlocksFree(in.kv_blocks_free);
  auto busy = out.initStageBusyS(static_cast<unsigned>(in.stage_busy_s.size()));
  for (unsigned i = 0; i < in.stage_busy_s.size(); ++i) busy.set(i, in.stage_busy_s[i]);
  auto idle = out.initStageIdleS(static_cast<unsigned>(in.stage_idle_s.size()));
  for (unsigned i = 0; i < in.stage_idle_s.size(); ++i) idle.set(i, in.stage_idle_s[i]);
  out.setRequestsRejected(in.requests_rejected);
  out.setRequestsExpired(in.requests_expired);
  out.setPreemptions(in.preemptions);
  out.setKvBlocksCached(in.kv_blocks_cached);
  out.setPrefixCacheQueriedTokens(in.prefix_cache_queried_tokens);
  out.setPrefixCacheHitTokens(in.prefix_cache_hit_tokens);
  auto errors = out.initErrorsByKind(static_cast<unsigned>(in.errors_by_kind.size()));
  unsigned i = 0;
  for (const auto& [kind, n] : in.errors_by_kind) {
    errors[i].setKind(kind);
    errors[i].setCount(n);
    ++i;
  }
  out.setMicrobatches(in.microbatches);
  out.setMicrobatchesInFlight(in.microbatches_in_flight);
  out.setSpecSteps(in.spec_steps);
  out.setSpecDraftTokens(in.spec_draft_tokens);
  out.setSpecAcceptedTokens(in.spec_accepted_tokens);
  out.setSpecEmittedTokens(in.spec_emitted_tokens);
  out.setStepsQueuedAhead(in.steps_queued_ahead);
}

void encode_info(const service::model_info& in, wire::ModelInfo::Builder out) {
  out.setModelDir(in.model_dir);
  out.setModelType(in.model_type);
  out.setVocabSize(in.vocab_size);
  out.setNumLayers(in.num_layers);
  out.setHiddenSize(in.hidden_size);
  out.setStages(in.stages);
  out.setTp(in.tp);
  out.setChunks(in.chunks);
  out.setMaxContext(in.max_context);
}

}  // namespace conveyor::frontend::codec
