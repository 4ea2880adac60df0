#pragma once
// Launchers of the CUDA kernels, callable from host C++ (the backend is compiled by the host
// compiler; only the .cu files go through nvcc). `t` is the element type of activations, weights
// and the KV cache (f32 or bf16); vectors (norm weights, biases, inv_freq) are always float32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::kernels::cuda {

// --- elementwise.cu ---
void launch_embedding(dtype t, const std::int32_t* ids, int n, const void* table, int width, void* out,
                      cudaStream_t s);
/// Weights a latency-bound kernel asks L2 for on behalf of the GEMM after it, before its own
/// griddepcontrol.wait, while HBM would otherwise idle (cp.async.bulk.prefetch.L2; sm_90 only,
/// elsewhere nothing): bytes [base + r * pitch, + row_bytes) of each row r < rows. base and pitch
/// 16-byte aligned, row_bytes a multiple of 16 (cuda_backend_options::l2_prefetch_kb).
struct l2_prefetch {
  const void* base = nullptr;  ///< nullptr: none
  int rows = 0;
  std::size_t pitch = 0;
  unsigned row_bytes = 0;
};
/// What to prefetch of a row-major matrix of `rows` rows of `row_bytes` that a GEMM streams along K
/// (every row from its start): the whole of it where it is at most `budget` bytes, else the first
/// budget / rows bytes of every row (a multiple of 256; none where that is less than 256).
l2_prefetch l2_prefetch_rows(const void* w, int rows, std::size_t row_bytes, std::size_t budget);
/// How the 16-byte bf16 norm kernels launch (the options of the same names in cuda_backend_options).
struct norm_launch {
  bool pdl = false;  ///< as a programmatic dependent of the previous kernel (device_types.cuh), as `pdl` below
  /// the next kernel may launch once this one's loads are in (after the sum of squares), not at its start
  bool late_trigger = false;
  int loads_ahead = 2;  ///< 1: every load in flight before any is used; 2: and the norm weights before the wait
  l2_prefetch prefetch;  ///< the next GEMM's weights (the K-split norm kernel only)
};
/// `pdl` (below): launch as a programmatic dependent of the previous kernel (device_types.cuh).
void launch_rmsnorm(dtype t, void* residual, const void* x, int n, int width, const float* w, float eps,
                    void* out, cudaStream_t s, norm_launch how = {});  ///< residual == nullptr: plain rmsnorm of x
/// Widths the 16-byte (bf16 × 8) norm kernels take: a multiple of 8, a row's chunks within one block.
bool norm_bf16x8_fits(int width);
/// bf16: delta[n, width] = Σ_s parts[s][n, width] (+ bias), rounded as the linear would store it;
/// residual += delta; out = rmsnorm(residual) * w (as launch_rmsnorm with a residual). False (nothing
/// launched) where the shape or alignment does not suit the kernel.
bool launch_split_add_rmsnorm(const float* parts, int splits, const float* bias, void* delta, void* residual, int n,
                              int width, const float* w, float eps, void* out, cudaStream_t s,
                              norm_launch how = {});
void launch_add(dtype t, void* acc, const void* x, std::size_t count, cudaStream_t s);
void launch_add_bias(dtype t, void* out, const float* bias, int n, int width, cudaStream_t s);
void launch_rope(dtype t, void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
                 const float* inv_freq, float attention_scaling, cudaStream_t s);
void launch_kv_write(dtype t, const void* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
                     void* k_cache, void* v_cache, cudaStream_t s);
/// rope, then kv_write, in one pass (the two ops the executor issues back to back).
void launch_rope_kv(dtype t, void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
                    const float* inv_freq, float attention_scaling, const std::int32_t* slots, void* k_cache,
                    void* v_cache, cudaStream_t s, bool pdl = false);
/// `prefetch`: the next GEMM's weights (the bf16 kernel only, issued before it waits).
/// bf16 out[n, width] from a linear's K slices (parts[s][n, width], s < splits): each entry summed in
/// slice order from 0 and stored as the linear stores its output (store_linear_out: rounded, bias
/// added, rounded), i.e. what the unsplit kernel would have written.
void launch_sum_parts(const float* parts, int splits, int n, int width, const float* bias, void* out, cudaStream_t s,
                      bool pdl);
void launch_silu_mul(dtype t, const void* gate_up, int n, int ffn, void* out, cudaStream_t s, bool pdl = false,
                     const l2_prefetch& prefetch = {});
void launch_gather_rows(dtype t, const void* x, const std::int32_t* rows, int n, int width, void* out,
                        cudaStream_t s);
/// dst[i] = host[i] for i < words (`host`: pinned host memory, read by the kernel over the bus:
/// no copy engine), except ovl[i - ovl_at] for ovl_at <= i < ovl_at + ovl_words (device memory).
/// `pdl`: a programmatic dependent whose first host reads go out before it waits for the kernel before.
void launch_upload_words(std::uint32_t* dst, const std::uint32_t* host, int words, const std::uint32_t* ovl,
                         int ovl_at, int ovl_words, cudaStream_t s, bool pdl = false);
/// Converts `count` floats on the device to `t` (upload staging).
void launch_from_f32(dtype t, const float* src, std::size_t count, void* dst, cudaStream_t s);

// --- gemv.cu ---
/// What the small-batch linear reads x from (see gemv.cu).
enum class gemv_prologue {
  none = 0,  ///< x [n, cols] as given
  norm = 1,  ///< x = rmsnorm(residual (+= delta when delta is set)) * norm_w; x_out gets x
  silu = 2,  ///< x = silu(gate) * up from x = gate_up [n, 2 * cols]; x_out gets x
};
/// out[n, rows] = x[n, cols] · wᵀ (+ bias), bf16, n ≤ 16. Pointers 16-byte aligned.
struct gemv_args {
  const __nv_bfloat16* w = nullptr;
  const float* bias = nullptr;
  int rows = 0, cols = 0, n = 0;
  const __nv_bfloat16* x = nullptr;
  __nv_bfloat16* residual = nullptr;     ///< norm prologue
  const __nv_bfloat16* delta = nullptr;  ///< norm prologue with the residual add
  const float* norm_w = nullptr;
  float eps = 0.0f;
  __nv_bfloat16* x_out = nullptr;
  unsigned* counter = nullptr;  ///< zeroed device word: arrivals of the norm prologue with delta
  __nv_bfloat16* out = nullptr;
  int stage_x = 0;  ///< set by launch_gemv: x fits in shared memory and is staged there first
  /// A grid of more tiles than fit at once is capped at the resident blocks, which loop over tiles
  /// (0: one block per tile, as before; kept to measure the cap against).
  int cap_grid = 1;
  /// A capped grid (one wave by construction) stages x in shared memory and takes the norm prologue
  /// like a one-wave grid does (0: only grids of at most two 8-warp blocks an SM, as before).
  int stage_capped = 1;
  /// Weights through a ring of shared-memory stages filled by bulk copies (TMA) from a producer warp
  /// that starts before griddepcontrol.wait, 8 computing warps (0: register loads, as before).
  int tma = 1;
  int tma_ring_bytes = 96 * 1024;  ///< with tma: the ring's target size (bytes in flight per block)
  // Set by launch_gemv for the tma kernel: columns of a stage, stages, ring offset in dynamic smem.
  int tma_cols = 0, tma_stages = 0, tma_ring_offset = 0;
  /// with tma: stages the producer issues before the computing warps are past their prologue (0:
  /// the whole ring, as soon as slots are free); the rest follow the prologue.
  int pre_wait_stages = 0;
  /// 1: the next kernel is let launch after this one's prologue, not at its start (0).
  int late_trigger = 0;
  /// norm prologue: 1 loads the norm's weights before griddepcontrol.wait and sends the writer
  /// election's atomic right after the sum of squares; 0 as before session 17 (for A/Bs).
  int norm_early = 1;
  /// Diagnostics only (time_cuda_ops gemv-stamps; nullptr in the engine): gemv_stamp_slots
  /// %globaltimer stamps a block at blockIdx.x * gemv_stamp_slots (gemv.cu says which is which).
  unsigned long long* stamps = nullptr;
};
constexpr int gemv_stamp_slots = 128;
/// Shapes launch_gemv takes (the caller also checks dtype and alignment).
bool gemv_supported(int n, int rows, int cols);
/// Dynamic shared memory of the norm prologue (x staged as [n][cols + 8] bf16).
std::size_t gemv_norm_smem_bytes(int n, int cols);
constexpr std::size_t gemv_max_norm_smem = 160 * 1024;
/// Raises the kernels' shared-memory limit on the current device (once, before the first launch).
void gemv_init();
/// The GEMV's output tiles of 16 rows for `rows` outputs (a block computes one tile at a time).
constexpr int gemv_tiles(int rows) { return (rows + 15) / 16; }
/// True when the GEMV of `rows` outputs runs as one wave on `sms` multiprocessors. Only then is the
/// norm prologue worth it: every block repeats it, and each further wave waits for it again.
bool gemv_single_wave(int rows, int sms);
/// True when launch_gemv runs `a` (rows, cap_grid, stage_capped) as one wave: x is staged and the
/// norm prologue pays (it is repeated once per block, not per tile).
bool gemv_one_wave(const gemv_args& a, int sms);
/// `pdl`: launch as a programmatic dependent of the previous kernel (it prefetches weights early).
void launch_gemv(const gemv_args& a, gemv_prologue pro, bool pdl, int sms, cudaStream_t s);

// --- attention.cu ---
/// Which attention kernels to use where they apply (off: the plain float32 kernels).
struct attention_tuning {
  bool gqa_decode = true;  ///< decode: one block per KV head for its whole query-head group
  bool tc_prefill = true;  ///< prefill, bf16, head_dim 64/128: tensor cores
  /// with tc_prefill, group 1/2/4/8: one 8-warp block per (query tile, KV head) for the whole group,
  /// K/V tiles cp.async-pipelined (prefill_gqa_tc_kernel); off: prefill_tc_kernel
  bool gqa_prefill = true;
  /// decode, bf16, head_dim 64/128: K and V rows of 32 keys loaded together with 16-byte loads
  bool vec_decode = true;
  bool pdl = false;  ///< decode kernels start as programmatic dependents (device_types.cuh)
  /// with vec_decode: 16 warps a block where the grid has fewer blocks than SMs (batch 1-8), else 4
  bool wide_decode = false;
  /// with vec_decode, head_dim 64, group ≤ 8: the tensor-core decode kernel (unless wide_decode applies)
  bool tc_decode = true;
  /// fused rope + kv_write prologue of the decode kernels: (cos, sin) once per pair a block, through
  /// shared memory, with the pairs' loads issued before it (cuda_backend_options::rope_once)
  bool rope_once = true;
  /// with tc_decode (not under wide_decode): decode_gqa_ring_kernel, K and V of every key staged in
  /// shared memory by cp.async, `ring_decode` chunks of 32 keys in flight a warp (1 or 2), the first
  /// requested before griddepcontrol.wait in the fused step; 0: decode_gqa_tc_kernel
  int ring_decode = 0;
  /// with tc_decode and the fused prologue (ring_decode 0): decode_gqa_tc_kernel<G, true, true>, each
  /// warp's first chunk of K/V requested before griddepcontrol.wait (the tc kernel's shared memory)
  bool early_decode = false;
  /// ≥ 0: the grouped decode launches' preferred shared-memory carveout (percent); -1: the driver's
  int decode_carveout = -1;
  /// > 0: decode splits of exactly this many keys (rounded up to 32), however many sequences the
  /// call has: a row's result then depends on its own context only (batch_invariant). 0: the split
  /// count is chosen to fill the GPU.
  int split_len = 0;
  /// Without split_len: a decode split covers at least this many keys of the call's longest
  /// context (in a CUDA graph, its bucket: 256, 512, 1024, ...). One split fuses rope into the
  /// attention kernel and needs no combine launch.
  int split_min_keys = 256;
  /// Without split_len: a call whose longest context (in a CUDA graph, its bucket) is at most this
  /// many keys runs one split, however few blocks that makes (batch 1-8).
  int one_split_max_keys = 256;
  /// Several splits of a decode step on decode_gqa_ring_kernel take the rope_kv prologue too (each
  /// split ropes its query heads, the split with the new key writes it) and the row's last split to
  /// finish merges them: no rope_kv and no combine launch (needs attention_rope_kv::split_done).
  bool fuse_splits = false;
  /// decode_gqa_ring_kernel with the fused prologue: the next kernel (o_proj) may launch only once the
  /// rope prologue is done, so its weight prefetch does not queue in front of the prologue's loads
  /// (off: right after griddepcontrol.wait). Session 17.
  bool late_trigger = false;
};
/// rope + kv_write of the step's rows (launch_rope_kv's arguments), handed to launch_attention: the
/// grouped decode kernel does them in its prologue where one block serves each (sequence, KV head),
/// one launch fewer a layer; elsewhere launch_attention runs launch_rope_kv first. Memory ends as
/// rope, kv_write, attention leave it.
struct attention_rope_kv {
  void* qkv = nullptr;  ///< the attention's qkv rows (rope writes the roped q and k heads back)
  int n = 0;            ///< rows
  const std::int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float scaling = 1.0f;
  const std::int32_t* slots = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  /// set by launch_attention from attention_tuning::rope_once (the prologue's variant)
  bool once = true;
  /// set by launch_attention from attention_tuning::late_trigger (decode_gqa_ring_kernel)
  bool late_trigger = false;
  /// The qkv linear left as its K slices (launch_skinny_wgmma_split_parts; nullptr: qkv holds it):
  /// qkv[r, c] is store_linear_out(0 + parts[0][r, c] + ... + parts[splits - 1][r, c], bias), each
  /// slice n × width floats. The prologue sums its own heads' entries and leaves them in qkv (q and k
  /// roped, v as is), so memory ends as the summed GEMM, rope, kv_write and attention leave it;
  /// where no kernel takes the prologue, launch_attention sums the slices into qkv first.
  const float* parts = nullptr;
  int splits = 0;
  const float* bias = nullptr;
  static constexpr int max_splits = 4;  ///< the most the prologue sums (the 1B's and Qwen2's qkv: 4)
  /// attention_tuning::fuse_splits: split_done_count counters, zero between calls (the last split of
  /// a (sequence, KV head) at [seq * kv_heads + kv_head] clears its own); nullptr: not fused.
  unsigned* split_done = nullptr;
  int split_done_count = 0;
};
/// Scratch floats the decode kernel needs for `splits` partial results per (sequence, head).
std::size_t attention_partial_floats(int num_seqs, int num_heads, int head_dim, int splits);
/// `partials`/`partial_floats`: preallocated scratch; the launcher picks the number of splits that fits.
void launch_attention(dtype t, const void* qkv, const attn_shape& shape, const attention_batch& batch,
                      const kv_layout& layout, const void* k_cache, const void* v_cache, void* out,
                      float* partials, std::size_t partial_floats, int num_sms, const attention_tuning& tune,
                      cudaStream_t s, const attention_rope_kv* rope = nullptr);

// --- sampling.cu ---
/// Per-row sampling parameters as the device reads them; `u` is sample_uniform(seed, step),
/// computed on the host so both backends draw the very same number.
struct device_sample_params {
  float temperature;
  int top_k;
  float top_p;
  int greedy;
  double u;
};

/// Device workspace of the sampler for `rows` rows of `vocab` logits.
struct sample_workspace {
  float* keys_in = nullptr;
  float* keys_out = nullptr;
  std::int32_t* idx_in = nullptr;
  std::int32_t* idx_out = nullptr;
  std::int32_t* offsets = nullptr;  ///< [rows + 1]
  /// [rows] each: the split argmax's running best key of a row and its count of finished slices,
  /// zero between calls (the row's last slice reads and clears them)
  unsigned long long* argmax_keys = nullptr;
  unsigned* argmax_done = nullptr;
  void* sort_temp = nullptr;
  std::size_t sort_temp_bytes = 0;
  int rows = 0;
  int vocab = 0;
};
/// Bytes of cub's temporary storage for sorting `rows` segments of `vocab` keys.
std::size_t sample_sort_temp_bytes(int rows, int vocab);
/// Fills ws.offsets for the workspace's shape (once, after allocation).
void launch_sample_init(const sample_workspace& ws, cudaStream_t s);
/// Draws one token per row into `tokens` (device). `any_random`: some row is not greedy; `params`
/// may be nullptr when none is (every row greedy: nothing to upload). `host_tokens` (pinned host
/// memory, may be nullptr): where the kernel may also write the tokens; returns whether it did (then
/// no copy back is needed once the stream reaches this point). `num_sms` sizes the argmax grid.
bool launch_sample(dtype t, const void* logits, int n, int vocab, const device_sample_params* params,
                   bool any_random, const sample_workspace& ws, std::int32_t* tokens, cudaStream_t s,
                   std::int32_t* host_tokens = nullptr, int num_sms = 132);

}  // namespace conveyor::kernels::cuda
