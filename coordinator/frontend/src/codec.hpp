#pragma once
// Converts between schemas/inference.capnp and the plain service structs: the one place on the server
// side where Cap'n Proto's camelCase names meet ours.
#include "conveyor/schemas/inference.capnp.h"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::frontend::codec {

namespace wire = conveyor::schema::rpc;

/// Copies a request off the wire. Structure only: validate_request checks the values.
service::generate_request decode_request(wire::GenerateRequest::Reader in);

void encode_summary(const service::generate_summary& in, wire::GenerateSummary::Builder out);
/// A failed request: finishReason = error, with the error's code and message.
void encode_error(const error& in, int prompt_tokens, int completion_tokens, wire::GenerateSummary::Builder out);
void encode_health(const service::health_report& in, wire::Health::Builder out);
void encode_stats(const service::stats_report& in, wire::Stats::Builder out);
void encode_info(const service::model_info& in, wire::ModelInfo::Builder out);

}  // namespace conveyor::frontend::codec
