#include "golden.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#ifndef CONVEYOR_FIXTURES
#error "CONVEYOR_FIXTURES must name tests/fixtures"
#endif

namespace conveyor::testing {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& name) { return std::string(CONVEYOR_FIXTURES) + "/" + name; }

std::string test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(CONVEYOR_FIXTURES)) {
    if (e.is_directory() && fs::exists(e.path() / "golden.safetensors")) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

result<std::vector<float>> sequence_logits(engine::local_pipeline& pipe, const std::vector<std::int32_t>& tokens) {
  CONVEYOR_TRY(pipe.blocks().reserve(1, static_cast<int>(tokens.size())));
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = 1;
  s.tokens = tokens;
  s.block_table = pipe.blocks().table(1);
  s.logits = engine::logits_mode::all;
  s.sample = false;
  plan.seqs.push_back(std::move(s));
  auto out = pipe.step(plan);
  pipe.blocks().release(1);
  if (!out) return out.err();
  return std::move(out->logits);
}

float max_abs_diff(const float* a, const float* b, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

golden_fixture load_golden(const std::string& name) {
  golden_fixture g;
  g.name = name;
  g.dir = fixture_dir(name);
  auto file = engine::safetensors_file::open(g.dir + "/golden.safetensors");
  if (!file) throw std::runtime_error(file.err().message);
  for (int i = 0;; ++i) {
    const std::string p = "p" + std::to_string(i) + ".";
    if (file->find(p + "input_ids") == nullptr) break;
    golden_prompt gp;
    gp.input_ids = read_tensor<std::int32_t>(*file, p + "input_ids");
    gp.logits = read_tensor<float>(*file, p + "logits");
    gp.hidden_states = read_tensor<float>(*file, p + "hidden_states");
    gp.greedy = read_tensor<std::int32_t>(*file, p + "greedy");
    gp.greedy_logits = read_tensor<float>(*file, p + "greedy_logits");
    g.prompts.push_back(std::move(gp));
  }
  return g;
}

}  // namespace conveyor::testing
