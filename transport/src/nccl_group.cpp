// An in-process NCCL group, built from the two entry points (so it needs no CUDA header and works,
// as an error, in builds without CUDA too).
#include <optional>
#include <thread>

#include "conveyor/transport/nccl_collective.hpp"

namespace conveyor::transport {

result<std::vector<std::unique_ptr<collective>>> make_nccl_group(const std::vector<int>& devices,
                                                                 const std::vector<void*>& streams) {
  const int size = static_cast<int>(devices.size());
  if (size < 1 || streams.size() != devices.size()) {
    return make_error(errc::invalid_argument, "nccl group: one device and one stream per rank");
  }
  CONVEYOR_TRY_ASSIGN(id, make_nccl_unique_id());
  std::vector<std::unique_ptr<collective>> ranks(size);
  std::vector<std::optional<error>> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto c = make_nccl_collective(id, size, r, devices[r], streams[r]);
      if (c) {
        ranks[r] = std::move(c).value();
      } else {
        errors[r] = c.err();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) return *e;
  }
  return ranks;
}

}  // namespace conveyor::transport
