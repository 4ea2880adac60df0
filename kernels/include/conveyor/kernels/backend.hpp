#pragma once
// The backend interface: a small table of operations with declared capabilities (after ggml's backend).
// The engine plans a step on the host, then calls these ops with pointers into backend memory; the ops
// never allocate, so a decode step can later be captured in a CUDA graph. Host-only header: the engine
// compiles without nvcc.
//
// Shapes and layouts shared by every backend (the contract a CUDA twin must meet):
// - Activations are row-major [rows, width] in caps().act_dtype.
// - A weight matrix is [rows = out_features, cols = in_features] (HF's nn.Linear layout), stored in
//   caps().weight_dtype; `linear` computes out = x · Wᵀ (+ bias).
// - The packed qkv row of one token is [q heads | k heads | v heads], each head `head_dim` wide.
// - The gate_up row of one token is [gate (ffn) | up (ffn)].
// - The paged KV cache of one layer is [num_blocks, block_size, num_kv_heads, head_dim] for K and
//   the same for V; a token's slot is block * block_size + offset.
// - Query row i of sequence s (rows q_start[s] .. q_start[s+1]) sits at position
//   ctx_len[s] - (q_start[s+1] - q_start[s]) + (i - q_start[s]) and attends causally to keys
//   max(0, pos - window + 1) .. pos (window 0 = unlimited).
#include <cstddef>
#include <cstdint>
#include <string>

#include "conveyor/kernels/dtype.hpp"

namespace conveyor::kernels {

/// A matrix or vector in a backend's memory. Vectors have rows == 1.
struct weight {
  const void* data = nullptr;
  dtype type = dtype::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  /// i8 / f8e4m3 matrices: rows float32 scales in backend memory; element (r, c) is
  /// q[r, c] * scales[r] (per output channel). nullptr for every other type.
  const float* scales = nullptr;
  bool empty() const { return data == nullptr; }
};

struct backend_caps {
  std::string name;             ///< "cpu", "cuda"
  bool host_memory = true;      ///< backend pointers can be read by the host directly
  dtype act_dtype = dtype::f32;     ///< activations, residual stream and logits
  dtype weight_dtype = dtype::f32;  ///< what upload_weight converts to
  dtype kv_dtype = dtype::f32;      ///< K/V cache elements
  bool int8_weights = false;  ///< `linear` takes i8 matrices with per-row scales
  bool fp8_weights = false;   ///< `linear` takes f8e4m3 matrices with per-row scales
  /// > 0: steps of up to this many tokens are row-invariant (every row bit-identical to a step of
  /// that token alone) when their attention is issued one query row per sequence; the executor then
  /// does that. 0: no such promise (rows of a bigger call may round differently).
  int row_invariant_rows = 0;
};

/// Head geometry of one attention layer.
struct attn_shape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;      ///< softmax scale, normally 1/sqrt(head_dim)
  int sliding_window = 0;  ///< 0 = attend to the whole context
};

struct kv_layout {
  int num_blocks = 0;
  int block_size = 0;
};

/// Per-sequence description of a batched attention call; all pointers are in backend memory.
struct attention_batch {
  int num_seqs = 0;
  const std::int32_t* q_start = nullptr;      ///< [num_seqs + 1]
  const std::int32_t* ctx_len = nullptr;      ///< [num_seqs] keys cached after this step's write
  const std::int32_t* block_table = nullptr;  ///< [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int max_ctx_len = 0;  ///< host-known maxima, for launch planning
  int max_q_len = 0;
};

/// Sampling of one row of logits. temperature <= 0 or top_k == 1 means greedy.
struct sample_params {
  float temperature = 0.0f;
  int top_k = 0;        ///< 0 = no limit
  float top_p = 1.0f;   ///< 1 = no limit
  std::uint64_t seed = 0;
  std::uint64_t step = 0;  ///< position of the token drawn; with seed it fixes the random number
};

/// One decoder layer's weights and KV cache, for decode_layers.
struct layer_ref {
  weight input_norm, qkv, qkv_bias, o, o_bias, post_norm, gate_up, gate_up_bias, down, down_bias;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int sliding_window = 0;  ///< 0: the whole context
};

/// A decode step of one token through `num_layers` decoder layers, the ops the engine would otherwise
/// issue per layer: [residual += delta;] normed = rmsnorm(residual); qkv; rope; kv_write; attention;
/// delta = o(attn); residual += delta; normed = rmsnorm(residual); gate_up; silu_mul; delta = down(act).
struct decode_layers_call {
  const layer_ref* layers = nullptr;
  int num_layers = 0;
  bool first_adds_delta = false;  ///< the first layer starts with residual += delta
  int hidden = 0;
  int ffn = 0;
  attn_shape shape;  ///< sliding_window is per layer (layer_ref)
  kv_layout layout;
  float eps = 0.0f;
  const std::int32_t* positions = nullptr;  ///< [1]
  const std::int32_t* slots = nullptr;      ///< [1]
  const float* inv_freq = nullptr;
  float attention_scaling = 1.0f;
  attention_batch batch;  ///< one sequence of one query row
  void* residual = nullptr;  ///< [hidden]: in and out
  void* delta = nullptr;     ///< [hidden]: in (first_adds_delta) and out (the last down output)
  /// Scratch the op-by-op path would use (qkv [qkv width], attn [heads head_dim], o [hidden],
  /// act [ffn]); their contents after the call are unspecified.
  void* qkv = nullptr;
  void* attn = nullptr;
  void* o = nullptr;
  void* act = nullptr;
};

/// Handle of a recorded op sequence (a CUDA graph); 0 is no recording.
using capture_id = std::uint64_t;

/// Interface of a compute backend. One instance owns one device stream; calls are ordered.
class backend {
 public:
  virtual ~backend() = default;
  virtual const backend_caps& caps() const = 0;

  // --- memory ---
  /// Returns nullptr when the memory is not available (the engine turns that into an error value).
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) = 0;
  /// Waits for every op issued so far.
  virtual void synchronize() = 0;
  /// Free and total bytes of the memory this backend allocates from.
  virtual void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  /// Copies a host tensor of `src_type` into backend memory as caps().weight_dtype (or f32 for
  /// vectors: norms and biases stay f32 everywhere). Returns an empty weight when out of memory.
  virtual weight upload_weight(const void* host_src, dtype src_type, std::int64_t rows,
                               std::int64_t cols, bool is_vector) = 0;
  /// Converts `count` activations to float32 on the host (for logits, tests and transport).
  virtual void read_f32(const void* src, std::size_t count, float* host_dst) = 0;
  /// Writes host float32 values as activations (for activations received from another stage).
  virtual void write_f32(void* dst, const float* host_src, std::size_t count) = 0;

  // --- ops ---
  virtual void embedding(const std::int32_t* ids, int n, const weight& table, void* out) = 0;
  /// out = rmsnorm(x) * w
  virtual void rmsnorm(const void* x, int n, int width, const weight& w, float eps, void* out) = 0;
  /// residual += x; out = rmsnorm(residual) * w
  virtual void add_rmsnorm(void* residual, const void* x, int n, int width, const weight& w,
                           float eps, void* out) = 0;
  /// acc += x over `count` elements
  virtual void add(void* acc, const void* x, std::size_t count) = 0;
  /// out[n, w.rows] = x[n, w.cols] · wᵀ + bias (bias may be empty). w may be i8 / f8e4m3 with
  /// per-row scales where caps() says so.
  virtual void linear(const void* x, int n, const weight& w, const weight& bias, void* out) = 0;
  /// linear(x, n, w, bias, out), then add_rmsnorm(residual, out, n, width, norm_w, eps, norm_out):
  /// the same results (width = w.rows), in one call so that a backend may cut the linear's sum
  /// along K and leave the slices' sum to the norm's kernel (cuda_backend; bench/NOTES.md, session 10).
  virtual void linear_add_rmsnorm(const void* x, int n, const weight& w, const weight& bias, void* out,
                                  void* residual, int width, const weight& norm_w, float eps, void* norm_out) = 0;
  /// linear(x, n, w, bias, out) for the projection whose output the next attention() reads (qkv):
  /// the same product, marked so that a backend may compute it on a kernel that lets the attention
  /// kernel start before it ends (cuda_backend's wgmma_qkv, whose sums round as its other GEMMs'
  /// do, not bit for bit as cuBLAS's; bench/NOTES.md, session 14).
  virtual void linear_into_attention(const void* x, int n, const weight& w, const weight& bias, void* out) = 0;
  /// linear(x, n, w, bias, gate_up), then silu_mul(gate_up, n, ffn, out) (w: gate_up [2 ffn, cols]):
  /// the same out, in one call so that a backend may apply the SwiGLU in the GEMM's epilogue and
  /// never write gate_up (whose contents are unspecified afterwards; cuda_backend's wgmma_swiglu).
  virtual void linear_silu_mul(const void* x, int n, const weight& w, const weight& bias, void* gate_up, int ffn,
                               void* out) = 0;
  /// Rotates the q and k heads of packed qkv rows in place (HF's rotate_half convention).
  /// inv_freq: [head_dim / 2] float32 in backend memory, scaling already applied.
  virtual void rope(void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
                    const float* inv_freq, float attention_scaling) = 0;
  /// Stores the k and v heads of packed qkv rows into the cache slots.
  virtual void kv_write(const void* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
                        const kv_layout& layout, void* k_cache, void* v_cache) = 0;
  /// out[n, num_heads * head_dim] = softmax(q kᵀ · scale + causal mask) v over the paged cache.
  virtual void attention(const void* qkv, const attn_shape& shape, const attention_batch& batch,
                         const kv_layout& layout, const void* k_cache, const void* v_cache,
                         void* out) = 0;
  /// out[n, ffn] = silu(gate) * up, from gate_up rows [gate | up].
  virtual void silu_mul(const void* gate_up, int n, int ffn, void* out) = 0;
  /// out[i] = x[rows[i]] for i < n, each row `width` activations.
  virtual void gather_rows(const void* x, const std::int32_t* rows, int n, int width,
                           void* out) = 0;
  /// Draws one token per row of logits[n, vocab]. params and tokens are host arrays.
  virtual void sample(const void* logits, int n, int vocab, const sample_params* params,
                      std::int32_t* tokens) = 0;
  /// sample() in three parts, for a host loop that queues step n+1 before it waits for step n:
  /// draw() queues the draw of n rows into draw slot `slot` (0 or 1) and returns; copy_draw() queues
  /// a copy of the slot's first n tokens to dst (backend memory, int32), ordered after the draw (the
  /// next step's token ids); take_draw() waits for the slot's draw and copies its tokens to the host.
  /// A slot holds one draw: the next draw() into it must come after its take_draw().
  virtual void draw(const void* logits, int n, int vocab, const sample_params* params, int slot) = 0;
  virtual void copy_draw(int slot, int n, std::int32_t* dst) = 0;
  virtual void take_draw(int slot, std::int32_t* tokens) = 0;

  /// Runs `c` as one fused operation where the backend has one for its shapes (true: residual and
  /// delta end as the op-by-op path leaves them; the other scratch is unspecified). False: nothing
  /// ran, and the caller issues the ops one by one. The op-by-op path is the reference (and the CPU
  /// backend's only path).
  virtual bool decode_layers(const decode_layers_call& c) = 0;

  // --- capture: record a fixed op sequence once, replay it per step (decode steps) ---
  /// True when begin_capture/end_capture/replay work; otherwise the caller runs its ops eagerly and
  /// never calls them.
  virtual bool can_capture() const = 0;
  /// Ops issued from here to end_capture are recorded, not run. Only ops on backend memory may be
  /// issued in between (no upload, download, read_f32, write_f32, sample or synchronize).
  virtual void begin_capture() = 0;
  /// Ends the recording; returns its handle, or 0 when it could not be recorded (then nothing ran:
  /// issue the ops again eagerly).
  virtual capture_id end_capture() = 0;
  /// Runs a recording with the pointers and sizes it was recorded with; the memory it reads holds
  /// this step's inputs (uploaded before the call).
  virtual void replay(capture_id id) = 0;
  virtual void drop_capture(capture_id id) = 0;
};

}  // namespace conveyor::kernels
