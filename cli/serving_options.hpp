#pragma once
// A deployment's [serving] section as the serving side's plain structs: the scheduler's policy
// (batching, admission control, deadlines) and the in-process service's options.
#include "conveyor/config/deployment.hpp"
#include "conveyor/service/local_inference_service.hpp"
#include "conveyor/service/serving_policy.hpp"

namespace conveyor::cli {

service::serving_policy serving_policy_of(const config::serving_section& s);

/// The in-process service for a one-process deployment: parallel.stages layer ranges on the CPU,
/// the [serving] batch, KV and policy settings. `threads` as `--threads` (0 = all cores).
service::local_service_options local_service_options_of(const config::deployment& d, int threads);

}  // namespace conveyor::cli
