#pragma once
// Between the engine's step plan and the transport's frame header (the transport never includes the
// engine, so the stage layer converts).
#include "conveyor/engine/step_plan.hpp"
#include "conveyor/transport/frame.hpp"

namespace conveyor::stage {

transport::frame_header to_frame_header(const engine::step_plan& plan, std::uint64_t microbatch, std::uint64_t step);
engine::step_plan to_step_plan(const transport::frame_header& header);

}  // namespace conveyor::stage
