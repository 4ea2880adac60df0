#pragma once
// `conveyor plan`'s output: the placement as a table (stage → host → GPUs → layers) and the memory
// of every GPU, as text for people.
#include <string>

#include "conveyor/config/deployment.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/placement/memory_estimate.hpp"
#include "conveyor/placement/placement.hpp"

namespace conveyor::placement {

/// A header line, one row per stage, one per device, then the notes.
std::string format_plan(const placement_plan& plan, const memory_estimate& memory, const config::deployment& d,
                        const engine::model_config& model);

}  // namespace conveyor::placement
