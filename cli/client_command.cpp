// conveyor client: talk to a running server over Cap'n Proto RPC (generate, health, stats, info).
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "conveyor/client/client.hpp"
#include "conveyor/tokenizer/stream_decoder.hpp"
#include "flags.hpp"
#include "text_prompt.hpp"

namespace conveyor::cli {

namespace {

int fail(const error& e) {
  std::fprintf(stderr, "conveyor client: %s\n", e.message.c_str());
  return 1;
}

void print_json(const nlohmann::ordered_json& j) { std::printf("%s\n", j.dump().c_str()); }

result<std::unique_ptr<client::connection>> connect_from(const flags& f) {
  auto address = f.get("connect");
  if (!address) return make_error(errc::invalid_argument, "--connect HOST:PORT is required");
  auto timeout = f.get_double("timeout", 10.0, 0.001, 86400.0);
  if (!timeout) return timeout.err();
  client::connect_options o;
  o.connect_timeout_s = *timeout;
  o.call_timeout_s = *timeout;
  o.client_name = "conveyor client";
  return client::connect(*address, o);
}

/// `text`: set when the prompt is --prompt TEXT (encoded here with --tokenizer DIR, since the RPC
/// protocol carries ids).
result<client::generate_request> request_from(const flags& f, std::optional<text_prompt>& text) {
  if (f.has("prompt-ids") == f.has("prompt")) {
    return make_error(errc::invalid_argument, "give the prompt as --prompt-ids 1,2,3 or as --prompt TEXT (one of them)");
  }
  std::vector<int> ids;
  if (auto t = f.get("prompt")) {
    auto dir = f.get("tokenizer");
    if (!dir) {
      return make_error(errc::invalid_argument,
                        "--prompt TEXT needs --tokenizer DIR: a directory with the served model's tokenizer (the "
                        "model directory itself will do)");
    }
    CONVEYOR_TRY_ASSIGN(encoded, encode_text_prompt(*dir, "--tokenizer", *t));
    ids.assign(encoded.ids.begin(), encoded.ids.end());
    text = std::move(encoded);
  } else {
    CONVEYOR_TRY_ASSIGN(parsed, f.get_int_list("prompt-ids"));
    ids = std::move(parsed);
  }
  CONVEYOR_TRY_ASSIGN(stops, f.get_int_list("stop-ids"));
  // Ranges that need the model (vocabulary, context) are the server's to check; these are not.
  CONVEYOR_TRY_ASSIGN(max_new, f.get_int("max-new-tokens", 16, 1, INT32_MAX));
  CONVEYOR_TRY_ASSIGN(temperature, f.get_double("temperature", 0.0, 0.0, 100.0));
  CONVEYOR_TRY_ASSIGN(top_k, f.get_int("top-k", 0, 0, INT32_MAX));
  CONVEYOR_TRY_ASSIGN(top_p, f.get_double("top-p", 1.0, 1e-6, 1.0));
  CONVEYOR_TRY_ASSIGN(seed, f.get_int("seed", 0, 0, INT64_MAX));
  CONVEYOR_TRY_ASSIGN(deadline, f.get_double("deadline", 0.0, 0.0, 1e9));
  client::generate_request r;
  r.prompt.assign(ids.begin(), ids.end());
  r.stop_ids.assign(stops.begin(), stops.end());
  r.max_new_tokens = static_cast<int>(max_new);
  r.temperature = static_cast<float>(temperature);
  r.top_k = static_cast<int>(top_k);
  r.top_p = static_cast<float>(top_p);
  r.seed = static_cast<std::uint64_t>(seed);
  r.ignore_eos = f.has("ignore-eos");
  r.deadline_s = deadline;
  return r;
}

int generate(const args& argv) {
  auto f = flags::parse(argv, {"connect", "timeout", "prompt-ids", "prompt", "tokenizer", "max-new-tokens", "temperature",
                               "top-k", "top-p", "seed", "stop-ids", "ignore-eos", "deadline", "format"},
                        {"ignore-eos"});
  if (!f) return fail(f.err());
  const std::string format = f->get("format").value_or("text");
  if (format != "json" && format != "text") {
    return fail(make_error(errc::invalid_argument, "--format must be json or text, got \"" + format + "\""));
  }
  std::optional<text_prompt> text;
  auto request = request_from(*f, text);
  if (!request) return fail(request.err());
  auto conn = connect_from(*f);
  if (!conn) return fail(conn.err());
  std::vector<std::int32_t> tokens;
  bool printed = false;
  // With --prompt TEXT, text out too: pieces as their tokens arrive (never half a UTF-8 character).
  std::optional<tokenizer::stream_decoder> decoder;
  if (text) decoder.emplace(*text->tok);
  auto summary = (*conn)->generate(*request, [&](std::span<const std::int32_t> ids) {
    if (format == "text" && decoder) {
      const std::string piece = decoder->push(ids);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      printed = true;
    } else if (format == "text") {
      for (auto id : ids) {
        std::printf(printed ? " %d" : "%d", id);
        printed = true;
      }
      std::fflush(stdout);  // as they arrive, also through a pipe
    } else {
      tokens.insert(tokens.end(), ids.begin(), ids.end());
    }
    return true;
  });
  if (format == "text" && decoder) std::printf("%s", decoder->finish().c_str());
  if (format == "text" && printed) std::printf("\n");
  if (!summary) return fail(summary.err());
  if (format == "json") {
    nlohmann::ordered_json j{{"tokens", tokens},
                             {"finish_reason", summary->finish_reason},
                             {"prompt_tokens", summary->prompt_tokens},
                             {"completion_tokens", summary->completion_tokens},
                             {"queue_s", summary->queue_s},
                             {"first_token_s", summary->first_token_s},
                             {"total_s", summary->total_s}};
    if (text) j["text"] = text->tok->decode(tokens);
    print_json(j);
  }
  return 0;
}

int health(const args& argv) {
  auto f = flags::parse(argv, {"connect", "timeout"});
  if (!f) return fail(f.err());
  auto conn = connect_from(*f);
  if (!conn) return fail(conn.err());
  auto h = (*conn)->health();
  if (!h) return fail(h.err());
  auto stages = nlohmann::ordered_json::array();
  for (const auto& s : h->stages) {
    stages.push_back({{"stage", s.stage}, {"tp_rank", s.tp_rank}, {"state", s.state}, {"detail", s.detail}});
  }
  print_json({{"ready", h->ready}, {"stages", stages}});
  return h->ready ? 0 : 1;  // a readiness probe can use the exit code alone
}

int stats(const args& argv) {
  auto f = flags::parse(argv, {"connect", "timeout"});
  if (!f) return fail(f.err());
  auto conn = connect_from(*f);
  if (!conn) return fail(conn.err());
  auto s = (*conn)->stats();
  if (!s) return fail(s.err());
  print_json({{"requests_running", s->requests_running},
              {"requests_waiting", s->requests_waiting},
              {"requests_finished", s->requests_finished},
              {"requests_failed", s->requests_failed},
              {"tokens_generated", s->tokens_generated},
              {"kv_blocks_total", s->kv_blocks_total},
              {"kv_blocks_free", s->kv_blocks_free},
              {"stage_busy_s", s->stage_busy_s},
              {"stage_idle_s", s->stage_idle_s},
              {"rpc_connections", s->rpc_connections},
              {"rpc_generate_calls", s->rpc_generate_calls},
              {"requests_rejected", s->requests_rejected},
              {"requests_expired", s->requests_expired},
              {"preemptions", s->preemptions},
              {"kv_blocks_cached", s->kv_blocks_cached},
              {"prefix_cache_queried_tokens", s->prefix_cache_queried_tokens},
              {"prefix_cache_hit_tokens", s->prefix_cache_hit_tokens},
              {"errors_by_kind", s->errors_by_kind},
              {"microbatches", s->microbatches},
              {"microbatches_in_flight", s->microbatches_in_flight},
              {"spec_steps", s->spec_steps},
              {"spec_draft_tokens", s->spec_draft_tokens},
              {"spec_accepted_tokens", s->spec_accepted_tokens},
              {"spec_emitted_tokens", s->spec_emitted_tokens},
              {"steps_queued_ahead", s->steps_queued_ahead}});
  return 0;
}

int info(const args& argv) {
  auto f = flags::parse(argv, {"connect", "timeout"});
  if (!f) return fail(f.err());
  auto conn = connect_from(*f);
  if (!conn) return fail(conn.err());
  auto m = (*conn)->info();
  if (!m) return fail(m.err());
  const auto& v = (*conn)->server();
  print_json({{"model_dir", m->model_dir},
              {"model_type", m->model_type},
              {"vocab_size", m->vocab_size},
              {"num_layers", m->num_layers},
              {"hidden_size", m->hidden_size},
              {"stages", m->stages},
              {"tp", m->tp},
              {"chunks", m->chunks},
              {"max_context", m->max_context},
              {"server", v.server},
              {"protocol_version", v.protocol_version}});
  return 0;
}

}  // namespace

int client_main(const args& argv) {
  const std::string sub = argv.empty() ? "" : argv[0];
  const args rest(argv.empty() ? argv.end() : argv.begin() + 1, argv.end());
  if (sub == "generate") return generate(rest);
  if (sub == "health") return health(rest);
  if (sub == "stats") return stats(rest);
  if (sub == "info") return info(rest);
  return fail(make_error(errc::invalid_argument,
                         sub.empty() ? "missing subcommand: generate, health, stats or info"
                                     : "unknown subcommand \"" + sub + "\" (expected generate, health, stats or info)"));
}

}  // namespace conveyor::cli
