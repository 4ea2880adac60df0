#pragma once
// Reading, overriding, checking and printing a deployment. Every failure is an error value whose
// message starts with where the bad value came from (file:line:column, or the flag), names the dotted
// key, and says what is allowed, e.g.
//   deploy.toml:12:10: parallel.stages = 0: must be an integer from 1 to 1024
// When several things are wrong, the message holds one such line per problem.
#include <optional>
#include <string>
#include <string_view>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"

namespace conveyor::config {

/// Reads and checks a TOML file. Relative paths in it (model.dir, cluster.token_file) are resolved
/// against the file's directory, so a config works from any working directory.
result<deployment> load_deployment(const std::string& path);

/// Parses and checks TOML text; `source_name` is the file name that messages show. Paths are kept
/// as written.
result<deployment> parse_deployment(std::string_view text, std::string_view source_name);

/// The flags of `conveyor serve` that override the most used keys. Unset = keep the config's value.
struct overrides {
  std::optional<std::string> model;   ///< --model DIR → model.dir
  std::optional<int> stages;          ///< --stages K → parallel.stages
  std::optional<int> chunks;          ///< --chunks C → parallel.chunks
  std::optional<int> tp;              ///< --tp N → parallel.tp
  std::optional<std::string> listen;  ///< --listen HOST:PORT → frontend.rpc_listen
};

/// Applies the flags with the same rules as the file, then re-checks the whole deployment (a flag
/// may contradict a key of the file; the message names both). Derived defaults of keys without an
/// origin (type, chunks, dtype) are derived again, so `--stages 4` also gives 4 chunks unless the
/// file set chunks. On error `d` is left unchanged.
status apply_overrides(deployment& d, const overrides& o);

/// The checks that relate keys to each other (both nproc_per_node and parallel_level, tp with
/// type = "pp", layers vs stages, loopback addresses with remote hosts, ...). The loader and
/// apply_overrides run it; call it on a deployment built in code.
status check_deployment(const deployment& d);

/// The checks that need the model's shape: stages <= layers, an explicit split summing to the layer
/// count, tp dividing the attention and KV heads, max_context within the model's positions
/// (`max_position_embeddings` 0 = unknown, not checked).
status validate_against_model(const deployment& d, int num_layers, int num_heads, int num_kv_heads,
                              int max_position_embeddings = 0);

/// One line per key, "key = value  (where it came from)", for start-up logs. Secrets are masked.
std::string describe(const deployment& d);

}  // namespace conveyor::config
