#pragma once
// A deployment: everything one TOML file (configs/*.toml) says about a cluster, as plain structs.
// Only coordinator/config/src reads TOML (DESIGN.md layering); everything after the loader gets these.
// Every default is safe to run on a laptop: CPU, one stage, loopback addresses only.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/config/endpoint.hpp"

namespace conveyor::config {

/// Weight and activation type. TOML: "f32" | "bf16".
enum class model_dtype { f32, bf16 };
/// How the linear layers' weights are stored (quantized at load). TOML: "none" | "int8" | "fp8".
enum class weight_quantization { none, int8, fp8 };
/// Where the layers run. TOML: "cpu" | "cuda".
enum class device_kind { cpu, cuda };
/// TorchServe's parallelType. TOML: "pp" | "tp" | "pptp" | "custom".
enum class parallel_type {
  pp,      ///< pipeline stages only (tp = 1)
  tp,      ///< one tensor-parallel group (stages = 1)
  pptp,    ///< pipeline stages, each a tensor-parallel group
  custom,  ///< any stages × tp, usually with an explicit `layers` split
};
/// How the scheduler forms batches. TOML: "continuous" | "dynamic" | "static".
enum class batching_mode {
  continuous,  ///< sequences join and leave the running batch at every step
  dynamic,     ///< collect up to max_batch_size requests or max_batch_delay_ms, then run them to the end
  fixed,       ///< TOML "static": wait for exactly max_batch_size requests
};
/// How `conveyor launch` starts workers. TOML: "local" | "ssh" | "slurm".
enum class launch_method { local, ssh, slurm };

/// [model]
struct model_section {
  std::string dir;  ///< HF model directory; empty = not given yet (`--model DIR` may supply it)
  model_dtype dtype = model_dtype::f32;  ///< default: f32 on cpu, bf16 on cuda
  device_kind device = device_kind::cpu;
  /// int8: per-output-channel int8 (CPU and CUDA); fp8: E4M3 with per-channel scales (CUDA only).
  weight_quantization quantization = weight_quantization::none;
  bool quantize_lm_head = false;  ///< the LM head too (needs quantization != "none")
  /// Speculative decoding: a draft model of the same vocabulary proposes spec_k tokens per decode
  /// step, verified by the model in one pass. It runs in the coordinator's process (serve-local:
  /// the process; with device cuda on the first stage's GPU). draft = its HF directory (empty = the model itself, with draft_layers);
  /// draft_layers > 0 keeps only its first layers + its final norm and head. spec_k = 0: off.
  std::string draft;
  int draft_layers = 0;
  int spec_k = 0;
  /// Row-invariant bf16 kernels on every CUDA stage (kernels::cuda_backend_options::batch_invariant):
  /// a step of up to 16 tokens computes each token as a step of that token alone would, so
  /// speculative verification gives the plain decode steps' logits bit for bit. Unset: on exactly
  /// when spec_k > 0. Set it in a deployment without a draft to serve the reference the speculative
  /// one must equal (it costs ~25% at 2-16 sequences a step: the GEMV there, not cuBLAS).
  std::optional<bool> batch_invariant;
  /// draft = "ngram": no draft model; prompt lookup proposes (the tokens that followed the latest
  /// earlier occurrence of the sequence's last n tokens, n = ngram_max down to ngram_min), in the
  /// sequence itself and in ngram_corpus (a file of decimal token ids; empty = none).
  int ngram_min = 2;
  int ngram_max = 4;
  std::string ngram_corpus;
};

/// [parallel]
struct parallel_section {
  parallel_type type = parallel_type::pp;  ///< default: inferred from stages and tp
  int stages = 1;                          ///< pipeline-parallel size: number of pipeline stages
  int tp = 1;                              ///< tensor-parallel degree of every stage
  int chunks = 1;           ///< microbatches in flight; default: one per stage, so no stage idles
  std::vector<int> layers;  ///< layers per stage, first to last; empty = split as evenly as possible
};

/// One entry of [[placement.hosts]].
struct host_entry {
  std::string name = "localhost";     ///< unique label used in logs, plans and the ssh template
  std::string address = "127.0.0.1";  ///< what workers on this host bind to and advertise
  int gpus = 0;                       ///< GPUs on the host; 0 = count them at launch
  double gpu_memory_gib = 0;          ///< memory of each of its GPUs; 0 = unknown (fit not checked)
};

/// [placement]: which GPUs of which hosts run which stage. GPUs are assigned round-robin over the
/// usable ids of a host, `gpus_per_worker` at a time, and each worker gets CUDA_VISIBLE_DEVICES.
struct placement_section {
  std::vector<host_entry> hosts;  ///< default: one host, "localhost" at 127.0.0.1
  int nproc_per_node = 0;         ///< torchrun's spelling of GPUs per worker; 0 = not set
  int parallel_level = 0;         ///< TorchServe's spelling of the same; 0 = not set (never both)
  std::vector<int> device_ids;    ///< usable GPU ids on every host; empty = 0 .. gpus-1
};

/// [transport]: the UCX data plane between stages.
struct transport_section {
  std::string ucx_tls = "auto";  ///< "auto" | "tcp" | "shm" | a raw UCX_TLS list such as "tcp,cma"
  std::int64_t max_frame_bytes = std::int64_t{256} << 20;  ///< largest activation frame accepted
};

/// [cluster]: the control plane (CAF) between the coordinator and its workers.
struct cluster_section {
  endpoint listen{"127.0.0.1", 0};  ///< where the coordinator's actors are published; port 0 = any
  std::string token;                ///< shared secret workers present; empty = generated at start
  std::string token_file;           ///< file holding the token instead (never both)
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 5.0;  ///< a worker silent this long is declared dead
  /// A stage whose worker dies (or stops answering) gets a new worker process and the running
  /// requests carry on; false = the cluster goes down and they fail at once, naming the stage.
  bool recover_stages = true;
  int max_stage_restarts = 3;  ///< restarts of one stage before it is given up on (cluster down)
};

/// [frontend]: where clients connect.
struct frontend_section {
  endpoint rpc_listen{"127.0.0.1", 7600};  ///< Cap'n Proto RPC
  std::optional<endpoint> http_listen;     ///< OpenAI-compatible HTTP; absent = off
};

/// [serving]: scheduling, admission and memory policy (issue 6).
struct serving_section {
  batching_mode batching = batching_mode::continuous;
  int max_batch_size = 32;             ///< sequences per step
  int max_batch_delay_ms = 5;          ///< dynamic batching: longest wait to fill a batch
  int max_batch_tokens = 2048;         ///< tokens per step; longer prompts are prefilled in chunks
  int job_queue_size = 100;            ///< requests waiting to start
  std::int64_t max_queued_tokens = 0;  ///< prompt tokens waiting to start; 0 = no cap
  bool use_job_ticket = false;         ///< reject at once ("overloaded") instead of queueing
  bool prefix_caching = true;          ///< share full KV blocks between prompts with the same prefix
  bool queued_steps = true;            ///< one stage: plan step n+1 before step n's tokens return
  double response_timeout_s = 120;     ///< a request running longer is cancelled everywhere
  double startup_timeout_s = 120;      ///< the whole cluster must be ready within this
  int min_workers = 1;                 ///< pipeline replicas kept running
  int max_workers = 1;                 ///< pipeline replicas at most
  int kv_block_size = 16;              ///< tokens per KV block
  int kv_blocks = 0;                   ///< KV blocks per stage; 0 = size them from kv_memory_fraction
  double kv_memory_fraction = 0.9;     ///< share of device memory left after weights given to KV
  int max_context = 0;                 ///< longest sequence (prompt + output); 0 = the model's limit
  /// Each stage runs throwaway steps at load, before it reports ready: a short prefill, then a
  /// decode step of each of warm_up_batches sequences (a GPU's first steps of a shape pay kernel
  /// loading, GEMM timing and the step graph's recording; these are paid at load instead).
  bool warm_up = true;
  /// Sequence counts of the warm-up's decode steps; empty = the default for the device (cuda: 1, 2,
  /// 4, ... 64 up to max_batch_size; cpu: none, as nothing there is paid on first use).
  std::vector<int> warm_up_batches;
};

/// [launch]: how `conveyor launch` starts processes on the hosts.
struct launch_section {
  launch_method method = launch_method::local;
  /// Run by /bin/sh on this machine, once per worker. {host} = the host's address, {name} = its
  /// name, {command} = the worker's command line as one quoted word, for a shell on the far side.
  std::string ssh_command = "ssh {host} {command}";
  std::string srun_command = "srun";  ///< "slurm": srun and its options; one step starts every worker
  std::string executable;  ///< the conveyor binary on the hosts; empty = the path of this one
};

/// Where a key's value came from, for messages that point at it.
struct source_position {
  std::string source;  ///< config file name, or the flag ("--stages") that set it
  int line = 0;        ///< 1-based; 0 for a flag
  int column = 0;      ///< 1-based; 0 for a flag
};

/// A whole deployment. Values are resolved: defaults that depend on other keys (dtype, type, chunks,
/// hosts) are filled in, so consumers read fields directly.
struct deployment {
  model_section model;
  parallel_section parallel;
  placement_section placement;
  transport_section transport;
  cluster_section cluster;
  frontend_section frontend;
  serving_section serving;
  launch_section launch;
  /// Dotted key ("parallel.stages", "placement.hosts[1].gpus") → where it was set. A key that is
  /// absent kept its default. Error messages and `describe` use it.
  std::map<std::string, source_position, std::less<>> origins;
};

/// GPUs each worker process gets: parallel_level or nproc_per_node when set, else parallel.tp.
int gpus_per_worker(const deployment& d);

/// model.batch_invariant as set, else on exactly when speculative decoding is (spec_k > 0).
bool batch_invariant(const model_section& m);

/// The warm-up's decode batch sizes each stage runs at load: none with serving.warm_up false;
/// serving.warm_up_batches where set; else on cuda 1, 2, 4, ... 64 up to max_batch_size, on cpu none.
std::vector<int> warm_up_batches(const deployment& d);

/// The UCX_TLS value for transport.ucx_tls; empty means "leave UCX_TLS unset" (auto).
std::string ucx_tls_env(const transport_section& t);

/// TOML spellings of the enums.
std::string_view to_string(model_dtype v);
std::string_view to_string(device_kind v);
std::string_view to_string(weight_quantization v);
std::string_view to_string(parallel_type v);
std::string_view to_string(batching_mode v);
std::string_view to_string(launch_method v);

}  // namespace conveyor::config
