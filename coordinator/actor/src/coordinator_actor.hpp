#pragma once
// The coordinator actor (CAF; included by the actor TUs only).
#include <functional>
#include <optional>
#include <memory>

#include "caf/all.hpp"
#include "conveyor/coordinator/cluster.hpp"
#include "conveyor/engine/token_proposer.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/kernels/backend.hpp"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::coordinator {

/// A call from a frontend thread, carried to the actor in one message.
struct frontend_call {
  enum class kind { submit, cancel, health, stats, flush } what = kind::submit;
  std::uint64_t ticket = 0;
  service::generate_request request;
  std::shared_ptr<service::token_sink> sink;
  std::function<void(service::health_report)> health_reply;
  std::function<void(service::stats_report)> stats_reply;
};
using frontend_call_ptr = std::shared_ptr<frontend_call>;

using frontend_atom = caf::atom_constant<caf::atom("frontend")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;

/// What the coordinator needs besides the options: the model's geometry and the stage split.
struct coordinator_setup {
  cluster_options options;
  std::vector<engine::stage_range> ranges;
  int vocab_size = 0;
  int max_context = 0;
  /// Per stage: the stages whose workers share its GPU (gpu_sharers); empty = 1 each.
  std::vector<int> gpu_sharers;
  std::vector<std::int32_t> eos_ids;
  std::int32_t canary_token = 0;
  /// Starts a new worker process for stage k (after stopping what is left of the old one); its pid.
  /// Called inside the actor. Empty = stages cannot be restarted.
  std::function<result<int>(int)> restart_stage;
  /// How the process started for stage k ended, once it has (nothing while it runs): lets a
  /// replacement that dies before it joins count as a failed restart at once, not after the
  /// start-up timeout. Called inside the actor. Empty = not watched.
  std::function<std::optional<std::string>(int)> stage_process_ended;
  /// Speculative decoding's draft model (options.spec_k > 0), in this process: the scheduler asks
  /// it for draft tokens while it plans a step. TODO(perf): draft on its own thread, so the actor
  /// keeps answering while the draft runs.
  struct draft_model {
    std::unique_ptr<kernels::backend> backend;
    std::unique_ptr<engine::token_proposer> proposer;
  };
  std::shared_ptr<draft_model> draft;
};

/// Spawns the coordinator actor; it launches nothing itself (cluster.cpp starts the processes).
caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_setup setup);

}  // namespace conveyor::coordinator

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(conveyor::coordinator::frontend_call_ptr)
