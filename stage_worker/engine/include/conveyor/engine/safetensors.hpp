#pragma once
// A memory-mapped safetensors file with a validated header. Only the pages of tensors that are read
// are ever touched, so a stage loading its own layers never reads the rest of the checkpoint.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/dtype.hpp"

namespace conveyor::engine {

struct tensor_info {
  std::string name;
  std::string dtype_name;                  ///< as written in the header, e.g. "BF16"
  std::optional<kernels::dtype> type;      ///< set when the engine can compute with it
  std::vector<std::int64_t> shape;
  std::size_t begin = 0;                   ///< byte offsets into the data section
  std::size_t end = 0;
  std::int64_t numel() const;
};

class safetensors_file {
 public:
  /// Upper bound of the JSON header; the format itself caps it at 100 MB.
  static constexpr std::uint64_t max_header_bytes = 100ull << 20;

  /// Maps the file and validates the header: JSON well-formed, dtype known, shape × dtype size equal
  /// to the byte length, offsets inside the file and not overlapping.
  static result<safetensors_file> open(const std::string& path);
  /// Validates a buffer already in memory (used by the fuzz and unit tests).
  static result<safetensors_file> from_bytes(std::vector<std::uint8_t> bytes, std::string name);

  safetensors_file(safetensors_file&& other) noexcept;
  safetensors_file& operator=(safetensors_file&& other) noexcept;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file();

  const std::string& path() const { return path_; }
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find(std::string_view name) const;
  /// Start of a tensor's bytes (inside the mapping).
  const std::uint8_t* data(const tensor_info& t) const { return data_ + t.begin; }

 private:
  safetensors_file() = default;
  status parse(std::size_t file_size);

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<std::uint8_t> owned_;  ///< for from_bytes
  const std::uint8_t* base_ = nullptr;
  const std::uint8_t* data_ = nullptr;
  std::vector<tensor_info> tensors_;
};

}  // namespace conveyor::engine
