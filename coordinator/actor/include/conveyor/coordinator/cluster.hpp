#pragma once
// A running cluster: the coordinator actor in this process and one stage-worker process per
// pipeline stage, joined through CAF's middleman and wired stage to stage over UCX. The CAF types
// stay inside the .cpp files; callers see an inference_service.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/coordinator/launch_spec.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/service/serving_policy.hpp"

namespace conveyor::coordinator {

struct cluster_options {
  std::string model_dir;
  int stages = 1;
  std::vector<int> layers_per_stage;  ///< explicit split; empty = as even as possible
  int chunks = 1;                     ///< microbatches in flight
  std::string cluster_host = "127.0.0.1";  ///< where the coordinator's actor listens for workers
  std::uint16_t cluster_port = 0;          ///< 0 = any free port
  std::string token;                       ///< empty = a random one
  std::string ucx_tls = "auto";
  /// KV blocks of every stage; 0 = each worker sizes its pool from kv_memory_fraction of its free
  /// device memory (split between the stages that share a GPU) and the scheduler uses the least.
  int kv_blocks = 512;
  double kv_memory_fraction = 0.9;
  int kv_block_size = 16;
  int max_step_tokens = 512;
  int max_seqs_per_step = 64;
  int max_context = 0;  ///< 0 = the model's max_position_embeddings
  /// Decode batch sizes of the warm-up steps every stage runs at load (engine::warm_up, after a
  /// 16-token prefill); empty = no warm-up. config::warm_up_batches resolves serving.warm_up*.
  std::vector<int> warm_up_batches;
  service::serving_policy policy;  ///< batching mode, admission control, deadlines, prefix caching
  /// Speculative decoding (model.draft, model.draft_layers, model.spec_k): the draft model runs in
  /// the coordinator's process (on the CPU, or with `device` cuda on the first stage's GPU) and
  /// proposes spec_k tokens per decode step; the stages verify them in one pass. spec_k = 0: off.
  std::string draft_dir;  ///< empty = model_dir (with draft_layers); "ngram" = the n-gram proposer
  int draft_layers = 0;
  int spec_k = 0;
  /// CUDA stages (and the draft) use row-invariant bf16 kernels (model.batch_invariant; on with a draft).
  bool batch_invariant = false;
  int ngram_min = 2, ngram_max = 4;  ///< model.ngram_*: draft_dir "ngram" only
  std::string ngram_corpus;
  int worker_threads = 0;
  std::chrono::milliseconds heartbeat{500};          ///< how often workers are pinged
  std::chrono::milliseconds heartbeat_timeout{1500}; ///< a worker silent this long has failed
  /// A stage whose worker dies is restarted (new process, same layers), its neighbours rewired and
  /// the running requests re-prefilled; false = the cluster goes down and its requests fail at once.
  bool recover_stages = true;
  int max_stage_restarts = 3;  ///< per stage; one that dies more often is given up on (cluster down)
  std::uint64_t max_frame_bytes = std::uint64_t{256} << 20;  ///< largest activation frame a worker accepts
  std::chrono::seconds startup_timeout{120};
  std::string executable = "/proc/self/exe";  ///< the conveyor binary that runs `worker`
  std::int64_t step_delay_us = 0;             ///< test only: per-step sleep on every stage
  std::string device = "cpu";   ///< cpu | cuda
  std::string dtype = "f32";    ///< f32 | bf16 (cuda)
  std::string quant = "none";   ///< none | int8 | fp8 (cuda): linear weights quantized at load by every worker
  bool quant_lm_head = false;   ///< the LM head too
  /// GPUs the stages use, round-robin: stage k gets device_ids[k % size] as its only visible GPU
  /// (CUDA_VISIBLE_DEVICES). Empty = 0, 1, 2, ...
  std::vector<int> device_ids;
  /// Tensor-parallel ranks per stage: threads of the stage's worker process, joined by NCCL (GPUs)
  /// or the CPU collective. A CUDA stage k sees GPUs device_ids[k*tp .. k*tp+tp-1] (round-robin).
  int tp = 1;
  /// `conveyor launch`: where each stage's worker runs, in stage order (host, the address it binds
  /// and advertises, its CUDA_VISIBLE_DEVICES). Empty = every stage on this host, GPUs from
  /// device_ids as above (`conveyor serve`).
  std::vector<worker_site> sites;
  /// How the workers are started: directly, through ssh_template (run by /bin/sh here), or as one
  /// srun step (see launch_spec.hpp).
  launch_method launch = launch_method::local;
  std::string ssh_template = "ssh {host} {command}";
  std::string srun_command = "srun";
  std::string remote_executable;  ///< the conveyor binary on the hosts (ssh, slurm); empty = executable
  /// Start-up progress, one line per step of each stage ("host w1 (10.0.0.2) stage 0: loading ...").
  std::function<void(const std::string&)> on_progress;
  /// Polled while waiting for the workers: true aborts the start-up (a stop signal arrived).
  std::function<bool()> should_stop;
};

class cluster {
 public:
  /// Starts the coordinator and the workers, and returns once the canary token has passed every
  /// stage, or fails naming the host and stage that did not come up within startup_timeout (at once
  /// when a worker's process ends before it joined).
  static result<std::unique_ptr<cluster>> start(const cluster_options& options);
  virtual ~cluster() = default;
  /// The serving interface (thread-safe; callbacks arrive on actor threads).
  virtual service::inference_service& service() = 0;
  /// Pids of the current worker processes (a restarted stage's new one), launch order, which is stage
  /// order except for slurm's single step (for tests that kill one).
  virtual std::vector<int> worker_pids() const = 0;
  /// Stops workers and the coordinator; idempotent.
  virtual void shutdown() = 0;
};

}  // namespace conveyor::coordinator
