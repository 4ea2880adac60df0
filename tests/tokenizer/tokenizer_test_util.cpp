#include "tokenizer_test_util.hpp"

#include <fstream>
#include <random>

namespace conveyor::tokenizer::testing {

std::filesystem::path make_temp_dir(const std::string& tag) {
  std::random_device rd;
  auto dir = std::filesystem::temp_directory_path() / ("conveyor-" + tag + "-" + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return dir;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string byte_char(unsigned char b) {
  const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  int cp = b;
  if (!keep) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      const bool k = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
      if (!k) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

nlohmann::json tiny_byte_level_json() {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  const std::string sp = byte_char(' ');
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab[sp + "w"] = 260;
  vocab[sp + "wo"] = 261;
  json merges = json::array({"h e", "l l", "he ll", "hell o", sp + " w", sp + "w o"});
  auto added = [](int id, const char* content, bool special) {
    return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({added(300, "<|begin_of_text|>", true), added(301, "<|end_of_text|>", true),
                                    added(302, "<|eot_id|>", true), added(303, "<|start_header_id|>", true),
                                    added(304, "<|end_header_id|>", true), added(305, "<tool>", false)})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}},
  };
}

}  // namespace conveyor::tokenizer::testing
