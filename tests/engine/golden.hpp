#pragma once
// Reads a fixture's golden.safetensors (see tests/fixtures/README.md) for the engine tests.
#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace conveyor::testing
