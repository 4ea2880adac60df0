// Builds without CUDA: the NCCL entry points exist and say why they cannot work.
#include "conveyor/transport/nccl_collective.hpp"

namespace conveyor::transport {

bool nccl_available() { return false; }

result<std::vector<std::byte>> make_nccl_unique_id() {
  return make_error(errc::unsupported, "nccl: this build has no CUDA (configure with CONVEYOR_CUDA=ON)");
}

result<std::unique_ptr<collective>> make_nccl_collective(std::span<const std::byte>, int, int, int, void*) {
  return make_error(errc::unsupported, "nccl: this build has no CUDA (configure with CONVEYOR_CUDA=ON)");
}

}  // namespace conveyor::transport
