#pragma once
// The decoder layers of a one-token decode step as one persistent kernel (fused_decode.cu), callable
// from host C++. Everything is bf16 except the norm weights, biases and inv_freq (float32).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace conveyor::kernels::cuda {

/// One layer's device pointers (biases may be nullptr).
struct fused_layer {
  const float* input_norm = nullptr;
  const __nv_bfloat16* qkv = nullptr;
  const float* qkv_bias = nullptr;
  const __nv_bfloat16* o = nullptr;
  const float* o_bias = nullptr;
  const float* post_norm = nullptr;
  const __nv_bfloat16* gate_up = nullptr;
  const float* gate_up_bias = nullptr;
  const __nv_bfloat16* down = nullptr;
  const float* down_bias = nullptr;
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  int window = 0;  ///< sliding window (0: whole context)
};

/// Layers one launch takes (the kernel's parameters stay under 4 KB); more are launched in chunks.
constexpr int fused_max_layers = 24;

struct fused_decode_args {
  fused_layer layer[fused_max_layers];
  int num_layers = 0;
  /// 1: the first layer starts with residual += delta (the previous chunk's last down output)
  int first_adds_delta = 0;
  int hidden = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f, eps = 0.0f;
  int block_size = 0;  ///< KV cache block size (keys a block)
  const std::int32_t* positions = nullptr;   ///< [1]
  const std::int32_t* slots = nullptr;       ///< [1]
  const std::int32_t* ctx_len = nullptr;     ///< [1] keys after this step's write
  const std::int32_t* block_table = nullptr; ///< the sequence's row
  const float* inv_freq = nullptr;
  float rope_scaling = 1.0f;
  __nv_bfloat16* residual = nullptr;  ///< [hidden] in: the stream; out: as the op-by-op path leaves it
  __nv_bfloat16* delta = nullptr;     ///< [hidden] in (first_adds_delta) and out: the last down output
  // Scratch in device memory.
  __nv_bfloat16* qkv_out = nullptr;   ///< [(heads + 2 kv_heads) head_dim]
  __nv_bfloat16* o_out = nullptr;     ///< [hidden]
  __nv_bfloat16* act = nullptr;       ///< [ffn]
  __nv_bfloat16* attn_out = nullptr;  ///< [heads head_dim]
  float* partials = nullptr;          ///< fused_decode_partial_floats()
  /// keys an attention unit takes at most (and prefetch_keys): units = KV heads × splits, splits up
  /// to blocks / KV heads. 64 was the rule before session 11 (32 units of ~50 keys at context 200);
  /// 8 spreads the keys over up to 128 blocks (bench/NOTES.md, session 11)
  int attn_unit_keys = 8;
  unsigned* sync = nullptr;           ///< three zeroed words; the kernel leaves them zero
  unsigned* head_sync = nullptr;      ///< kv_heads zeroed words; the kernel leaves them zero
  /// nullptr, or [blocks][num_layers][fused_trace_points] %globaltimer stamps (ns) of each block's
  /// computing warps at the end of each phase (bench: where a layer's time goes)
  unsigned long long* trace = nullptr;
  /// nullptr, or host-mapped [2 × blocks] words the launch keeps current for a watchdog on the host:
  /// [b] = block b's computing warps' last stamp (layer × fused_trace_points + point + 1), [blocks + b]
  /// = stages its producer has issued. They show where every block stands when a launch hangs.
  unsigned* progress = nullptr;
  int ring_stages = 0;                ///< set by launch_fused_decode (what shared memory allows)
  /// grid barrier variant (fused_decode.cu, grid_sync); the default is the fastest measured (session
  /// 12, one call: mode 1 1065.0 µs a launch, 0 1070.8, 2 1114.7 / 1121.3)
  int barrier_mode = 1;
  /// 1: attention units prefetch their cached keys' K/V rows while qkv streams (0: read them in place)
  int prefetch = 1;
  /// 1: block b streams stages b, b + grid, ... of each matrix (neighbouring blocks read neighbouring
  /// stages); 0: a contiguous 1/grid of its rows
  int interleave = 1;
  /// bench only (time_cuda_ops FUSED_COPY_SPLIT): bulk copies a 16 KB stage is cut into, one a lane
  /// of the producer warp (1 .. 32); more measured slower (the stream alone 2.20 TB/s with 1, 0.91
  /// with 32; bench/NOTES.md, session 10)
  int copy_split = 1;
  /// bench only (time_cuda_ops): 1 = the computing warps only hand every stage back, no arithmetic
  /// and no barriers: the weight stream's own rate
  int stream_only = 0;
  /// stages beyond the one the producer waits for that it asks L2 to fetch while the ring is full
  /// (the computing warps at a barrier or in attention: HBM idle); 0 = none. Stream-only 754 → 520
  /// µs a launch with 8; the full kernel 1072-1088 µs with 4 against 1085-1105 with none, worse
  /// beyond 8 (bench/NOTES.md, session 12): off until it pays
  int l2_ahead = 0;
};

/// Stamps a layer: its start, then the ends of norm, qkv, barrier, attention, barrier, attention
/// output load, o, barrier, norm, gate_up, barrier, act load, down, barrier.
constexpr int fused_trace_points = 15;
/// KV heads the per-head arrival words allow.
constexpr int fused_max_kv_heads = 32;

/// Shapes the fused kernel takes (bf16 everywhere, one token).
bool fused_decode_supported(int hidden, int ffn, int heads, int kv_heads, int head_dim);
/// Scratch floats of the attention partials for a grid of `blocks`.
std::size_t fused_decode_partial_floats(int heads, int kv_heads, int head_dim, int blocks);
/// Blocks of the launch (one per SM), 0 when the kernel cannot be resident on every SM at once.
int fused_decode_blocks(int sms);
/// `pdl`: a programmatic dependent of the previous kernel (its producer streams weights early).
/// `cooperative`: a cooperative launch instead (every block resident before any starts; not with pdl).
void launch_fused_decode(const fused_decode_args& a, int blocks, cudaStream_t s, bool pdl = true,
                         bool cooperative = false);

}  // namespace conveyor::kernels::cuda
