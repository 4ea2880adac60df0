// Fuzz target: a deployment TOML file as `conveyor serve --config` reads it (toml++ parse, every key
// read with its rule, the cross-key checks), then the uses of an accepted deployment: flags applied on
// top, the model checks, the start-up description.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/config/endpoint.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace conveyor::config;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = parse_deployment(text, "fuzz.toml");
  if (!d) {
    CONVEYOR_FUZZ_CHECK(!d.err().message.empty());
    return 0;
  }
  // The loader promises a checked deployment, and addresses that print back to what parses.
  CONVEYOR_FUZZ_CHECK(check_deployment(*d).ok());
  for (const endpoint* e : {&d->cluster.listen, &d->frontend.rpc_listen}) {
    auto back = parse_endpoint(to_string(*e));
    CONVEYOR_FUZZ_CHECK(back.ok() && *back == *e);
  }
  (void)describe(*d);
  (void)gpus_per_worker(*d);
  (void)ucx_tls_env(d->transport);
  (void)validate_against_model(*d, 22, 32, 4, 2048);
  deployment flagged = *d;
  overrides o;
  o.stages = 2;
  o.listen = "127.0.0.1:0";
  (void)apply_overrides(flagged, o);
  return 0;
}
