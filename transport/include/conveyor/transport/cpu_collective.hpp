#pragma once
// A CPU collective for ranks that are threads of one process sharing memory: what
// `conveyor generate --tp N` and CI use. Each op costs three barriers and a memory pass.
#include <chrono>
#include <memory>
#include <vector>

#include "conveyor/transport/collective.hpp"

namespace conveyor::transport {

class cpu_group_state;  // private: src/cpu_group_state.hpp

/// The shared part of a CPU group; create it once, then one collective per rank (thread).
class cpu_group {
 public:
  /// `size` ranks; a rank that waits longer than `timeout` for the others fails the whole group.
  explicit cpu_group(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~cpu_group();
  int size() const;
  /// The collective for `rank` (0 <= rank < size); use it from one thread only.
  std::unique_ptr<collective> rank(int rank);
  /// The collectives of every rank, in rank order (for a group whose ranks are threads here).
  std::vector<std::unique_ptr<collective>> all_ranks();

 private:
  std::shared_ptr<cpu_group_state> state_;
};

}  // namespace conveyor::transport
