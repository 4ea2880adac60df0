#pragma once
// Where every pipeline stage runs: stage → host → GPUs → layers, from a deployment and the model.
//
// TorchServe's meanings throughout. A *worker* is `gpus_per_worker` GPUs of one host (nproc_per_node
// or parallel_level; default parallel.tp); it gets them as CUDA_VISIBLE_DEVICES, handed out
// round-robin over the host's usable ids (placement.device_ids, else 0 .. gpus-1) in consecutive
// blocks: 8 GPUs with 4 per worker give "0,1,2,3" and "4,5,6,7"; device_ids [2,3,4,5] with 2 per
// worker give "2,3" and "4,5". A worker holds gpus_per_worker / tp consecutive pipeline stages, each
// a tensor-parallel group of tp GPUs, so a TP group never spans hosts; pipeline stages may. Every
// parallel.type (pp, tp, pptp, custom) is placed this way: the type only constrains stages and tp
// (checked by the config loader); each stage runs as one process with its TP ranks as threads.
//
// Workers are spread over placement.hosts in order, as evenly as the hosts' GPUs allow, in
// contiguous blocks, so that the fewest stage boundaries cross the network.
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"
#include "conveyor/engine/model_config.hpp"

namespace conveyor::placement {

/// One pipeline stage and where it runs.
struct stage_placement {
  int stage = 0;
  int worker = 0;          ///< index into placement_plan::workers
  int host = 0;            ///< index into placement_plan::hosts
  std::vector<int> gpus;   ///< the stage's tensor-parallel group, ids on its host; empty on cpu
  int first_layer = 0;     ///< inclusive
  int last_layer = 0;      ///< exclusive
  int num_layers() const { return last_layer - first_layer; }
};

/// One worker: a block of GPUs on one host and the stages that run on them.
struct worker_placement {
  int host = 0;
  std::vector<int> gpus;    ///< its CUDA_VISIBLE_DEVICES; empty on cpu
  std::vector<int> stages;  ///< consecutive stage numbers
};

struct placement_plan {
  std::vector<config::host_entry> hosts;  ///< placement.hosts, in order
  std::vector<worker_placement> workers;
  std::vector<stage_placement> stages;
  int tp = 1;
  int gpus_per_worker = 1;
  bool uses_gpus = false;           ///< model.device = "cuda"
  std::vector<std::string> notes;   ///< assumptions worth a line: GPU counts not given, idle hosts
};

/// "0,1,2,3": a GPU list as CUDA_VISIBLE_DEVICES spells it.
std::string visible_devices(const std::vector<int>& gpus);

/// TorchServe's round-robin: worker w gets `per_worker` ids starting at position w × per_worker of
/// `usable`, wrapping around (so workers share GPUs only when there are more than the ids allow).
std::vector<std::vector<int>> round_robin(const std::vector<int>& usable, int per_worker, int workers);

/// Places a checked deployment for a model; errors say which keys do not fit together. The model's
/// shape is checked with config::validate_against_model first.
result<placement_plan> place(const config::deployment& d, const engine::model_config& model);

}  // namespace conveyor::placement
