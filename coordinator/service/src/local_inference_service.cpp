#include "conveyor/service/local_inference_service.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "conveyor/engine/draft_proposer.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/engine/warm_up.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/scheduler/batch_scheduler.hpp"

namespace conveyor::service {

namespace {

class local_inference_service final : public inference_service {
 public:
  local_inference_service(std::unique_ptr<kernels::backend> backend, std::unique_ptr<engine::local_pipeline> pipe,
                          std::unique_ptr<engine::token_proposer> draft, scheduler::scheduler_options sopts,
                          model_info info, std::int64_t step_delay_us)
      : backend_(std::move(backend)), pipe_(std::move(pipe)), draft_(std::move(draft)),
        scheduler_(with_draft(std::move(sopts), draft_.get())), info_(std::move(info)),
        step_delay_us_(step_delay_us), thread_([this] { loop(); }) {}

  ~local_inference_service() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::uint64_t submit(generate_request request, std::shared_ptr<token_sink> sink) override {
    std::lock_guard lock(mu_);
    const std::uint64_t ticket = next_ticket_++;
    commands_.push_back([this, ticket, r = std::move(request), sink]() mutable {
      auto id = scheduler_.add(std::move(r), sink);
      if (!id) {
        sink->on_done(id.err());
        return;
      }
      ids_[ticket] = *id;
    });
    cv_.notify_all();
    return ticket;
  }

  void cancel(std::uint64_t ticket) override {
    post([this, ticket] {
      if (auto it = ids_.find(ticket); it != ids_.end()) scheduler_.cancel(it->second);
    });
  }

  void health(std::function<void(health_report)> reply) override {
    post([this, reply = std::move(reply)] {
      health_report h;
      h.ready = true;
      for (int s = 0; s < info_.stages; ++s) h.stages.push_back({s, 0, "ready", "in process"});
      reply(std::move(h));
    });
  }

  void stats(std::function<void(stats_report)> reply) override {
    post([this, reply = std::move(reply)] {
      stats_report r;
      scheduler_.report(r);
      r.stage_busy_s.assign(info_.stages, busy_s_ / info_.stages);
      r.stage_idle_s.assign(info_.stages, 0.0);
      reply(std::move(r));
    });
  }

  model_info info() const override { return info_; }

  void flush() override {
    post([this] { scheduler_.flush(); });
  }

 private:
  static scheduler::scheduler_options with_draft(scheduler::scheduler_options o, engine::token_proposer* d) {
    o.draft = d;
    return o;
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      commands_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }

  void loop() {
    // Whether the last next_step had work: if not, sleep until a command arrives or the scheduler's
    // next deadline or batching delay, instead of spinning (a dynamic or static batch may be
    // waiting for company).
    bool stepping = false;
    for (;;) {
      std::deque<std::function<void()>> batch;
      {
        std::unique_lock lock(mu_);
        auto woken = [&] { return stopping_ || !commands_.empty(); };
        if (!stepping) {
          if (auto at = scheduler_.next_wakeup()) {
            cv_.wait_until(lock, *at, woken);
          } else {
            cv_.wait(lock, woken);
          }
        }
        if (stopping_) break;
        batch.swap(commands_);
      }
      for (auto& fn : batch) fn();
      auto plan = scheduler_.next_step(0);
      stepping = plan.has_value();
      if (!plan) continue;
      const auto t0 = std::chrono::steady_clock::now();
      auto out = pipe_->step(*plan);
      if (step_delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us_));
      busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (out) {
        scheduler_.complete(0, engine::flat_sampled_tokens(*plan, *out));
      } else {
        scheduler_.fail_step(0, out.err());
      }
      // Forget tickets of retired requests lazily: bounded by the requests in the scheduler.
      if (ids_.size() > 4096 && !scheduler_.has_work()) ids_.clear();
    }
    scheduler_.fail_all(make_error(errc::internal, "the service is shutting down"));
  }

  std::unique_ptr<kernels::backend> backend_;
  std::unique_ptr<engine::local_pipeline> pipe_;
  std::unique_ptr<engine::token_proposer> draft_;  // before scheduler_, which points at it
  scheduler::batch_scheduler scheduler_;  // touched only on thread_
  model_info info_;
  std::unordered_map<std::uint64_t, std::uint64_t> ids_;  // ticket -> scheduler id, on thread_
  double busy_s_ = 0.0;
  std::int64_t step_delay_us_ = 0;  // benchmarks: modelled device time per step
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> commands_;
  std::uint64_t next_ticket_ = 1;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything above is constructed
};

}  // namespace

result<std::unique_ptr<inference_service>> make_local_inference_service(const std::string& model_dir,
                                                                        const local_service_options& o) {
  auto backend = kernels::make_cpu_backend({o.threads});
  CONVEYOR_TRY_ASSIGN(config, engine::load_model_config(model_dir));
  const int max_context = o.max_context > 0 ? o.max_context : config.max_position_embeddings;
  engine::executor_options eo;
  eo.kv_blocks = o.kv_blocks;
  eo.kv_block_size = o.kv_block_size;
  eo.max_step_tokens = o.max_step_tokens;
  eo.max_seqs = o.max_seqs_per_step;
  CONVEYOR_TRY_ASSIGN(quant, engine::parse_weight_quant(o.quant));
  eo.quant.kind = quant;
  eo.quant.lm_head = o.quant_lm_head;
  CONVEYOR_TRY_ASSIGN(pipe, engine::local_pipeline::create(*backend, model_dir, o.stages, eo));
  if (!o.warm_up_batches.empty()) {
    engine::warm_up_options w;
    w.decode_batches = o.warm_up_batches;
    for (auto& stage : pipe->stages()) CONVEYOR_TRY(engine::warm_up(*stage, w));
  }
  scheduler::scheduler_options so;
  so.chunks = 1;  // one process runs the stages back to back: nothing to overlap
  so.max_seqs_per_step = o.max_seqs_per_step;
  so.max_step_tokens = o.max_step_tokens;
  so.kv_blocks = o.kv_blocks;
  so.kv_block_size = o.kv_block_size;
  so.max_context = std::min(max_context, o.kv_blocks * o.kv_block_size);
  so.vocab_size = config.vocab_size;
  so.eos_ids = config.eos_token_ids;
  so.policy = o.policy;
  std::unique_ptr<engine::token_proposer> draft;
  if (o.spec_k > 0 && o.draft_dir == "ngram") {
    CONVEYOR_TRY_ASSIGN(p, engine::make_ngram_proposer({o.ngram_min, o.ngram_max}, o.ngram_corpus));
    if (auto st = p->check_vocabulary(config.vocab_size); !st) {
      return make_error(st.err().code, "model.ngram_corpus: " + st.err().message);
    }
    draft = std::move(p);
    so.spec_k = o.spec_k;
  } else if (o.spec_k > 0) {
    // The draft's KV holds as many sequences as the target's, each up to the same context.
    CONVEYOR_TRY_ASSIGN(dpipe, engine::local_pipeline::create(*backend, o.draft_dir.empty() ? model_dir : o.draft_dir,
                                                              1, eo, o.draft_layers));
    if (dpipe->config().vocab_size != config.vocab_size) {
      return make_error(errc::invalid_argument, "model.draft has a vocabulary of " +
                                                    std::to_string(dpipe->config().vocab_size) + " tokens, the model " +
                                                    std::to_string(config.vocab_size));
    }
    draft = std::make_unique<engine::draft_proposer>(std::move(dpipe));
    so.spec_k = o.spec_k;
  }
  model_info info{model_dir, config.model_type, config.vocab_size, config.num_layers, config.hidden_size,
                  o.stages, 1, 1, so.max_context};
  return std::unique_ptr<inference_service>(
      new local_inference_service(std::move(backend), std::move(pipe), std::move(draft), so, std::move(info),
                                  o.step_delay_us));
}

}  // namespace conveyor::service
