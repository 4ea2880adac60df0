// Fuzz target: a GenerateRequest as the RPC frontend reads it: a Cap'n Proto message under the
// server's reader limits (rpc_server_options), copied off the wire by codec::decode_request, then
// checked by validate_request, as inference_impl::generate does. A request that passes must be one the
// scheduler can take without further checks.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec.hpp"
#include "conveyor/frontend/request_validation.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace conveyor;
  const frontend::rpc_server_options server;  // the limits `conveyor serve` runs with
  capnp::ReaderOptions options;
  options.traversalLimitInWords = server.max_message_bytes / sizeof(capnp::word);
  options.nestingLimit = server.max_nesting;
  // Messages arrive as whole words; a copy also gives Cap'n Proto the alignment it needs.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  if (words.size() == 0) return 0;
  std::memcpy(words.begin(), data, words.size() * sizeof(capnp::word));

  service::generate_request request;
  try {
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.begin(), words.size()), options);
    request = frontend::codec::decode_request(reader.getRoot<schema::rpc::GenerateRequest>());
  } catch (const kj::Exception&) {
    return 0;  // the RPC system turns this into an exception for the caller; the server carries on
  }
  const frontend::request_limits limits{32000, 2048, server.max_stop_ids};
  auto ok = frontend::validate_request(request, limits);
  if (!ok) {
    CONVEYOR_FUZZ_CHECK(ok.err().code == errc::invalid_argument && !ok.err().message.empty());
    return 0;
  }
  CONVEYOR_FUZZ_CHECK(!request.prompt.empty() && request.max_new_tokens >= 1);
  CONVEYOR_FUZZ_CHECK(request.prompt.size() + static_cast<std::size_t>(request.max_new_tokens) <=
                      static_cast<std::size_t>(limits.max_context));
  for (auto id : request.prompt) CONVEYOR_FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  for (auto id : request.stop_ids) CONVEYOR_FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  CONVEYOR_FUZZ_CHECK(request.stop_ids.size() <= static_cast<std::size_t>(limits.max_stop_ids));
  return 0;
}
