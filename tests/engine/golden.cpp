#include "golden.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#ifndef CONVEYOR_FIXTURES
#error "CONVEYOR_FIXTURES must name tests/fixtures"
#endif

namespace conveyor::testing {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& name) { return std::string(CONVEYOR_FIXTURES) + "/" + name; }

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(CONVEYOR_FIXTURES)) {
    if (e.is_directory() && fs::exists(e.path() / "golden.safetensors")) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
template <class T>
std::vector<T> read(const engine::safetensors_file& f, const std::string& key) {
  const engine::tensor_info* t = f.find(key);
  if (t == nullptr) throw std::runtime_error(f.path() + ": no " + key);
  std::vector<T> v(t->numel());
  if (t->end - t->begin != v.size() * sizeof(T)) throw std::runtime_error(key + ": unexpected dtype");
  std::memcpy(v.data(), f.data(*t), t->end - t->begin);
  return v;
}
}  // namespace

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
    gp.input_ids = read<std::int32_t>(*file, p + "input_ids");
    gp.logits = read<float>(*file, p + "logits");
    gp.hidden_states = read<float>(*file, p + "hidden_states");
    gp.greedy = read<std::int32_t>(*file, p + "greedy");
    gp.greedy_logits = read<float>(*file, p + "greedy_logits");
    g.prompts.push_back(std::move(gp));
  }
  return g;
}

}  // namespace conveyor::testing
