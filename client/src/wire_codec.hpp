#pragma once
// Converts between schemas/inference.capnp and the client's plain structs: the one place in the
// client where Cap'n Proto's camelCase names meet ours.
#include "conveyor/client/client.hpp"
#include "conveyor/schemas/inference.capnp.h"

namespace conveyor::client::wire_codec {

namespace wire = conveyor::schema::rpc;

void encode_request(const generate_request& in, wire::GenerateRequest::Builder out);
/// The summary, or the request's error (finishReason = error) as an error value.
result<generate_summary> decode_summary(wire::GenerateSummary::Reader in);
health_report decode_health(wire::Health::Reader in);
stats_report decode_stats(wire::Stats::Reader in);
model_info decode_info(wire::ModelInfo::Reader in);
server_version decode_version(wire::ServerVersion::Reader in);

}  // namespace conveyor::client::wire_codec
