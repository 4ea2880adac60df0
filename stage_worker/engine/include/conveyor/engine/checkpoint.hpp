#pragma once
// The weights of an HF model directory: model.safetensors, or shards listed by
// model.safetensors.index.json. Shards are opened lazily, so a stage maps only the files it needs.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/safetensors.hpp"

namespace conveyor::engine {

/// One tensor found in a checkpoint: where it lives and its header entry.
struct tensor_ref {
  const safetensors_file* file = nullptr;
  const tensor_info* info = nullptr;
};

class checkpoint {
 public:
  static result<checkpoint> open(const std::string& model_dir);

  /// Finds a tensor, opening its shard on first use; not_found names the tensor and directory.
  result<tensor_ref> find(const std::string& name);
  bool contains(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  /// Shards opened so far (a stage should open only those holding its layers).
  std::vector<std::string> opened_files() const;

 private:
  std::string dir_;
  std::map<std::string, std::string> weight_map_;  ///< tensor name -> shard file name
  std::map<std::string, std::unique_ptr<safetensors_file>> files_;
};

}  // namespace conveyor::engine
