#pragma once
#include <memory>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::kernels {

struct cpu_backend_options {
  int threads = 0;  ///< 0 = all cores
};

/// The reference backend: float32 everywhere, OpenBLAS for the matrix products.
std::unique_ptr<backend> make_cpu_backend(const cpu_backend_options& options = {});

}  // namespace conveyor::kernels
