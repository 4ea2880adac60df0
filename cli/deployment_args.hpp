#pragma once
// What `conveyor plan` and `conveyor launch` share: FILE.toml as the first argument, the override
// flags of `serve`, and the model's config.json checked against the deployment.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"
#include "conveyor/engine/model_config.hpp"
#include "flags.hpp"

namespace conveyor::cli {

/// The override flags every deployment command accepts (see config::overrides).
inline constexpr const char* deployment_flags[] = {"config", "model", "stages", "chunks", "tp", "listen"};

struct loaded_deployment {
  std::string file;
  config::deployment deployment;
  engine::model_config model;
};

/// Splits `FILE.toml --flag value ...` into the file and the flags (`--config FILE` also works).
/// `extra` names further flags the command accepts, `switches` those that take no value.
result<std::pair<std::string, flags>> parse_file_and_flags(const std::vector<std::string>& argv,
                                                           std::set<std::string> extra = {},
                                                           const std::set<std::string>& switches = {});

/// Loads the file, applies the override flags, reads the model's config.json and checks the
/// deployment against it.
result<loaded_deployment> load_deployment_and_model(const std::string& file, const flags& f);

}  // namespace conveyor::cli
