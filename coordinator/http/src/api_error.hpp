#pragma once
// An error answered to an HTTP client, in OpenAI's shape:
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}} with a fitting status code.
#include <string>

#include "conveyor/base/result.hpp"

namespace conveyor::http {

struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  ///< the request field at fault, "" = null
  std::string code;   ///< machine-readable kind, "" = null
};

inline api_error bad_request(std::string param, std::string message, std::string code = "invalid_value") {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}

/// How a service error reaches the client: bad input 400, unknown things 404, overload (server-wide
/// caps) 503, a passed deadline 504, the rest 500.
api_error from_service_error(const error& e);

/// The JSON body of an error response.
std::string error_body(const api_error& e);

}  // namespace conveyor::http
