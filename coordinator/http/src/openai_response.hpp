#pragma once
// JSON bodies of OpenAI responses and stream chunks. Besides OpenAI's fields each choice carries
// "token_ids" (the generated ids; vLLM has the same extension), so clients without a tokenizer, and
// golden tests, see exactly what the model produced.
#include <cstdint>
#include <span>
#include <string>

namespace conveyor::http {

struct response_header {
  std::string id;  ///< "cmpl-..." / "chatcmpl-..."
  std::int64_t created = 0;
  std::string model;
  bool chat = false;
};

response_header make_header(bool chat, const std::string& model);

struct usage_counts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

/// The whole (non-streamed) response.
std::string completion_body(const response_header& h, const std::string& text, std::span<const std::int32_t> ids,
                            const std::string& finish_reason, const usage_counts& usage);
/// One SSE event's data: the chat role (first chunk of a chat), a text/ids delta, or the finish.
std::string chunk_body(const response_header& h, const std::string& text, std::span<const std::int32_t> ids,
                       const char* finish_reason, bool with_role);
/// The last chunk when stream_options.include_usage is set: no choices, the usage.
std::string usage_chunk_body(const response_header& h, const usage_counts& usage);

}  // namespace conveyor::http
