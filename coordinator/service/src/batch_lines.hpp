#pragma once
// One line of a batch file in and out: a JSON request parsed into a generate_request, and a result
// or an error formatted as a JSON line (batch_runner.hpp describes both).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "conveyor/service/inference_service.hpp"

namespace conveyor::tokenizer {
class tokenizer;
}

namespace conveyor::service::batch_detail {

struct parsed_line {
  nlohmann::json id;  ///< as given, or the line number
  result<generate_request> request = make_error(errc::internal, "not parsed");
};

/// `tok` (may be null) turns "prompt" text into ids.
parsed_line parse_line(std::string_view text, std::int64_t line_no, const tokenizer::tokenizer* tok);

std::string result_line(const nlohmann::json& id, const std::vector<std::int32_t>& tokens, const generate_summary& s,
                        const tokenizer::tokenizer* tok);
std::string error_line(const nlohmann::json& id, const error& e);

/// The id of a result line already in the output; nullopt when the line is not a JSON object with one.
std::optional<nlohmann::json> id_of_result(std::string_view line);

}  // namespace conveyor::service::batch_detail
