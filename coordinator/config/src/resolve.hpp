#pragma once
// Defaults that depend on other keys (dtype on device, type on stages and tp, chunks on stages, the
// single localhost). They are filled in only for keys no file or flag set, so running this again
// after an override recomputes them.
#include "conveyor/config/deployment.hpp"

namespace conveyor::config::detail {

void resolve_defaults(deployment& d);

}  // namespace conveyor::config::detail
