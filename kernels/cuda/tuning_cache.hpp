#pragma once
// The GEMM choices that lt_gemm times at the first call of a shape, kept in a file between
// processes (as TensorRT keeps its timing cache). Timing picks among algorithms whose rounding
// differs, and two processes can time two of them within noise of each other: session 30 saw a
// served greedy sequence of one request differ from token 31 on between restarts (the 128-token
// prefill's o_proj/down split choice). With the file, every process after the first on a host runs
// the first one's choices, so a request gives the same tokens after a restart.
// Plain C++ (no CUDA): the file's format, its reading and its merge are tested on any machine.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::kernels::cuda {

/// One timed choice. kind plain: (rows, cols, bucket) -> use_lt + algo (ms, ms_default: the times
/// the tuning measured); kind split: (rows, cols, bucket, margin key) -> splits (0: none) + algo.
struct tuned_gemm {
  enum class kind_t { plain, split } kind = kind_t::plain;
  std::array<int, 4> shape{};  ///< rows, cols, bucket, and for a split the margin key (else 0)
  bool use_lt = false;
  int splits = 0;
  float ms = 0.0f, ms_default = 0.0f;
  std::array<std::uint64_t, 8> algo{};  ///< cublasLtMatmulAlgo_t's words, as cuBLASLt filled them
};

/// The entries of `text` made on the device `device_key` (the GPU's name and compute capability
/// and cuBLASLt's version, no spaces); entries of other devices are skipped. A line that does not
/// parse is skipped too and named in `warnings` (with `source` and its line number): a damaged
/// cache costs a tuning, never a start.
struct tuning_cache_contents {
  std::vector<tuned_gemm> entries;
  std::vector<std::string> warnings;
};
tuning_cache_contents parse_tuning_cache(const std::string& text, const std::string& device_key,
                                         const std::string& source);

/// One line an entry (the format parse_tuning_cache reads), with the device key in front.
std::string format_tuned_gemm(const tuned_gemm& e, const std::string& device_key);

/// Reads `path` (a missing file is empty, not an error).
result<tuning_cache_contents> read_tuning_cache(const std::string& path, const std::string& device_key);

/// Adds `entries` to the file under an exclusive lock (path + ".lock"), keeping what other
/// processes wrote there meanwhile (theirs win for a shape both have: it was there first) and
/// lines of other devices; written to a temporary file and renamed, so a reader never sees half a
/// file. Creates the directory.
status merge_tuning_cache(const std::string& path, const std::string& device_key, const std::vector<tuned_gemm>& entries);

}  // namespace conveyor::kernels::cuda
