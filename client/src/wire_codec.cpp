#include "wire_codec.hpp"

namespace conveyor::client::wire_codec {

namespace {

errc decode_code(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::INVALID_ARGUMENT: return errc::invalid_argument;
    case wire::ErrorCode::NOT_FOUND: return errc::not_found;
    case wire::ErrorCode::BAD_FORMAT: return errc::bad_format;
    case wire::ErrorCode::UNSUPPORTED: return errc::unsupported;
    case wire::ErrorCode::OUT_OF_MEMORY: return errc::out_of_memory;
    case wire::ErrorCode::IO: return errc::io;
    case wire::ErrorCode::OVERLOADED: return errc::overloaded;
    case wire::ErrorCode::DEADLINE_EXCEEDED: return errc::deadline_exceeded;
    case wire::ErrorCode::NONE:
    case wire::ErrorCode::INTERNAL: return errc::internal;
  }
  return errc::internal;  // a code from a newer server
}

std::string decode_finish(wire::FinishReason reason) {
  switch (reason) {
    case wire::FinishReason::LENGTH: return "length";
    case wire::FinishReason::STOP: return "stop";
    case wire::FinishReason::CANCELLED: return "cancelled";
    case wire::FinishReason::ERROR: return "error";
  }
  return "unknown";
}

template <class T, class List>
std::vector<T> to_vector(List in) {
  std::vector<T> out;
  out.reserve(in.size());
  for (auto x : in) out.push_back(x);  // capnp list iterators lack iterator_category (STACK.md)
  return out;
}

}  // namespace

void encode_request(const generate_request& in, wire::GenerateRequest::Builder out) {
  auto ids = out.initPromptIds(static_cast<unsigned>(in.prompt.size()));
  for (unsigned i = 0; i < in.prompt.size(); ++i) ids.set(i, in.prompt[i]);
  out.setMaxNewTokens(in.max_new_tokens);
  auto s = out.initSampling();
  s.setTemperature(in.temperature);
  s.setTopK(in.top_k);
  s.setTopP(in.top_p);
  s.setSeed(in.seed);
  auto stops = out.initStopIds(static_cast<unsigned>(in.stop_ids.size()));
  for (unsigned i = 0; i < in.stop_ids.size(); ++i) stops.set(i, in.stop_ids[i]);
  out.setIgnoreEos(in.ignore_eos);
  out.setDeadlineS(in.deadline_s);
}

result<generate_summary> decode_summary(wire::GenerateSummary::Reader in) {
  if (in.getFinishReason() == wire::FinishReason::ERROR) {
    auto e = in.getError();
    return make_error(decode_code(e.getCode()), e.getMessage().cStr());
  }
  generate_summary s;
  s.prompt_tokens = in.getPromptTokens();
  s.completion_tokens = in.getCompletionTokens();
  s.finish_reason = decode_finish(in.getFinishReason());
  s.queue_s = in.getQueueS();
  s.first_token_s = in.getFirstTokenS();
  s.total_s = in.getTotalS();
  return s;
}

health_report decode_health(wire::Health::Reader in) {
  health_report h;
  h.ready = in.getReady();
  for (auto s : in.getStages()) {
    h.stages.push_back({s.getStage(), s.getTpRank(), s.getState().cStr(), s.getDetail().cStr()});
  }
  return h;
}

stats_report decode_stats(wire::Stats::Reader in) {
  stats_report s;
  s.requests_running = in.getRequestsRunning();
  s.requests_waiting = in.getRequestsWaiting();
  s.requests_finished = in.getRequestsFinished();
  s.requests_failed = in.getRequestsFailed();
  s.tokens_generated = in.getTokensGenerated();
  s.kv_blocks_total = in.getKvBlocksTotal();
  s.kv_blocks_free = in.getKvBlocksFree();
  s.stage_busy_s = to_vector<double>(in.getStageBusyS());
  s.stage_idle_s = to_vector<double>(in.getStageIdleS());
  s.rpc_connections = in.getRpcConnections();
  s.rpc_generate_calls = in.getRpcGenerateCalls();
  // Fields 11.. are absent (zero) from servers older than them: the counters read 0, as they should.
  s.requests_rejected = in.getRequestsRejected();
  s.requests_expired = in.getRequestsExpired();
  s.preemptions = in.getPreemptions();
  s.kv_blocks_cached = in.getKvBlocksCached();
  s.prefix_cache_queried_tokens = in.getPrefixCacheQueriedTokens();
  s.prefix_cache_hit_tokens = in.getPrefixCacheHitTokens();
  for (auto e : in.getErrorsByKind()) s.errors_by_kind[e.getKind().cStr()] += e.getCount();
  s.microbatches = in.getMicrobatches();
  s.microbatches_in_flight = in.getMicrobatchesInFlight();
  s.spec_steps = in.getSpecSteps();
  s.spec_draft_tokens = in.getSpecDraftTokens();
  s.spec_accepted_tokens = in.getSpecAcceptedTokens();
  s.spec_emitted_tokens = in.getSpecEmittedTokens();
  s.steps_queued_ahead = in.getStepsQueuedAhead();
  return s;
}

model_info decode_info(wire::ModelInfo::Reader in) {
  model_info m;
  m.model_dir = in.getModelDir().cStr();
  m.model_type = in.getModelType().cStr();
  m.vocab_size = in.getVocabSize();
  m.num_layers = in.getNumLayers();
  m.hidden_size = in.getHiddenSize();
  m.stages = in.getStages();
  m.tp = in.getTp();
  m.chunks = in.getChunks();
  m.max_context = in.getMaxContext();
  return m;
}

server_version decode_version(wire::ServerVersion::Reader in) {
  return {in.getProtocolVersion(), in.getMinProtocolVersion(), in.getServer().cStr()};
}

}  // namespace conveyor::client::wire_codec
