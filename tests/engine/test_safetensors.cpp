// Bad checkpoints are errors that name what is wrong, never crashes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/safetensors.hpp"
#include "conveyor/engine/stage_weights.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

using engine::safetensors_file;

std::vector<std::uint8_t> make_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::uint8_t> out(8 + header.size() + data_bytes, 0x5a);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string open_error(std::vector<std::uint8_t> bytes) {
  auto f = safetensors_file::from_bytes(std::move(bytes), "bad.safetensors");
  return f.ok() ? std::string() : f.err().message;
}

TEST(safetensors, valid_file_parses_with_offsets_and_types) {
  auto f = safetensors_file::from_bytes(
      make_file(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})",
                32),
      "ok.safetensors");
  ASSERT_TRUE(f.ok()) << f.err().message;
  ASSERT_EQ(f->tensors().size(), 2u);
  const auto* b = f->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, kernels::dtype::bf16);
  EXPECT_EQ(b->begin, 24u);
  EXPECT_EQ(f->find("c"), nullptr);
}

TEST(safetensors, truncated_file) {
  EXPECT_NE(open_error({1, 2, 3}).find("truncated"), std::string::npos);
  auto bytes = make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  bytes.resize(20);  // cut inside the header
  EXPECT_NE(open_error(bytes).find("truncated"), std::string::npos);
}

TEST(safetensors, offsets_past_the_end) {
  const auto msg = open_error(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
}

TEST(safetensors, overlapping_tensors) {
  const auto msg = open_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                        12));
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

TEST(safetensors, shape_and_dtype_must_match_byte_length) {
  const auto msg = open_error(make_file(R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
}

TEST(safetensors, huge_shape_does_not_overflow) {
  const auto msg = open_error(make_file(
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0));
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
}

// A zero dimension gives zero bytes whatever the others are; before this check [2^62, 2^62, 0] was
// accepted and numel() overflowed int64 on it (fuzz/safetensors_header; fuzz/regressions/ keeps it).
TEST(safetensors, zero_sized_shape_cannot_overflow_the_element_count) {
  for (const char* shape : {"[4611686018427387904,4611686018427387904,0]", "[18446744073709551615,0]"}) {
    const auto msg = open_error(make_file(
        std::string(R"({"a":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,0]}})", 0));
    EXPECT_NE(msg.find("more than 2^63 - 1 elements"), std::string::npos) << shape << ": " << msg;
  }
  auto empty = safetensors_file::from_bytes(
      make_file(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0), "ok");
  ASSERT_TRUE(empty.ok()) << empty.err().message;
  EXPECT_EQ(empty->tensors()[0].numel(), 0);
}

TEST(safetensors, unknown_dtype) {
  const auto msg = open_error(make_file(R"({"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(msg.find("unknown dtype"), std::string::npos) << msg;
}

TEST(safetensors, malformed_json_and_shapes) {
  EXPECT_NE(open_error(make_file(R"({"a":{"dtype":"F32",)", 0)).find("JSON"), std::string::npos);
  EXPECT_NE(open_error(make_file(R"([1,2])", 0)).find("object"), std::string::npos);
  EXPECT_NE(open_error(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("shape"),
            std::string::npos);
  EXPECT_NE(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)).find("begin"),
            std::string::npos);
  EXPECT_NE(open_error(make_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4)).find("data_offsets"), std::string::npos);
}

TEST(safetensors, header_length_beyond_limit) {
  std::vector<std::uint8_t> bytes(16, 0xff);
  EXPECT_NE(open_error(bytes).find("exceeds"), std::string::npos);
}

TEST(safetensors, missing_file) {
  auto f = safetensors_file::open("/nonexistent/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.err().message.find("/nonexistent/model.safetensors"), std::string::npos);
}

// A model directory whose config.json and weights disagree.
class broken_model_dir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("conveyor_broken_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::filesystem::copy_file(testing::fixture_dir("tiny-llama") + "/config.json", dir_ / "config.json");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write_weights(const std::string& header, std::size_t data_bytes) {
    auto bytes = make_file(header, data_bytes);
    std::ofstream(dir_ / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  std::string load_error() {
    auto cfg = engine::load_model_config(dir_.string());
    if (!cfg) return cfg.err().message;
    auto ckpt = engine::checkpoint::open(dir_.string());
    if (!ckpt) return ckpt.err().message;
    auto backend = kernels::make_cpu_backend({});
    auto w = engine::stage_weights::load(*backend, *ckpt, *cfg, engine::whole_model(*cfg),
                                         engine::make_tp_layout(*cfg, 0, 1).value());
    return w.ok() ? std::string() : w.err().message;
  }

  std::filesystem::path dir_;
};

TEST_F(broken_model_dir, missing_tensor_is_named) {
  write_weights(R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[1024,128],"data_offsets":[0,524288]}})",
                524288);
  const auto msg = load_error();
  EXPECT_NE(msg.find("model.layers.0.input_layernorm.weight"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, shape_mismatch_with_config_is_named) {
  write_weights(R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[1000,128],"data_offsets":[0,512000]}})",
                512000);
  const auto msg = load_error();
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1024, 128]"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, non_float_weights_are_rejected) {
  write_weights(R"({"model.embed_tokens.weight":{"dtype":"I64","shape":[1024,128],"data_offsets":[0,1048576]}})",
                1048576);
  const auto msg = load_error();
  EXPECT_NE(msg.find("I64"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, truncated_checkpoint) {
  std::filesystem::copy_file(testing::fixture_dir("tiny-llama") + "/model.safetensors", dir_ / "model.safetensors");
  std::filesystem::resize_file(dir_ / "model.safetensors", 100000);
  const auto msg = load_error();
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, no_weights_at_all) {
  const auto msg = load_error();
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, sharded_index_naming_a_missing_shard) {
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors"}})";
  const auto msg = load_error();
  EXPECT_NE(msg.find("model-00001-of-00002.safetensors"), std::string::npos) << msg;
}

TEST_F(broken_model_dir, sharded_index_with_path_escape) {
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map":{"a":"../../etc/passwd"}})";
  const auto msg = load_error();
  EXPECT_NE(msg.find("plain file name"), std::string::npos) << msg;
}

}  // namespace
}  // namespace conveyor
