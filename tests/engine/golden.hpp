#pragma once
// Reads a fixture's golden.safetensors (see tests/fixtures/README.md) for the engine tests.
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/safetensors.hpp"

namespace conveyor::testing {

struct golden_prompt {
  std::vector<std::int32_t> input_ids;
  std::vector<float> logits;         ///< [T, vocab]
  std::vector<float> hidden_states;  ///< [layers + 1, T, hidden]
  std::vector<std::int32_t> greedy;  ///< [24]
  std::vector<float> greedy_logits;  ///< [24, vocab]
};

struct golden_fixture {
  std::string name;
  std::string dir;
  std::vector<golden_prompt> prompts;
};

/// Fixture directories under tests/fixtures that hold a golden.safetensors.
std::vector<std::string> fixture_names();
std::string fixture_dir(const std::string& name);
golden_fixture load_golden(const std::string& name);
/// `name` as a gtest parameter name (those allow letters, digits and '_': a fixture's '-' becomes '_').
std::string test_name(std::string name);

/// Every position's logits ([tokens, vocab]) of `tokens` run as sequence 1 in one step of `pipe`
/// (a prefill; its KV blocks are released after). Errors: the pipeline's.
result<std::vector<float>> sequence_logits(engine::local_pipeline& pipe, const std::vector<std::int32_t>& tokens);

/// Largest |a[i] - b[i]| over n values; infinity when a difference is NaN.
float max_abs_diff(const float* a, const float* b, std::size_t n);

/// Tensor `key` of a golden file, as T; throws when it is missing or not of T's size (a broken
/// fixture, not a test outcome).
template <class T>
std::vector<T> read_tensor(const engine::safetensors_file& f, const std::string& key) {
  const engine::tensor_info* t = f.find(key);
  if (t == nullptr) throw std::runtime_error(f.path() + ": no " + key);
  std::vector<T> v(t->numel());
  if (t->end - t->begin != v.size() * sizeof(T)) throw std::runtime_error(key + ": unexpected dtype");
  std::memcpy(v.data(), f.data(*t), t->end - t->begin);
  return v;
}

}  // namespace conveyor::testing
