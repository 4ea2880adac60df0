// Fuzz target: the bytes of a frame header and of a channel hello as a stage receives them from its
// upstream neighbour. A header the decoder accepts must be one the stage can use as is: its payload size
// computes, and it encodes and decodes back to itself.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "conveyor/transport/frame_codec.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace conveyor::transport;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);

  if (auto h = decode_header(bytes); h) {
    auto payload = payload_bytes(h->tensor);
    CONVEYOR_FUZZ_CHECK(payload.ok());
    CONVEYOR_FUZZ_CHECK(check_payload_size(*h, *payload).ok());
    auto encoded = encode_header(*h);
    CONVEYOR_FUZZ_CHECK(encoded.ok());
    // A message may point several times at one list; its canonical copy can be larger than the input.
    codec_limits roomy;
    roomy.max_header_bytes = std::numeric_limits<std::size_t>::max();
    roomy.max_traversal_words = std::numeric_limits<std::uint64_t>::max();
    auto again = decode_header(*encoded, roomy);
    CONVEYOR_FUZZ_CHECK(again.ok() && *again == *h);
  }

  if (auto hello = decode_hello(bytes); hello) {
    auto encoded = encode_hello(*hello);
    CONVEYOR_FUZZ_CHECK(encoded.ok());
    auto again = decode_hello(*encoded);
    CONVEYOR_FUZZ_CHECK(again.ok() && again->schema_version == hello->schema_version &&
                        again->channel_id == hello->channel_id && again->instance == hello->instance &&
                        again->max_payload_bytes == hello->max_payload_bytes);
  }
  return 0;
}
