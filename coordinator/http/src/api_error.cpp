#include "api_error.hpp"

#include <nlohmann/json.hpp>

namespace conveyor::http {

api_error from_service_error(const error& e) {
  switch (e.code) {
    case errc::invalid_argument:
    case errc::unsupported:
      return {400, "invalid_request_error", e.message, "", "invalid_value"};
    case errc::out_of_memory:
    case errc::overloaded:
      // The service as a whole has no room now (its job queue caps, a job ticket it cannot grant, KV
      // blocks): 503 + Retry-After, as OpenAI answers "the engine is overloaded". Not 429: that is for
      // limits on one client, and the service's caps are server-wide (the gateway's own cap on
      // requests in progress answers 429, see http_server.cpp).
      return {503, "server_error", e.message, "", "overloaded"};
    case errc::deadline_exceeded:
      // The request's deadline (its `timeout`, or serving.response_timeout_s) passed in the service,
      // which cancelled it: the same answer as the gateway's own deadline.
      return {504, "server_error", e.message, "", "timeout"};
    case errc::not_found:
      return {404, "invalid_request_error", e.message, "", "not_found"};
    default:  // bad_format, io, internal
      break;
  }
  return {500, "server_error", e.message, "", "internal_error"};
}

std::string error_body(const api_error& e) {
  using json = nlohmann::json;
  json err{{"message", e.message},
           {"type", e.type},
           {"param", e.param.empty() ? json() : json(e.param)},
           {"code", e.code.empty() ? json() : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace conveyor::http
