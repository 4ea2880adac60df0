#pragma once
// Continuous batching over the paged KV cache, with `chunks` microbatches so a pipeline of stages
// always has work: while stage k runs microbatch m, stage k+1 runs m-1. A plain class (no actors, no
// threads): the coordinator actor and the in-process service drive it, and tests call it directly.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/kv_cache.hpp"
#include "conveyor/engine/step_plan.hpp"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::scheduler {

struct scheduler_options {
  int chunks = 1;               ///< microbatches in flight
  int max_seqs_per_step = 64;   ///< sequences in one microbatch step
  int max_step_tokens = 512;    ///< tokens in one microbatch step (long prompts are prefilled in chunks)
  int kv_blocks = 256;
  int kv_block_size = 16;
  int max_context = 4096;       ///< prompt + generated tokens of one sequence
  int vocab_size = 0;
  std::vector<std::int32_t> eos_ids;
};

struct scheduler_counters {
  std::int64_t running = 0;
  std::int64_t waiting = 0;
  std::int64_t finished = 0;
  std::int64_t failed = 0;
  std::int64_t cancelled = 0;
  std::int64_t tokens_generated = 0;
  int kv_blocks_free = 0;
};

class batch_scheduler {
 public:
  using clock = std::chrono::steady_clock;

  explicit batch_scheduler(const scheduler_options& options);

  /// Validates and queues a request; an invalid one is an error and is not queued.
  result<std::uint64_t> add(service::generate_request request, std::shared_ptr<service::token_sink> sink);
  /// Cancels a request: retired at once when it is not part of a step in flight, else when that
  /// step completes. Its sink gets finish_reason "cancelled". Unknown ids are ignored.
  void cancel(std::uint64_t id);

  /// The next step of microbatch `m`, admitting waiting requests into it while KV blocks, sequence
  /// and token budgets allow. nullopt when the microbatch has nothing to do or is already in flight.
  std::optional<engine::step_plan> next_step(int m);
  /// Applies the sampled tokens of microbatch `m`'s step (one per plan sequence, -1 where none was
  /// drawn): streams them, retires finished sequences and frees their blocks.
  void complete(int m, const std::vector<std::int32_t>& tokens);
  /// Fails microbatch `m`'s step: its sequences get `why` and are retired.
  void fail_step(int m, const error& why);
  /// Fails every request (e.g. a stage died and recovery is off).
  void fail_all(const error& why);

  bool has_work() const;
  bool in_flight(int m) const { return in_flight_[m]; }
  int chunks() const { return options_.chunks; }
  scheduler_counters counters() const;
  const engine::kv_block_manager& blocks() const { return blocks_; }

 private:
  struct sequence {
    std::uint64_t id = 0;
    service::generate_request request;
    std::shared_ptr<service::token_sink> sink;
    std::vector<std::int32_t> tokens;  ///< prompt, then generated
    int prompt_len = 0;
    int cached = 0;          ///< tokens whose KV is on the stages
    int microbatch = -1;     ///< -1 while waiting
    bool cancelled = false;
    clock::time_point submitted, scheduled, first_token;
    bool has_first_token = false;
  };

  void admit(int m);
  void retire(std::uint64_t id, result<service::generate_summary> outcome);
  service::generate_summary summary_of(const sequence& s, const char* reason) const;

  scheduler_options options_;
  engine::kv_block_manager blocks_;
  std::map<std::uint64_t, sequence> seqs_;
  std::deque<std::uint64_t> waiting_;
  std::vector<std::vector<std::uint64_t>> members_;    ///< sequences of each microbatch
  struct step_entry {
    std::uint64_t id;
    int tokens;  ///< new tokens the step carries for this sequence
  };
  std::vector<std::vector<step_entry>> step_seqs_;  ///< the sequences of the step in flight
  std::vector<bool> in_flight_;
  std::uint64_t next_id_ = 1;
  std::int64_t finished_ = 0, failed_ = 0, cancelled_ = 0, tokens_generated_ = 0;
};

}  // namespace conveyor::scheduler
