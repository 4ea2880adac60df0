#pragma once
// The collective interface is declared with the kernels (conveyor/kernels/collective.hpp) so the
// engine can use it without depending on transport; transport provides the implementations.
#include "conveyor/kernels/collective.hpp"

namespace conveyor::transport {

using collective = kernels::collective;

}  // namespace conveyor::transport
