#pragma once
// Small tokenizers the tests build themselves, in the files a model directory holds.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace conveyor::tokenizer::testing {

/// A fresh empty directory under the system temp dir (removed by the caller or left for inspection).
std::filesystem::path make_temp_dir(const std::string& tag);
void write_file(const std::filesystem::path& path, const std::string& text);

/// GPT-2's byte -> code point spelling of one byte, as UTF-8 (the test's own copy of the definition).
std::string byte_char(unsigned char b);

/// A byte-level BPE tokenizer.json: ids 0..255 are the bytes, then merges
/// h+e=256 "he", l+l=257 "ll", he+ll=258 "hell", hell+o=259 "hello", Ġ+w=260 "Ġw", Ġw+o=261 "Ġwo",
/// and added tokens <|begin_of_text|>=300, <|end_of_text|>=301, <|eot_id|>=302,
/// <|start_header_id|>=303, <|end_header_id|>=304 (special), <tool>=305 (not special).
/// GPT-2 pre-tokenization (ByteLevel use_regex), BOS by TemplateProcessing.
nlohmann::json tiny_byte_level_json();

}  // namespace conveyor::tokenizer::testing
