// Fuzz target: the bytes of a frame header and of a channel hello as a stage receives them from its
// upstream neighbour. A header the decoder accepts must be one the stage can use as is: its payload size
// computes, and it encodes and decodes back to itself.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "compact_header.hpp"  // transport/src: the compact form's internals
#include "conveyor/transport/frame_codec.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace conveyor::transport;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);

  // A receiver decodes each frame into the previous frame's header (channel::receive_into), and a
  // send state encodes into its previous header's vector: both kept across inputs here, and they
  // must agree with a fresh decode and encode.
  static frame_header reused;
  static std::vector<std::byte> reused_bytes;
  auto h = decode_header(bytes);
  const bool into_ok = decode_header_into(bytes, reused).ok();
  CONVEYOR_FUZZ_CHECK(into_ok == h.ok());
  // The compact form's one-pass check (decode_header_into's fast path) accepts exactly what the
  // strict decode plus the plan checks accept, and yields the same header; decode_header_into
  // trusts it when it says yes, so a wrong yes would let a bad frame through.
  if (conveyor::transport::compact::is_compact(bytes) && bytes.size() <= codec_limits{}.max_header_bytes) {
    static frame_header checked;
    const codec_limits limits;
    const bool fast_ok = conveyor::transport::compact::decode_checked(bytes, limits.max_seqs, limits.max_dims, checked);
    CONVEYOR_FUZZ_CHECK(fast_ok == h.ok());
    if (fast_ok) CONVEYOR_FUZZ_CHECK(checked == *h);
    // decode_frame_header multiplies the shape out unchecked on this yes: it must compute.
    if (fast_ok) CONVEYOR_FUZZ_CHECK(payload_bytes(checked.tensor).ok());
  }
  // decode_frame_header (a channel's receive) is decode_header_into then check_payload_size, for a
  // payload of the right size and of a wrong one.
  if (h) {
    static frame_header framed;
    const std::uint64_t want = *payload_bytes(h->tensor);
    CONVEYOR_FUZZ_CHECK(decode_frame_header(bytes, want, framed).ok() && framed == *h);
    auto wrong = decode_frame_header(bytes, want + 1, framed);
    auto expected = check_payload_size(*h, want + 1);
    CONVEYOR_FUZZ_CHECK(!wrong.ok() && !expected.ok() && wrong.err().message == expected.err().message);
  } else {
    static frame_header framed;
    auto st = decode_frame_header(bytes, 0, framed);
    CONVEYOR_FUZZ_CHECK(!st.ok() && st.err().message == h.err().message);
  }
  if (h) {
    CONVEYOR_FUZZ_CHECK(reused == *h);
    CONVEYOR_FUZZ_CHECK(encode_header_into(*h, reused_bytes, 3, header_form::automatic, 5).ok());
    auto fresh = encode_header(*h, 3);
    CONVEYOR_FUZZ_CHECK(fresh.ok() && fresh->size() == reused_bytes.size() &&
                        std::equal(fresh->begin() + 3, fresh->end(), reused_bytes.begin() + 3));
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
