// Fuzz target: a safetensors file (8-byte header length, JSON header, tensor data) as the checkpoint
// loader validates it. Whatever it accepts must describe tensors inside the buffer: reading the first
// and last byte of each lets AddressSanitizer check the offsets that validation let through.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "conveyor/engine/safetensors.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using conveyor::engine::safetensors_file;
  auto file = safetensors_file::from_bytes(std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors");
  if (!file) {
    CONVEYOR_FUZZ_CHECK(!file.err().message.empty());
    return 0;
  }
  volatile std::uint8_t sink = 0;
  for (const auto& t : file->tensors()) {
    CONVEYOR_FUZZ_CHECK(t.begin <= t.end);
    CONVEYOR_FUZZ_CHECK(t.numel() >= 0);  // the engine sizes its copies from this
    CONVEYOR_FUZZ_CHECK(file->find(t.name) == &t);
    if (t.end > t.begin) {
      sink = sink ^ file->data(t)[0] ^ file->data(t)[t.end - t.begin - 1];
    }
  }
  return 0;
}
