#pragma once
// Continuous batching over the paged KV cache, with `chunks` microbatches so a pipeline of stages
// always has work: while stage k runs microbatch m, stage k+1 runs m-1. A plain class (no actors, no
// threads): the coordinator actor and the in-process service drive it, and tests call it directly.
//
// Serving policy (issue 6), all here so every driver gets the same behaviour:
// - admission control: queue caps and job tickets turn a request away with errc::overloaded;
//   a request once accepted is never dropped.
// - deadlines: tick(now) cancels requests past their deadline (errc::deadline_exceeded).
// - batching modes: continuous, dynamic (fill or wait, then run to the end), fixed ("static").
// - KV pressure: blocks are taken step by step; when they run out the newest sequences give theirs
//   back and re-prefill their token history later, so greedy results never change.
// - prefix caching: full blocks are shared between sequences with the same token prefix.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/token_proposer.hpp"
#include "conveyor/engine/step_plan.hpp"
#include "conveyor/scheduler/kv_block_pool.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/service/serving_policy.hpp"

namespace conveyor::scheduler {

struct scheduler_options {
  int chunks = 1;               ///< microbatches in flight
  int max_seqs_per_step = 64;   ///< sequences in one microbatch (serving.max_batch_size)
  int max_step_tokens = 512;    ///< tokens in one microbatch step (long prompts are prefilled in chunks)
  int kv_blocks = 256;
  int kv_block_size = 16;
  int max_context = 4096;       ///< prompt + generated tokens of one sequence
  int vocab_size = 0;
  std::vector<std::int32_t> eos_ids;
  service::serving_policy policy;
  /// Speculative decoding: a decode step of a sequence carries up to spec_k tokens the draft
  /// proposes, and the last stage draws after each of them; the scheduler keeps the prefix equal to
  /// the target's own draws (so results never change, greedy or seeded) plus the target's next
  /// token, and rolls back the rest. Off when spec_k is 0 or there is no draft. Not owned.
  engine::token_proposer* draft = nullptr;
  int spec_k = 0;
};

struct scheduler_counters {
  std::int64_t running = 0;   ///< admitted to a microbatch (preempted ones included)
  std::int64_t waiting = 0;   ///< accepted, not started yet
  std::int64_t finished = 0;
  std::int64_t failed = 0;    ///< ended with an error (expired ones included)
  std::int64_t cancelled = 0;
  std::int64_t rejected = 0;  ///< turned away by admission control (never accepted)
  std::int64_t expired = 0;   ///< cancelled at their deadline
  std::int64_t preempted = 0; ///< times a sequence gave its blocks back under KV pressure
  std::int64_t tokens_generated = 0;
  int kv_blocks_free = 0;     ///< free or evictable
  int kv_blocks_cached = 0;   ///< naming a shared prefix
  prefix_cache_counters prefix;
  std::int64_t spec_steps = 0;     ///< sequence steps that carried draft tokens
  std::int64_t spec_proposed = 0;  ///< draft tokens verified
  std::int64_t spec_accepted = 0;  ///< of them kept
  std::int64_t spec_emitted = 0;   ///< tokens those steps produced (accepted + the target's own)
  std::int64_t steps_ahead = 0;    ///< steps next_step_ahead planned
};

class batch_scheduler {
 public:
  using clock = std::chrono::steady_clock;

  explicit batch_scheduler(const scheduler_options& options);

  /// Validates and queues a request. An invalid one is errc::invalid_argument; one that admission
  /// control turns away is errc::overloaded (with the reason and a retry hint). Neither is queued.
  result<std::uint64_t> add(service::generate_request request, std::shared_ptr<service::token_sink> sink);
  /// Cancels a request: retired at once when it is not part of a step in flight, else when that
  /// step completes. Its sink gets finish_reason "cancelled". Unknown ids are ignored.
  void cancel(std::uint64_t id);
  /// Cancels every request past its deadline (its sink gets errc::deadline_exceeded), at once or,
  /// when part of a step in flight, when that step completes. next_step calls it too.
  void tick(clock::time_point now);
  /// Arrivals have paused (an offline batch submitted its last line): dynamic and fixed batching
  /// start what they have instead of waiting for company, until the next add().
  void flush() { flush_ = true; }
  /// When a driver with nothing to run should call next_step/tick again: the earliest deadline, or
  /// when a dynamic batch stops waiting for company. nullopt = only a new event changes anything.
  std::optional<clock::time_point> next_wakeup() const;
  /// How often a driver without exact wakeups (the coordinator's timer) should call next_step, so
  /// deadlines and dynamic batching's delay are honoured promptly.
  std::chrono::milliseconds tick_period() const;

  /// The next step of microbatch `m`, admitting waiting requests into it as the batching mode, KV
  /// blocks, sequence and token budgets allow. nullopt when the microbatch has nothing to do now or
  /// is already in flight.
  std::optional<engine::step_plan> next_step(int m) { return next_step(m, clock::now()); }
  std::optional<engine::step_plan> next_step(int m, clock::time_point now);
  /// Queued steps (one stage): the step after microbatch `m`'s step in flight, planned
  /// before that step's tokens are known, so the stage can start it the moment it has drawn them
  /// (stage_executor::begin with `chain`) instead of after the tokens' round trip through the
  /// coordinator. It names the same sequences in the same order, one token each, whose ids the stage
  /// takes from the step in flight's draws (the plan's ids are placeholders). nullopt where that is
  /// not the step to run next: a sequence of the step in flight does not sample there, carries
  /// drafts, is doomed or ends by length; another member or a waiting request could join; KV blocks
  /// are short (never preempts); or a step is already queued behind it. A sequence that ends at the
  /// step in flight (a stop token) has the queued step's token dropped; it is retired when that step
  /// completes, so its blocks stay allocated while the stage writes them.
  std::optional<engine::step_plan> next_step_ahead(int m, clock::time_point now);
  std::optional<engine::step_plan> next_step_ahead(int m) { return next_step_ahead(m, clock::now()); }
  /// Applies the sampled tokens of microbatch `m`'s step (one per plan sequence, -1 where none was
  /// drawn; a sequence with draft tokens has sample_rows of them: engine::flat_sampled_tokens):
  /// streams them, retires finished sequences and frees their blocks. A step queued behind it
  /// (next_step_ahead) becomes the step in flight.
  void complete(int m, const std::vector<std::int32_t>& tokens);
  /// Fails microbatch `m`'s step (and the step queued behind it): its sequences get `why` and are retired.
  void fail_step(int m, const error& why);
  /// Fails every request (e.g. a stage died and recovery is off).
  void fail_all(const error& why);
  /// A stage died and comes back empty: forgets every step in flight (their results will never be
  /// applied), drops the KV blocks of every running sequence and the whole prefix cache (the new
  /// stage holds none of it), and has each sequence re-prefill its token history, prompt and
  /// generated tokens, when its microbatch runs next. Greedy results do not change (as with KV
  /// preemption). Sequences already doomed (cancelled, expired) are retired now.
  void reprefill_all();

  /// Sizes the KV pool once the stages have sized theirs from their free memory (the coordinator
  /// starts with an empty pool then). Only while no request is queued or running: false otherwise.
  bool set_kv_blocks(int blocks);

  bool has_work() const;
  bool in_flight(int m) const { return in_flight_[m]; }
  /// A step is queued behind microbatch `m`'s step in flight (next_step_ahead).
  bool ahead(int m) const { return !ahead_seqs_[m].empty(); }
  int chunks() const { return options_.chunks; }
  scheduler_counters counters() const;
  /// Writes the request, token, KV, policy, error and microbatch counters into a stats report (stage
  /// times untouched).
  void report(service::stats_report& r) const;
  const kv_block_pool& blocks() const { return pool_; }
  const scheduler_options& options() const { return options_; }

 private:
  /// Why a sequence will be retired when its step in flight completes.
  /// finished: it drew a stop token while a step queued behind it still writes its KV.
  enum class doom : std::uint8_t { none, cancelled, expired, finished };

  struct sequence {
    std::uint64_t id = 0;  ///< also its age: lower ids came first and keep their blocks longer
    service::generate_request request;
    std::shared_ptr<service::token_sink> sink;
    std::vector<std::int32_t> tokens;  ///< prompt, then generated
    int prompt_len = 0;
    int cached = 0;                    ///< tokens whose KV is on the stages
    std::vector<std::int32_t> blocks;  ///< block table: one hold on each
    int published = 0;                 ///< leading blocks named in the prefix cache
    std::uint64_t chain = 0;           ///< prefix hash of blocks [0, published)
    int microbatch = -1;               ///< -1 while waiting
    bool preempted = false;            ///< a member that gave its blocks back; re-prefills when there is room
    bool in_step = false;              ///< part of a step in flight: its blocks are being written
    bool in_ahead = false;             ///< part of the step queued behind it too (next_step_ahead)
    doom fate = doom::none;
    const char* finish_reason = "stop";  ///< with doom::finished: "stop" or "length"
    clock::time_point submitted, scheduled, first_token;
    clock::time_point deadline = clock::time_point::max();
    bool has_first_token = false;
  };

  // admission control (batch_scheduler.cpp)
  result<std::uint64_t> admit(service::generate_request request, std::shared_ptr<service::token_sink> sink);
  std::optional<std::string> overload_reason(const service::generate_request& r) const;
  // planning (step_planner.cpp)
  bool admission_open(int m, clock::time_point now) const;
  bool enter(sequence& s, bool may_preempt);
  bool grow(sequence& s, int tokens, bool may_preempt);
  bool preempt_newer_than(std::uint64_t id);
  void preempt(sequence& s);
  void drop_blocks(sequence& s);
  void publish_full_blocks(sequence& s);
  bool plan_sequence(int m, sequence& s, int& budget, engine::step_plan& plan);
  /// Speculative decoding: asks the draft for tokens for the plan's decode steps and appends them.
  void add_drafts(int m, int& budget, engine::step_plan& plan);

  void retire(std::uint64_t id, result<service::generate_summary> outcome);
  /// Retires a sequence whose fate is sealed (doom other than none), with what that fate reports.
  void retire_doomed(const sequence& s);
  /// Forgets every step in flight or queued: no sequence is in a step any more.
  void forget_steps();
  error deadline_error(const sequence& s, clock::time_point now) const;
  service::generate_summary summary_of(const sequence& s, const char* reason) const;

  scheduler_options options_;
  kv_block_pool pool_;
  std::map<std::uint64_t, sequence> seqs_;
  std::deque<std::uint64_t> waiting_;                  ///< accepted, never started: FIFO
  std::int64_t waiting_tokens_ = 0;                    ///< prompt tokens of waiting_
  std::vector<std::vector<std::uint64_t>> members_;    ///< sequences of each microbatch
  struct step_entry {
    std::uint64_t id;
    int tokens;  ///< new tokens the step carries for this sequence (draft tokens included)
    std::vector<std::int32_t> drafts;  ///< draft tokens among them (the last ones)
  };
  std::vector<std::vector<step_entry>> step_seqs_;  ///< the sequences of the step in flight
  std::vector<bool> in_flight_;
  std::vector<std::vector<step_entry>> ahead_seqs_;  ///< the step queued behind it (next_step_ahead), or empty
  int preempted_now_ = 0;  ///< members currently without blocks
  bool flush_ = false;
  std::uint64_t next_id_ = 1;
  std::int64_t finished_ = 0, failed_ = 0, cancelled_ = 0, rejected_ = 0, expired_ = 0, preemptions_ = 0;
  std::int64_t tokens_generated_ = 0;
  std::map<errc, std::int64_t> errors_;  ///< every error a request was answered with, by kind
  std::int64_t spec_steps_ = 0, spec_proposed_ = 0, spec_accepted_ = 0, spec_emitted_ = 0;
  std::int64_t steps_ahead_ = 0;
};

}  // namespace conveyor::scheduler
