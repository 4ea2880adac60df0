#include "conveyor/engine/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace conveyor::engine {

namespace {

struct dtype_entry {
  const char* name;
  std::size_t size;
  std::optional<kernels::dtype> type;
};

// Every dtype of the safetensors format, so a well-formed file always parses; only some are computable.
constexpr dtype_entry dtype_table[] = {
    {"F64", 8, std::nullopt},          {"F32", 4, kernels::dtype::f32},
    {"F16", 2, kernels::dtype::f16},   {"BF16", 2, kernels::dtype::bf16},
    {"I64", 8, std::nullopt},          {"I32", 4, kernels::dtype::i32},
    {"I16", 2, std::nullopt},          {"I8", 1, std::nullopt},
    {"U64", 8, std::nullopt},          {"U32", 4, std::nullopt},
    {"U16", 2, std::nullopt},          {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},         {"F8_E4M3", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt},
};

const dtype_entry* find_dtype(const std::string& name) {
  for (const auto& e : dtype_table) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

}  // namespace

std::int64_t tensor_info::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

result<safetensors_file> safetensors_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(errc::not_found, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(errc::io, path + ": not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return make_error(errc::bad_format, path + ": truncated safetensors file (" + std::to_string(size) +
                                            " bytes, a header needs at least 8)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return make_error(errc::io, path + ": mmap failed: " + std::strerror(errno));
  safetensors_file f;
  f.path_ = path;
  f.map_ = map;
  f.map_size_ = size;
  f.base_ = static_cast<const std::uint8_t*>(map);
  CONVEYOR_TRY(f.parse(size));
  return f;
}

result<safetensors_file> safetensors_file::from_bytes(std::vector<std::uint8_t> bytes, std::string name) {
  safetensors_file f;
  f.path_ = std::move(name);
  f.owned_ = std::move(bytes);
  f.base_ = f.owned_.data();
  if (f.owned_.size() < 8) {
    return make_error(errc::bad_format, f.path_ + ": truncated safetensors file (" +
                                            std::to_string(f.owned_.size()) + " bytes, a header needs at least 8)");
  }
  CONVEYOR_TRY(f.parse(f.owned_.size()));
  return f;
}

status safetensors_file::parse(std::size_t file_size) {
  auto bad = [&](const std::string& what) { return make_error(errc::bad_format, path_ + ": " + what); };
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // little-endian
  if (header_len > max_header_bytes) return bad("header length " + std::to_string(header_len) + " exceeds 100 MB");
  if (header_len > file_size - 8) {
    return bad("truncated: header claims " + std::to_string(header_len) + " bytes but the file has " +
               std::to_string(file_size - 8) + " after the length prefix");
  }
  const auto* hdr = reinterpret_cast<const char*>(base_ + 8);
  data_ = base_ + 8 + header_len;
  const std::size_t data_size = file_size - 8 - header_len;
  auto j = nlohmann::json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not well-formed JSON");
  if (!j.is_object()) return bad("header must be a JSON object");
  tensors_.clear();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    const std::string where = "tensor \"" + it.key() + "\": ";
    if (!v.is_object()) return bad(where + "entry must be an object");
    auto dt = v.find("dtype");
    auto shape = v.find("shape");
    auto offs = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad(where + "missing \"dtype\"");
    if (shape == v.end() || !shape->is_array()) return bad(where + "missing \"shape\"");
    if (offs == v.end() || !offs->is_array() || offs->size() != 2) return bad(where + "\"data_offsets\" must be [begin, end]");
    tensor_info t;
    t.name = it.key();
    t.dtype_name = dt->get<std::string>();
    const dtype_entry* entry = find_dtype(t.dtype_name);
    if (entry == nullptr) return bad(where + "unknown dtype \"" + t.dtype_name + "\"");
    t.type = entry->type;
    // Element count with overflow checks: a hostile shape must not wrap around to a small size.
    unsigned __int128 bytes = entry->size;
    // numel()'s running product, left to right: a zero dimension makes the byte length match, but the
    // dimensions before it must not overflow int64 there (found by fuzz/safetensors_header).
    unsigned __int128 elements = 1;
    bool too_many = false;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) return bad(where + "shape entries must be non-negative integers");
      const auto dim = d.get<std::uint64_t>();
      bytes *= dim;
      if (bytes > static_cast<unsigned __int128>(file_size)) {
        bytes = static_cast<unsigned __int128>(file_size) + 1;  // saturate; reported below
      }
      elements *= dim;
      if (dim > INT64_MAX || elements > INT64_MAX) {
        too_many = true;
        elements = static_cast<unsigned __int128>(INT64_MAX) + 1;  // saturate; reported below
      }
      t.shape.push_back(static_cast<std::int64_t>(std::min<std::uint64_t>(dim, INT64_MAX)));
    }
    if (!(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned()) {
      return bad(where + "data_offsets must be non-negative integers");
    }
    const auto begin = (*offs)[0].get<std::uint64_t>();
    const auto end = (*offs)[1].get<std::uint64_t>();
    if (begin > end) return bad(where + "data_offsets begin > end");
    if (end > data_size) {
      return bad(where + "data_offsets end " + std::to_string(end) + " is past the end of the data (" +
                 std::to_string(data_size) + " bytes): truncated file?");
    }
    if (bytes != static_cast<unsigned __int128>(end - begin)) {
      return bad(where + "shape × dtype size does not match its " + std::to_string(end - begin) + " bytes");
    }
    if (too_many) return bad(where + "shape has more than 2^63 - 1 elements");
    t.begin = begin;
    t.end = end;
    tensors_.push_back(std::move(t));
  }
  std::vector<const tensor_info*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return bad("tensors \"" + by_offset[i - 1]->name + "\" and \"" + by_offset[i]->name + "\" overlap");
    }
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return ok_status();
}

const tensor_info* safetensors_file::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const tensor_info& t, std::string_view n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

safetensors_file::safetensors_file(safetensors_file&& o) noexcept { *this = std::move(o); }

safetensors_file& safetensors_file::operator=(safetensors_file&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    const bool owned = !o.owned_.empty() && o.base_ == o.owned_.data();
    const std::ptrdiff_t data_off = o.data_ - o.base_;
    owned_ = std::move(o.owned_);
    base_ = owned ? owned_.data() : o.base_;
    data_ = base_ + data_off;
    tensors_ = std::move(o.tensors_);
    o.base_ = o.data_ = nullptr;
  }
  return *this;
}

safetensors_file::~safetensors_file() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

}  // namespace conveyor::engine
