#include "conveyor/stage/plan_convert.hpp"

namespace conveyor::stage {

transport::frame_header to_frame_header(const engine::step_plan& plan, std::uint64_t microbatch, std::uint64_t step) {
  transport::frame_header h;
  h.kind = transport::frame_kind::control;
  h.microbatch_id = microbatch;
  h.step = step;
  for (const auto& s : plan.seqs) {
    transport::sequence_plan p;
    p.seq_id = s.seq_id;
    p.tokens = s.tokens;
    p.start_pos = s.start_pos;
    p.block_table = s.block_table;
    p.logits = static_cast<transport::logits_mode>(s.logits);
    p.sample = s.sample;
    p.sample_rows = s.sample_rows;
    p.sampling = {s.sampling.temperature, s.sampling.top_k, s.sampling.top_p, s.sampling.seed, s.sampling.step};
    h.seqs.push_back(std::move(p));
  }
  return h;
}

engine::step_plan to_step_plan(const transport::frame_header& h) {
  engine::step_plan plan;
  for (const auto& p : h.seqs) {
    engine::sequence_step s;
    s.seq_id = p.seq_id;
    s.tokens = p.tokens;
    s.start_pos = p.start_pos;
    s.block_table = p.block_table;
    s.logits = static_cast<engine::logits_mode>(p.logits);
    s.sample = p.sample;
    s.sample_rows = p.sample_rows;
    s.sampling = {p.sampling.temperature, p.sampling.top_k, p.sampling.top_p, p.sampling.seed, p.sampling.step};
    plan.seqs.push_back(std::move(s));
  }
  return plan;
}

}  // namespace conveyor::stage
