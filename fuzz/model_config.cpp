// Fuzz target: an HF config.json as the engine reads it, and what a loaded config feeds next (rotary
// tables, the stage split), since a value the parser lets through reaches them unchecked.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace conveyor::engine;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = parse_model_config(text, "fuzz/config.json");
  if (!config) {
    CONVEYOR_FUZZ_CHECK(!config.err().message.empty());
    return 0;
  }
  const model_config& c = *config;
  CONVEYOR_FUZZ_CHECK(c.num_layers >= 1 && c.num_heads >= 1 && c.num_kv_heads >= 1);
  CONVEYOR_FUZZ_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0);
  CONVEYOR_FUZZ_CHECK(c.sliding_window.size() == static_cast<std::size_t>(c.num_layers));
  auto rope = compute_rope_tables(c);
  CONVEYOR_FUZZ_CHECK(rope.inv_freq.size() == static_cast<std::size_t>(c.head_dim / 2));
  for (int stages : {1, 2, 3, 4}) {
    auto split = split_even(c, stages);
    if (!split) continue;
    int layers = 0;
    for (const auto& r : *split) layers += r.num_layers();
    CONVEYOR_FUZZ_CHECK(layers == c.num_layers);
  }
  return 0;
}
