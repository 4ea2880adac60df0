#include "api_error.hpp"

#include <nlohmann/json.hpp>

namespace conveyor::http {

api_error from_service_error(const error& e) {
  switch (e.code) {
    case errc::invalid_argument:
    case errc::unsupported:
      return {400, "invalid_request_error", e.message, "", "invalid_value"};
    case errc::out_of_memory:
      // The service had no room (KV blocks, queue or request caps): the client may retry later.
      return {503, "server_error", e.message, "", "overloaded"};
    case errc::not_found:
      return {404, "invalid_request_error", e.message, "", "not_found"};
    default:  // bad_format, io, internal, and kinds added after this was written
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
