// conveyor generate: the engine alone, in one process, on the CPU or the CUDA backend.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/memory_plan.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/cpu_collective.hpp"
#include "conveyor/transport/nccl_collective.hpp"
#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif
#include "flags.hpp"
#include "progress_bar.hpp"
#include "text_prompt.hpp"

namespace conveyor::cli {

namespace {

int fail(const error& e) {
  std::fprintf(stderr, "conveyor generate: %s\n", e.message.c_str());
  return 1;
}

/// The backend `--device` and `--dtype` name; errors say what is allowed.
result<std::unique_ptr<kernels::backend>> make_backend(const flags& f, int threads, int device_ordinal = 0) {
  const std::string device = f.get("device").value_or("cpu");
  const std::string dtype = f.get("dtype").value_or(device == "cuda" ? "bf16" : "f32");
  if (dtype != "bf16" && dtype != "f32") {
    return make_error(errc::invalid_argument, "--dtype must be bf16 or f32, got \"" + dtype + "\"");
  }
  if (device == "cpu") {
    if (dtype != "f32") return make_error(errc::invalid_argument, "--device cpu computes in f32 only");
    return kernels::make_cpu_backend({threads});
  }
  if (device == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
    kernels::cuda_backend_options o;
    o.device = device_ordinal;
    o.compute_dtype = dtype == "f32" ? kernels::dtype::f32 : kernels::dtype::bf16;
    // Speculative decoding turns on row-invariant kernels (bf16): the verification pass then computes
    // exactly what plain decode steps would, so greedy output stays the model's own.
    const bool speculative = f.has("draft") || f.has("draft-layers");
    const std::string inv = f.get("batch-invariant").value_or(speculative ? "on" : "off");
    if (inv != "on" && inv != "off") {
      return make_error(errc::invalid_argument, "--batch-invariant must be on or off, got \"" + inv + "\"");
    }
    o.batch_invariant = inv == "on";
    o.gemm_tuning_cache = kernels::default_gemm_tuning_cache();
    auto b = kernels::make_cuda_backend(o);
    if (!b) return make_error(b.err().code, "--device cuda: " + b.err().message);
    return std::move(b).value();
#else
    return make_error(errc::unsupported, "--device cuda: this build of conveyor has no CUDA backend");
#endif
  }
  return make_error(errc::invalid_argument, "--device must be cpu or cuda, got \"" + device + "\"");
}

/// --logits-out FILE: one forward pass over the prompt, its logits [T, vocab] written as raw
/// little-endian float32 (what tools/hf_peer.py compares with HF transformers).
status write_prompt_logits(engine::local_pipeline& pipe, const std::vector<int>& ids, const std::string& path) {
  constexpr std::int64_t seq = -1;  // generate() numbers its sequences from 1
  CONVEYOR_TRY(pipe.blocks().reserve(seq, static_cast<int>(ids.size())));
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = seq;
  s.tokens.assign(ids.begin(), ids.end());
  s.block_table = pipe.blocks().table(seq);
  s.logits = engine::logits_mode::all;
  s.sample = false;
  plan.seqs.push_back(std::move(s));
  auto out = pipe.step(plan);
  pipe.blocks().release(seq);
  if (!out) return out.err();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return make_error(errc::io, "--logits-out: cannot create " + path);
  const std::size_t wrote = std::fwrite(out->logits.data(), sizeof(float), out->logits.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (wrote != out->logits.size() || !closed) return make_error(errc::io, "--logits-out: cannot write " + path);
  return ok_status();
}

}  // namespace

int generate_main(const args& argv) {
  auto f = flags::parse(argv, {"model", "prompt-ids", "prompt", "max-new-tokens", "temperature", "top-k", "top-p", "seed",
                               "stages", "format", "ignore-eos", "threads", "device", "dtype", "logits-out", "tp", "batch", "timing",
                               "quant", "quant-lm-head", "draft", "draft-layers", "spec-k", "spec-exact", "batch-invariant",
                               "ngram-min", "ngram-max", "ngram-corpus"},
                        {"ignore-eos", "timing", "quant-lm-head", "spec-exact"});
  if (!f) return fail(f.err());
  auto model = f->get("model");
  if (!model) return fail(make_error(errc::invalid_argument, "--model DIR is required"));
  if (f->has("prompt-ids") == f->has("prompt")) {
    return fail(make_error(errc::invalid_argument, "give the prompt as --prompt-ids 1,2,3 or as --prompt TEXT (one of them)"));
  }
  // --prompt TEXT: the model directory's tokenizer makes the ids, and decodes the output for --format.
  std::optional<text_prompt> text;
  if (auto t = f->get("prompt")) {
    auto encoded = encode_text_prompt(*model, "--model", *t);
    if (!encoded) return fail(encoded.err());
    text = std::move(encoded).value();
  }
  auto ids = text ? result<std::vector<int>>(std::vector<int>(text->ids.begin(), text->ids.end()))
                  : f->get_int_list("prompt-ids");
  if (!ids) return fail(ids.err());
  if (ids->empty()) return fail(make_error(errc::invalid_argument, "--prompt-ids is empty"));
  auto max_new = f->get_int("max-new-tokens", 16, 0, 1 << 20);
  auto temperature = f->get_double("temperature", 0.0, 0.0, 100.0);
  auto top_k = f->get_int("top-k", 0, 0, 1 << 30);
  auto top_p = f->get_double("top-p", 1.0, 1e-6, 1.0);
  auto seed = f->get_int("seed", 0, 0, INT64_MAX);
  auto stages = f->get_int("stages", 1, 1, 1 << 16);
  auto tp = f->get_int("tp", 1, 1, 64);
  if (!tp) return fail(tp.err());
  auto batch = f->get_int("batch", 1, 1, 4096);
  if (!batch) return fail(batch.err());
  auto threads = f->get_int("threads", 0, 0, 4096);
  for (const auto* r : {&max_new, &top_k, &seed, &stages, &threads}) {
    if (!*r) return fail(r->err());
  }
  for (const auto* r : {&temperature, &top_p}) {
    if (!*r) return fail(r->err());
  }
  // Speculative decoding: --draft DIR and/or --draft-layers N (the first N layers of the draft
  // directory, by default the model itself, with its final norm and head) propose --spec-k tokens.
  const bool speculative = f->has("draft") || f->has("draft-layers") || f->has("spec-k");
  auto draft_layers = f->get_int("draft-layers", 0, 1, 1 << 16);
  if (!draft_layers) return fail(draft_layers.err());
  auto spec_k = f->get_int("spec-k", 4, 1, 64);
  if (!spec_k) return fail(spec_k.err());
  if (speculative && !f->has("draft") && !f->has("draft-layers")) {
    return fail(make_error(errc::invalid_argument, "--spec-k needs a draft: --draft DIR or --draft-layers N"));
  }
  const std::string draft_dir = f->get("draft").value_or(*model);
  // --draft ngram: no draft model; prompt lookup (--ngram-min/--ngram-max tokens matched, longest
  // first) in the sequence and in --ngram-corpus FILE (token ids) proposes. A directory named
  // ngram is ./ngram.
  const bool ngram = draft_dir == "ngram";
  engine::ngram_options ngram_opts;
  if (ngram && f->has("draft-layers")) {
    return fail(make_error(errc::invalid_argument, "--draft-layers applies to a draft model, not to --draft ngram"));
  }
  if (!ngram && (f->has("ngram-min") || f->has("ngram-max") || f->has("ngram-corpus"))) {
    return fail(make_error(errc::invalid_argument, "--ngram-min, --ngram-max and --ngram-corpus need --draft ngram"));
  }
  {
    auto lo = f->get_int("ngram-min", ngram_opts.min_n, 1, engine::ngram_proposer::max_ngram);
    if (!lo) return fail(lo.err());
    auto hi = f->get_int("ngram-max", std::max<std::int64_t>(*lo, ngram_opts.max_n), 1, engine::ngram_proposer::max_ngram);
    if (!hi) return fail(hi.err());
    ngram_opts.min_n = static_cast<int>(*lo);
    ngram_opts.max_n = static_cast<int>(*hi);
    if (ngram_opts.min_n > ngram_opts.max_n) {
      return fail(make_error(errc::invalid_argument, "--ngram-min (" + std::to_string(*lo) + ") is above --ngram-max (" +
                                                         std::to_string(*hi) + ")"));
    }
  }
  const std::string format = f->get("format").value_or("json");
  if (format != "json" && format != "text") {
    return fail(make_error(errc::invalid_argument, "--format must be json or text, got \"" + format + "\""));
  }

  // --quant int8|fp8: the linear layers' weights quantized at load (--quant-lm-head: the LM head too).
  auto quant = engine::parse_weight_quant(f->get("quant").value_or("none"));
  if (!quant) return fail(make_error(errc::invalid_argument, "--quant: " + quant.err().message));
  if (*quant == kernels::weight_quant::fp8 && f->get("device").value_or("cpu") != "cuda") {
    return fail(make_error(errc::invalid_argument,
                           "--quant fp8 needs --device cuda (FP8 E4M3 weights are a GPU format; the CPU backend "
                           "has only a reference emulation for tests): use --quant int8 on the CPU"));
  }
  if (f->has("quant-lm-head") && *quant == kernels::weight_quant::none) {
    return fail(make_error(errc::invalid_argument, "--quant-lm-head needs --quant int8 or fp8"));
  }
  auto backend = make_backend(*f, static_cast<int>(*threads));
  if (!backend) return fail(backend.err());
  engine::executor_options opts;
  opts.quant.kind = *quant;
  opts.quant.lm_head = f->has("quant-lm-head");
  const int context = static_cast<int>(ids->size() + *max_new);
  opts.kv_block_size = 16;
  // --batch N decodes N copies of the prompt together (a throughput measurement; greedy copies must
  // agree, which is checked below).
  const int n = static_cast<int>(*batch);
  opts.kv_blocks = std::max(1, n * ((context + 15) / 16));
  opts.max_step_tokens = std::max(n, std::min(n * static_cast<int>(ids->size()), 16384));
  opts.max_seqs = n;
  if (speculative) opts.max_step_tokens = std::max(opts.max_step_tokens, n * static_cast<int>(*spec_k + 1));
  int num_layers = 0;
  {
    // Check up front that weights, workspace and this request's KV blocks fit.
    auto config = engine::load_model_config(*model);
    if (!config) return fail(config.err());
    num_layers = config->num_layers;
    auto ranges = engine::split_even(*config, static_cast<int>(*stages));
    if (!ranges) return fail(ranges.err());
    engine::memory_plan_options po;
    po.min_blocks = po.max_blocks = opts.kv_blocks;
    auto plan = engine::plan_memory(**backend, *config, *ranges, opts, po);
    if (!plan) return fail(plan.err());
  }
  // --tp N: N tensor-parallel ranks as threads of this process: on the CPU joined by the CPU
  // collective, on GPUs (rank r on device r) by NCCL on each backend's stream.
  [[maybe_unused]] const bool cuda = f->get("device").value_or("cpu") == "cuda";
  std::vector<std::unique_ptr<kernels::backend>> extra_ranks;
  std::vector<kernels::backend*> rank_backends{backend->get()};
  for (int r = 1; r < *tp; ++r) {
    auto b = make_backend(*f, static_cast<int>(*threads), r);
    if (!b) return fail(b.err());
    rank_backends.push_back(b->get());
    extra_ranks.push_back(std::move(b).value());
  }
  engine::tp_group_factory make_group = [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
    return transport::cpu_group(size).all_ranks();
  };
#ifdef CONVEYOR_HAVE_CUDA
  if (cuda) {
    make_group = [&rank_backends](int size) {
      std::vector<int> devices;
      std::vector<void*> streams;
      for (int r = 0; r < size; ++r) {
        devices.push_back(r);
        streams.push_back(kernels::cuda_stream_of(*rank_backends[r]));
      }
      return transport::make_nccl_group(devices, streams);
    };
  }
#endif
  // Loading progress: a bar on a terminal only. Off one, generate's stderr stays what scripts rely
  // on (empty on success, one line on an error); long jobs (batch, cluster start-up) print plain lines.
  struct load_progress {
    std::mutex mu;
    progress_bar bar{"conveyor generate: loading weights"};
    std::int64_t done = 0, total = 0;
  };
  auto loading = std::make_shared<load_progress>();
  loading->total = static_cast<std::int64_t>(num_layers) * static_cast<std::int64_t>(*tp);
  opts.on_layer_loaded = [loading] {
    std::lock_guard lock(loading->mu);
    ++loading->done;
    if (loading->bar.on_terminal()) loading->bar.update(loading->done, loading->total, "layers (x tp ranks)");
  };
  auto pipe = engine::local_pipeline::create(rank_backends, *model, static_cast<int>(*stages), opts, make_group);
  opts.on_layer_loaded = nullptr;  // the draft below loads quietly
  if (!pipe) return fail(pipe.err());
  if (context > (*pipe)->config().max_position_embeddings) {
    std::fprintf(stderr, "conveyor generate: warning: %d tokens exceed max_position_embeddings (%d)\n", context,
                 (*pipe)->config().max_position_embeddings);
  }
  if (auto path = f->get("logits-out")) {
    if (auto st = write_prompt_logits(**pipe, *ids, *path); !st) return fail(st.err());
  }
  engine::generation_request req;
  req.prompt.assign(ids->begin(), ids->end());
  req.max_new_tokens = static_cast<int>(*max_new);
  req.sampling.temperature = static_cast<float>(*temperature);
  req.sampling.top_k = static_cast<int>(*top_k);
  req.sampling.top_p = static_cast<float>(*top_p);
  req.sampling.seed = static_cast<std::uint64_t>(*seed);
  req.stop_at_eos = !f->has("ignore-eos");
  std::unique_ptr<engine::local_pipeline> draft;
  std::unique_ptr<engine::token_proposer> proposer;
  std::unique_ptr<engine::speculative_decoder> spec;
  if (speculative && ngram) {
    std::vector<std::int32_t> corpus;
    if (auto path = f->get("ngram-corpus")) {
      auto ids = engine::read_token_ids(*path);
      if (!ids) return fail(make_error(ids.err().code, "--ngram-corpus: " + ids.err().message));
      corpus = std::move(ids).value();
    }
    auto p = engine::ngram_proposer::create(ngram_opts, std::move(corpus));
    if (!p) return fail(p.err());
    proposer = std::move(p).value();
    engine::speculative_options so;
    so.k = static_cast<int>(*spec_k);
    so.rejection_sampling = !f->has("spec-exact");
    auto sd = engine::speculative_decoder::create(**pipe, *proposer, so);
    if (!sd) return fail(make_error(sd.err().code, "--draft ngram: " + sd.err().message));
    spec = std::move(sd).value();
  } else if (speculative) {
    // The draft runs on the first rank's backend, as one stage.
    auto d = engine::local_pipeline::create(*backend->get(), draft_dir, 1, opts, static_cast<int>(*draft_layers));
    if (!d) return fail(make_error(d.err().code, "--draft: " + d.err().message));
    draft = std::move(d).value();
    engine::speculative_options so;
    so.k = static_cast<int>(*spec_k);
    so.rejection_sampling = !f->has("spec-exact");
    auto sd = engine::speculative_decoder::create(**pipe, *draft, so);
    if (!sd) return fail(sd.err());
    spec = std::move(sd).value();
  }
  auto res = spec ? spec->generate(std::vector<engine::generation_request>(n, req))
                  : (*pipe)->generate(std::vector<engine::generation_request>(n, req));
  if (!res) return fail(res.err());
  const auto& toks = (*res)[0].tokens;
  if (req.sampling.temperature <= 0.0f) {
    for (int i = 1; i < n; ++i) {
      if ((*res)[i].tokens != toks) {
        std::fprintf(stderr, "conveyor generate: warning: batch copy %d differs from copy 0\n", i);
        break;
      }
    }
  }
  if (spec && f->has("timing")) {
    const auto& st = spec->stats();
    std::fprintf(stderr,
                 "timing: speculative k %d: %lld target steps %.3f ms, %lld draft steps %.3f ms, %lld tokens, "
                 "%.1f tok/s; acceptance %.3f, %.2f tokens per target step\n",
                 static_cast<int>(*spec_k), static_cast<long long>(st.target_steps), st.target_seconds * 1e3,
                 static_cast<long long>(st.draft_steps), st.draft_seconds * 1e3, static_cast<long long>(st.emitted),
                 st.emitted / std::max(st.target_seconds + st.draft_seconds, 1e-9), st.acceptance_rate(),
                 st.tokens_per_target_step());
  } else if (f->has("timing")) {
    // Steps that carried prompt tokens are prefill; the rest decode one token per sequence.
    const auto& steps = (*pipe)->last_step_seconds();
    const std::size_t prefill_steps =
        std::max<std::size_t>(1, (static_cast<std::size_t>(n) * ids->size() + opts.max_step_tokens - 1) / opts.max_step_tokens);
    double prefill = 0.0, decode = 0.0;
    for (std::size_t i = 0; i < steps.size(); ++i) (i < prefill_steps ? prefill : decode) += steps[i];
    const std::size_t decode_steps = steps.size() > prefill_steps ? steps.size() - prefill_steps : 0;
    std::fprintf(stderr,
                 "timing: batch %d, prompt %zu: prefill %.3f ms (%.0f tok/s), %zu decode steps %.3f ms "
                 "(%.2f ms/step, %.0f tok/s)\n",
                 n, ids->size(), prefill * 1e3, n * ids->size() / std::max(prefill, 1e-9), decode_steps, decode * 1e3,
                 decode_steps ? decode * 1e3 / decode_steps : 0.0, decode_steps * n / std::max(decode, 1e-9));
  }
  if (format == "json") {
    std::printf("{\"tokens\":[");
    for (std::size_t i = 0; i < toks.size(); ++i) std::printf("%s%d", i ? "," : "", toks[i]);
    std::printf("],\"finish_reason\":\"%s\"", (*res)[0].finish_reason.c_str());
    if (text) std::printf(",\"text\":%s", nlohmann::json(text->tok->decode(toks)).dump().c_str());
    if (spec) {
      const auto& st = spec->stats();
      std::printf(",\"speculative\":{\"k\":%d,\"proposed\":%lld,\"accepted\":%lld,\"acceptance_rate\":%.4f,"
                  "\"tokens_per_target_step\":%.4f,\"target_steps\":%lld}",
                  static_cast<int>(*spec_k), static_cast<long long>(st.proposed), static_cast<long long>(st.accepted),
                  st.acceptance_rate(), st.tokens_per_target_step(), static_cast<long long>(st.target_steps));
    }
    std::printf("}\n");
  } else if (text) {
    std::printf("%s\n", text->tok->decode(toks).c_str());  // the completion, without the prompt
  } else {
    for (std::size_t i = 0; i < toks.size(); ++i) std::printf("%s%d", i ? " " : "", toks[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace conveyor::cli
