#pragma once
// Subcommands of the one `conveyor` executable. Each returns the process exit code.
#include <string>
#include <vector>

namespace conveyor::cli {

using args = std::vector<std::string>;

int generate_main(const args& argv);
int client_main(const args& argv);
int serve_local_main(const args& argv);
int worker_main(const args& argv);
int serve_main(const args& argv);
int batch_main(const args& argv);
int plan_main(const args& argv);
int launch_main(const args& argv);

}  // namespace conveyor::cli
