#include "conveyor/engine/checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace conveyor::engine {

namespace fs = std::filesystem;

result<checkpoint> checkpoint::open(const std::string& model_dir) {
  checkpoint c;
  c.dir_ = model_dir;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return make_error(errc::not_found, model_dir + ": not a directory");
  }
  const fs::path index = fs::path(model_dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(model_dir) / "model.safetensors";
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return make_error(errc::bad_format, index.string() + ": malformed JSON");
    }
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object()) {
      return make_error(errc::bad_format, index.string() + ": missing \"weight_map\" object");
    }
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string()) return make_error(errc::bad_format, index.string() + ": weight_map[\"" + it.key() + "\"] must be a file name");
      const std::string file = it->get<std::string>();
      if (file.find('/') != std::string::npos || file == ".." || file.empty()) {
        return make_error(errc::bad_format, index.string() + ": shard name \"" + file + "\" must be a plain file name");
      }
      if (!fs::exists(fs::path(model_dir) / file, ec)) {
        return make_error(errc::not_found, index.string() + ": shard \"" + file + "\" (for " + it.key() + ") is missing");
      }
      c.weight_map_[it.key()] = file;
    }
    return c;
  }
  if (!fs::exists(single, ec)) {
    return make_error(errc::not_found, model_dir + ": neither model.safetensors nor model.safetensors.index.json found");
  }
  auto file = safetensors_file::open(single.string());
  if (!file) return file.err();
  for (const auto& t : file->tensors()) c.weight_map_[t.name] = "model.safetensors";
  c.files_["model.safetensors"] = std::make_unique<safetensors_file>(std::move(file).value());
  return c;
}

bool checkpoint::contains(const std::string& name) const { return weight_map_.count(name) != 0; }

result<tensor_ref> checkpoint::find(const std::string& name) {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) {
    return make_error(errc::not_found, dir_ + ": checkpoint has no tensor \"" + name + "\"");
  }
  auto& slot = files_[it->second];
  if (!slot) {
    auto file = safetensors_file::open((fs::path(dir_) / it->second).string());
    if (!file) {
      files_.erase(it->second);
      return file.err();
    }
    slot = std::make_unique<safetensors_file>(std::move(file).value());
  }
  const tensor_info* info = slot->find(name);
  if (info == nullptr) {
    return make_error(errc::bad_format, slot->path() + ": the index lists \"" + name + "\" here but the file does not hold it");
  }
  return tensor_ref{slot.get(), info};
}

std::vector<std::string> checkpoint::opened_files() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : files_) {
    if (f) out.push_back(name);
  }
  return out;
}

}  // namespace conveyor::engine
