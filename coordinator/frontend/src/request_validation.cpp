#include "conveyor/frontend/request_validation.hpp"

#include <cmath>
#include <cstdio>
#include <string>

namespace conveyor::frontend {

namespace {

error invalid(std::string message) { return make_error(errc::invalid_argument, std::move(message)); }

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

status check_ids(const std::vector<std::int32_t>& ids, const char* what, int vocab_size) {
  if (vocab_size <= 0) return ok_status();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return invalid(std::string(what) + " id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                     " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  return ok_status();
}

}  // namespace

status validate_request(const service::generate_request& r, const request_limits& limits) {
  if (r.prompt.empty()) return invalid("prompt is empty: send at least one token id");
  CONVEYOR_TRY(check_ids(r.prompt, "prompt", limits.vocab_size));
  if (r.max_new_tokens < 1) {
    return invalid("maxNewTokens must be at least 1, got " + std::to_string(r.max_new_tokens));
  }
  if (limits.max_context > 0 &&
      static_cast<long long>(r.prompt.size()) + r.max_new_tokens > limits.max_context) {
    return invalid("prompt (" + std::to_string(r.prompt.size()) + " tokens) + maxNewTokens (" +
                   std::to_string(r.max_new_tokens) + ") exceeds the context limit of " +
                   std::to_string(limits.max_context) + " tokens");
  }
  const auto& s = r.sampling;
  // NaN fails every comparison, so each test is written to accept only the allowed range.
  if (!(s.temperature >= 0.0f && s.temperature <= 100.0f)) {
    return invalid("sampling.temperature must be in [0, 100], got " + num(s.temperature));
  }
  if (s.top_k < 0) return invalid("sampling.topK must be >= 0 (0 = no limit), got " + std::to_string(s.top_k));
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return invalid("sampling.topP must be in (0, 1], got " + num(s.top_p));
  }
  if (static_cast<long long>(r.stop_ids.size()) > limits.max_stop_ids) {
    return invalid("stopIds has " + std::to_string(r.stop_ids.size()) + " ids, at most " +
                   std::to_string(limits.max_stop_ids) + " are allowed");
  }
  CONVEYOR_TRY(check_ids(r.stop_ids, "stop", limits.vocab_size));
  if (!(r.deadline_s >= 0.0 && std::isfinite(r.deadline_s))) {
    return invalid("deadlineS must be a finite number >= 0 (0 = server default), got " + num(r.deadline_s));
  }
  return ok_status();
}

}  // namespace conveyor::frontend
