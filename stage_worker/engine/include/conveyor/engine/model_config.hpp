#pragma once
// The architecture of a LLaMA-family model, read from an HF config.json. Per-architecture differences
// (biases, tied embeddings, rope scaling, sliding windows) are data here, applied by shared layer code.
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::engine {

/// Rotary embedding settings in either spelling: top-level rope_theta + rope_scaling (checkpoints in
/// the wild) or transformers-5's rope_parameters.
struct rope_config {
  std::string type = "default";  ///< default | linear | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;   ///< llama3
  double high_freq_factor = 4.0;  ///< llama3
  int original_max_position_embeddings = 0;  ///< llama3, yarn (0 = max_position_embeddings)
  double attention_factor = 0.0;  ///< yarn (0 = derived from factor)
  double beta_fast = 32.0;        ///< yarn
  double beta_slow = 1.0;         ///< yarn
  double mscale = 0.0;            ///< yarn (DeepSeek spelling)
  double mscale_all_dim = 0.0;    ///< yarn
  bool truncate = true;           ///< yarn
};

struct model_config {
  std::string model_type;  ///< llama | mistral | qwen2
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  int max_position_embeddings = 0;
  rope_config rope;
  std::vector<int> sliding_window;  ///< per layer; 0 = full attention
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
};

/// Parses config.json text; `source` names the file in error messages.
result<model_config> parse_model_config(std::string_view json_text, std::string_view source);
/// Reads DIR/config.json.
result<model_config> load_model_config(const std::string& model_dir);

/// Inverse frequencies [head_dim / 2] after scaling, and the factor cos/sin are multiplied by.
struct rope_tables {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
rope_tables compute_rope_tables(const model_config& config);

}  // namespace conveyor::engine
