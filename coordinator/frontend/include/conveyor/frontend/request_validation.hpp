#pragma once
// Checks a generate request against the served model before it reaches the service, so a bad request
// gets an error that names the field, and never costs the scheduler anything. Plain C++, unit-tested
// without RPC.
#include "conveyor/base/result.hpp"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::frontend {

struct request_limits {
  int vocab_size = 0;   ///< ids must be in [0, vocab_size); 0 = not checked
  int max_context = 0;  ///< prompt + max_new_tokens must fit; 0 = not checked
  int max_stop_ids = 1024;
};

/// ok, or an invalid_argument error that says which field is wrong, its value, and what is allowed.
status validate_request(const service::generate_request& request, const request_limits& limits);

}  // namespace conveyor::frontend
