#pragma once
// A gateway over the in-process engine on the tiny-llama fixture, with a small byte-level tokenizer
// (tests/tokenizer's) added in a temporary model directory, and helpers to talk to it with
// cpp-httplib's client over loopback.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "conveyor/http/http_server.hpp"
#include "conveyor/service/local_inference_service.hpp"

namespace conveyor::http::testing {

/// tiny-llama's config and weights plus tokenizer.json / tokenizer_config.json (Llama 3 chat format).
std::filesystem::path make_model_dir_with_tokenizer();

struct gateway_fixture {
  std::filesystem::path dir;
  std::unique_ptr<service::inference_service> service;
  http_gateway gateway;
  ~gateway_fixture();
};
std::unique_ptr<gateway_fixture> start_gateway(bool with_tokenizer, http_server_options options = {});
/// The same over a service with these options (serving policy, batch size); threads is forced to 1.
std::unique_ptr<gateway_fixture> start_gateway(bool with_tokenizer, http_server_options options,
                                               service::local_service_options service_options);

/// One SSE stream read to its end: the data of each event, in order ("[DONE]" included).
std::vector<std::string> sse_events(const std::string& body);

/// Checks a page against the Prometheus text format (0.0.4); returns "" or the first problem.
/// Also fills `values` with every sample (name{labels} -> value).
std::string check_prometheus(const std::string& page, std::map<std::string, double>& values);

struct golden_case {
  std::vector<std::int32_t> prompt, greedy;
};
std::vector<golden_case> tiny_llama_goldens();

}  // namespace conveyor::http::testing
