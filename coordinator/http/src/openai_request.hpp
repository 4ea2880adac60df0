#pragma once
// An OpenAI /v1/completions or /v1/chat/completions request body, checked and turned into a
// generate_request. Every rejection names the field (OpenAI's "param") and what is allowed.
#include <string>
#include <variant>
#include <vector>

#include "api_error.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::http {

struct completion_request {
  bool chat = false;
  service::generate_request generate;    ///< prompt ids, budget, sampling, stop ids
  bool stream = false;
  bool include_usage = false;            ///< stream_options.include_usage: a last chunk with usage
  std::vector<std::string> stop_strings; ///< "stop": text that ends the completion (not included)
  double timeout_s = 0.0;                ///< "timeout" (extension): 0 = the server's
  bool skip_special_tokens = true;       ///< vLLM's extension: keep special tokens in the text when false
};

struct request_context {
  const tokenizer::tokenizer* tok = nullptr;  ///< null: prompts must be ids, no chat
  std::string model_name;
  int vocab_size = 0;
  int max_context = 0;
};

/// Parses and checks a request body; `chat` selects the chat endpoint's fields.
std::variant<completion_request, api_error> parse_completion_request(const std::string& body, bool chat,
                                                                      const request_context& ctx);

}  // namespace conveyor::http
