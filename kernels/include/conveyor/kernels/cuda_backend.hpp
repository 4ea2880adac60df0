#pragma once
// Factory of the CUDA backend. Host-only header: callers compile without nvcc, and it exists (and
// links) only where the build found CUDA (CONVEYOR_HAVE_CUDA).
#include <memory>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::kernels {

/// Which one-token GEMVs cuda_backend_options::gemv_late_trigger and gemv_pre_wait_mask name: bits.
constexpr int gemv_silu_prologue = 1;  ///< down_proj (x = silu(gate) · up read in its prologue)
constexpr int gemv_norm_prologue = 2;  ///< qkv, gate_up, the LM head (x = rmsnorm(residual += delta))
constexpr int gemv_no_prologue = 4;    ///< o_proj
constexpr int gemv_every_prologue = gemv_silu_prologue | gemv_norm_prologue | gemv_no_prologue;

/// Which GEMMs cuda_backend_options::l2_prefetch_mask names: bits. Each is the GEMM whose input the
/// K-split add + rmsnorm kernel or the silu_mul kernel just before it computes.
constexpr int l2_prefetch_qkv = 1;      ///< qkv (linear_into_attention), after the K-split norm
constexpr int l2_prefetch_gate_up = 2;  ///< gate_up on cuBLAS (linear_silu_mul), after the K-split norm
constexpr int l2_prefetch_down = 4;     ///< down (after silu_mul)
constexpr int l2_prefetch_other = 8;    ///< any other linear after one of the two (the LM head)

struct cuda_backend_options {
  int device = 0;                 ///< CUDA device ordinal
  dtype compute_dtype = dtype::bf16;  ///< weights, activations and KV cache: bf16, or f32 for golden runs
  /// Device scratch for flash-decoding partial results; longer contexts or bigger batches than it
  /// holds use fewer splits (still correct, less parallel).
  std::size_t attention_workspace_bytes = 64ull << 20;
  /// Rows of logits sampled per pass; the sort workspace is sized for this many rows of the vocab.
  int sample_rows_per_pass = 64;
  /// Device scratch that i8 / f8e4m3 linears with more than 16 tokens (and every one in f32 compute)
  /// dequantize row tiles into for cuBLAS (bigger tiles, fewer launches; L2 residency was not kept
  /// at batch 64 anyway, bench/NOTES.md).
  std::size_t quant_scratch_bytes = 16ull << 20;

  // Speed paths; each can be switched to measure it (bench/conveyor_bench) or to rule it out. The
  // defaults are what measured fastest on the H200 (bench/NOTES.md).
  bool graphs = true;       ///< can_capture(): the executor records decode steps as CUDA graphs
  /// bf16 linear with n ≤ small_gemm_max_n (at most 16) tokens on the tensor-core GEMV instead of
  /// cuBLAS, with the rmsnorm / silu_mul before it folded in. Measured (bench/NOTES.md, session 3):
  /// batch 1 6% faster than cuBLAS, batch 8 25% slower, so by default only single-token steps.
  bool small_gemm = true;
  int small_gemm_max_n = 1;
  bool fuse = true;         ///< bf16: rope into kv_write; with small_gemm also rmsnorm / silu_mul into the GEMV
  bool fuse_norm = true;    ///< with small_gemm and fuse: rmsnorm into a GEMV that runs as one wave
  /// with fuse: rope + kv_write of a decode step done by the grouped decode attention kernel (bf16,
  /// one split per sequence), one launch fewer a layer
  bool fuse_attention = true;
  /// with fuse_attention: the decode kernel's prologue computes each rope angle's (cos, sin) once a
  /// block (one thread per pair, shared through shared memory) and loads its q/k/v pairs before the
  /// sincos, instead of one double-precision sincos per (head, pair) after each load (the G query
  /// heads and the key repeat the same angles; warp 0 ran two back to back). Bit-identical results.
  bool rope_once = true;
  /// with small_gemm: a GEMV of more tiles than fit at once runs on the resident blocks, each looping
  /// over tiles (off: one block per tile). Not yet ablated in wall time (bench/NOTES.md, session 2).
  bool gemv_cap_grid = true;
  /// with small_gemm and gemv_cap_grid: a capped grid (gate_up, the LM head) stages x in shared
  /// memory and takes the rmsnorm before it into its prologue, as one-wave grids do: once per block,
  /// not per tile, and one launch fewer a layer (bench/NOTES.md, session 4).
  bool gemv_stage_capped = true;
  /// with small_gemm: the GEMV streams its weights through a ring of shared-memory stages filled by
  /// bulk copies (TMA) from a producer warp that starts before the previous kernel ends; off: each
  /// warp loads groups of chunks into registers (at most ~128 KB in flight an SM; bench/NOTES.md).
  bool gemv_tma = true;
  /// with gemv_tma: the ring's size a block. 96 KB (two blocks an SM) measured fastest at batch 1
  /// (bench/NOTES.md, session 4, against 128, 192 and 224).
  int gemv_tma_ring_kb = 96;
  /// with gemv_tma: also grids of more than one and fewer than two waves of 16-row tiles (qkv_proj's
  /// 192 tiles on 132 SMs, 4.4 → 5.0 µs with TMA in session 4); off: those run on the register
  /// kernel, whose 8-warp grids compute the same bits (batch_invariant unchanged). Not yet measured
  /// in a step: variant `qkvreg` (bench/NOTES.md, session 4).
  bool gemv_tma_partial_wave = true;
  /// GEMV norm prologue: the norm's weights are loaded before griddepcontrol.wait and the atomic that
  /// elects the block writing residual += delta goes out right after the sum of squares (off: both
  /// after, as before session 17). Same arithmetic, same bits (bench/NOTES.md, session 17).
  bool gemv_norm_early = true;
  /// GEMVs (gemv_*_prologue bits) that let the next kernel launch only after their prologue, so what
  /// it requests early (attention's K/V, then o_proj's weights behind it) does not queue in front of
  /// their prologue's loads. The norm GEMVs: b=1 step −45 µs on an H100 against none; adding down or
  /// every GEMV loses to them alone (bench/NOTES.md, session 17).
  int gemv_late_trigger = gemv_norm_prologue;
  /// GEMVs (gemv_*_prologue bits) whose producer issues only gemv_pre_wait_stages stages before the prologue is
  /// done (0: the whole ring at once). Measured: 1 stage on the norm GEMVs +6 µs at b=1 (session 17).
  int gemv_pre_wait_mask = 0;
  int gemv_pre_wait_stages = 0;
  /// The batch-1 decode attention (ring kernel, fused rope prologue) lets o_proj launch only after its
  /// prologue (off: right after griddepcontrol.wait). Measured +29 µs at b=1: o_proj's prefetch under
  /// attention is worth more (session 17).
  bool decode_late_trigger = false;
  /// The bf16 rmsnorm kernels (add + rmsnorm, the K-split sum + rmsnorm) let the next kernel launch
  /// once their loads are in, not at their start (at batch 2-64 the wgmma qkv's weight prefetch then
  /// no longer queues in front of them). Measured +46 / +23 µs at b=8 / 64 (session 17).
  bool norm_late_trigger = false;
  /// The bf16 rmsnorm kernels' loads (session 18; the same sums either way, bit-identical): 1, every
  /// load issued before any is used (the K slices, the residual, x, the norm weights); 2, and the
  /// norm weights requested before griddepcontrol.wait; 0, as before: the weights after the block's
  /// sum, the residual after the slices, the slices one at a time below 4.
  int norm_loads_ahead = 2;
  /// Decode steps of more tokens than the GEMV takes (bf16, pdl): the K-split add + rmsnorm and the
  /// silu_mul kernels, which wait on small inputs while HBM idles, first ask L2 for up to this many
  /// KB of the weights of the GEMM after them (l2_prefetch_mask says which), so that GEMM's first
  /// loads hit L2: the whole matrix where it fits, else the first columns of every row (a GEMM
  /// streams each row from column 0). 0: off. The kernel's launch is held until the next call says
  /// which weights come next. Refuted on the H100 (session 19): b=64 step +210 µs with qkv's
  /// 12 MB, +310-360 with qkv, gate_up and down (bench/NOTES.md), hence off.
  int l2_prefetch_kb = 0;
  int l2_prefetch_mask = l2_prefetch_qkv | l2_prefetch_gate_up | l2_prefetch_down | l2_prefetch_other;
  /// With pdl: the held upload between decode steps (the next step's ids, positions, slots from
  /// pinned host memory, with the drawn tokens laid over) launches as a programmatic dependent of the
  /// sampling kernel and reads its host words over the bus before it waits (session 18).
  bool upload_pdl = true;
  /// Decode-step kernels (GEMV, rmsnorm, rope_kv, silu_mul, decode attention) start as programmatic
  /// dependents: each launches while the one before drains (the GEMV prefetches its weights then).
  bool pdl = true;
  bool gqa_decode = true;  ///< decode attention: one block per KV head serves its query-head group
  /// with gqa_decode, bf16, head_dim 64/128: a warp loads its 32 keys' K and V rows at once (16-byte loads)
  bool vec_decode = true;
  /// with vec_decode: 16 warps a block where the decode grid has fewer blocks than SMs (batch 1-8).
  /// Off: ncu had the kernel 8% faster at batch 1, but the steps measured 2% slower (bench/NOTES.md).
  bool wide_decode = false;
  /// with vec_decode, head_dim 64, group ≤ 8: decode attention on tensor cores (except where
  /// wide_decode takes the grid); the vec kernel was issue-bound (batch 64 −8%, batch 1 −5% a step)
  bool tc_decode = true;
  /// with tc_decode: decode_gqa_ring_kernel (kernels/cuda/attention.cu), the tensor-core decode with
  /// each key's K and V rows staged in shared memory by cp.async, `ring_decode` chunks of 32 keys in
  /// flight a warp (1 or 2); in the fused decode step the first chunks are requested before
  /// griddepcontrol.wait. The same bits as the tc kernel. 0: decode_gqa_tc_kernel. 16% faster in a
  /// graph of back-to-back attention calls (b=64, 192 keys), but no faster in a b=64 step, where the
  /// cuBLAS qkv GEMM before it does not release it early; at batch 1 the qkv GEMV before it does:
  /// 0.941 / 0.951 ms a step against 0.961 / 0.972 with it off (bench/NOTES.md, session 6), hence on
  /// for batch 1 only (ring_decode_max_seqs). Two chunks a warp (session 8): at batch 1 a warp's
  /// second chunk (contexts of 129-256 keys on 4 warps) is requested before the wait too.
  int ring_decode = 2;
  /// ring_decode only for steps of at most this many sequences (1: the steps whose qkv runs on the
  /// GEMV, small_gemm_max_n, which releases the attention kernel early); 1 << 30: every step
  int ring_decode_max_seqs = 1;
  /// with tc_decode, ring_decode 0, fuse_attention: the tc decode kernel requests each warp's first
  /// 32 keys before griddepcontrol.wait (K into registers, V into its tile), the new key patched in
  bool early_decode = false;
  /// ≥ 0: preferred shared-memory carveout (percent) of the decode attention launches; -1: the driver's
  int decode_carveout = -1;
  /// Decode attention (not batch_invariant): each split of a sequence's keys covers at least this
  /// many keys of the step's longest context, which in a CUDA graph is its recording's bucket (the
  /// power of two ≥ 256 above the context). One split runs rope in the attention kernel's prologue
  /// and needs no combine kernel; more splits fill more SMs at batch 1-8. Session 30 (bench/NOTES.md,
  /// H100, b=1, contexts 512-640 in the 1024 bucket): 512 (2 splits) 1.168 ms a step against 1.125
  /// with 4: fewer blocks and the same two extra launches; one split (decode_one_split_max_keys) 1.068.
  int decode_split_min_keys = 256;
  /// Decode attention (not batch_invariant): a step whose longest context (in a CUDA graph, its
  /// recording's bucket) is at most this many keys runs one split, even where that leaves SMs idle
  /// (batch 1-8). Session 30 on an H100, contexts 512-640 (the 1024 bucket): batch 1 1.068 ms a step
  /// against 1.125 with 4 splits (the separate rope_kv and combine launches cost ~5.5 µs a layer
  /// and o_proj's overlap), batch 8 1.317 against 1.333. Still 256 (the behaviour before): at
  /// 257-1024 keys the fused prologue takes a path (the new key's chunk read back from the cache)
  /// that no GPU test has run yet; bench/s31-call runs them (sessions 30-31 got no GPU for it).
  int decode_one_split_max_keys = 256;
  /// Decode attention on decode_gqa_ring_kernel (batch 1, and steps after an early-releasing qkv):
  /// where a step runs several splits, each takes the fused rope prologue (the query heads roped
  /// per split, the new key written by its own split) and the last split of a row to finish merges
  /// them, so the separate rope_kv and combine launches go (~5.5 µs a layer, session 30). Off until
  /// a GPU runs test_cuda_ops' fused_split_decode_matches_unfused_bit_for_bit and bench/s31-call
  /// measures it (session 31 got no GPU).
  bool decode_fuse_splits = false;
  bool tc_prefill = true;  ///< bf16 prefill attention on tensor cores (head_dim 64 or 128)
  /// with tc_prefill, group 1/2/4/8: one block per KV head serves its query-head group (K/V tiles
  /// read once per group, cp.async-pipelined); off: one block per query head (bench/NOTES.md, session 4)
  bool gqa_prefill = true;
  /// bf16 linears of ≤ 256 tokens through cuBLASLt, with the algorithm timed fastest for the shape
  /// at its first call (cuBLAS's own choice among the candidates); off: cublasGemmEx's choice. Off:
  /// it picked nearly cuBLAS's own kernels, and the steps measured no faster in three runs
  /// (3-5% slower at batch 64 in two of them; bench/NOTES.md, session 3).
  bool gemm_tune = false;
  /// bf16 linears of skinny_gemm_min_n ≤ n ≤ skinny_gemm_max_n (at most 128) tokens on our own
  /// tensor-core GEMM (kernels/cuda/skinny_gemm.cu: a cp.async weight stream, K split inside a
  /// thread-block cluster instead of cuBLAS's separate reduce kernel) instead of cuBLAS. Token counts
  /// that small_gemm takes stay on the GEMV (batch_invariant's ≤ 16 rows too). Off: the batch-64
  /// step measured 22% slower with it (1.63 vs 1.34 ms); it wins only on o_proj and on Qwen2-1.5B's
  /// fused qkv 2048×1536 (bench/NOTES.md, session 4).
  bool skinny_gemm = false;
  int skinny_gemm_min_n = 17;
  int skinny_gemm_max_n = 128;
  /// bf16 qkv projections (backend::linear_into_attention) of wgmma_qkv_min_n ..
  /// wgmma_qkv_max_n tokens on the wgmma GEMM (sm_90; elsewhere as without it), whatever
  /// skinny_wgmma says, except token counts the GEMV takes (small_gemm_max_n) or batch_invariant
  /// keeps row-invariant: it releases the decode attention kernel right after its own wait, so
  /// attention starts before qkv ends, and runs as decode_gqa_ring_kernel with
  /// wgmma_qkv_ring_decode chunks a warp (its K/V requested before its wait; 0: the tc kernel).
  /// On the H200 (bench/NOTES.md, session 14), steps against cuBLAS's qkv and the tc kernel: batch
  /// 64 1.242 / 1.233 ms against 1.259 / 1.265, batch 32 1.128 / 1.125 against 1.157 / 1.160,
  /// batch 16 1.084 / 1.082 against 1.121 / 1.124, batch 8 1.031 / 1.029 against 1.083 / 1.081; at
  /// 128 no gain (the wgmma qkv alone +67 µs, the ring only wins that back).
  bool wgmma_qkv = true;
  int wgmma_qkv_min_n = 2;
  int wgmma_qkv_max_n = 64;
  int wgmma_qkv_ring_decode = 1;
  /// The wgmma GEMM's K-split cluster epilogue (qkv at batch 17-64 on the H100's and H200's SM
  /// counts): each block stores its f32 partial sums into the shared memory of the block that owns
  /// those rows and the cluster meets once, arriving as soon as its first ring slots are free;
  /// off: each block keeps its tile, the cluster meets, every block reads its peers' tiles, the
  /// cluster meets again. Same sums in the same order (bit-identical). Refuted on the H200 (session
  /// 20, bench/NOTES.md): b=64 step +50 to +110 µs, b=8 +30 to +70 (the qkv kernel left ~3.5 µs
  /// later: the small remote stores and the owner's pass cost more than the pull's remote loads).
  bool wgmma_push_reduce = false;
  /// The wgmma qkv GEMM (wgmma_qkv) where it splits K over a cluster (batch 17-64 here): each split's
  /// f32 sums stored to a scratch area (no cluster, no reduction, no barrier) and summed by the decode
  /// attention kernel's rope prologue as it loads its heads' q, k and v, in the cluster's order and
  /// with its rounding (the same bits; where no attention kernel takes the prologue, a small kernel
  /// sums them first). Off: on an H100 (session 21, bench/NOTES.md) the b=64 qkv kernel ran 2.4 µs a
  /// layer shorter (8.7 → 6.3), but the attention after it 1.9 longer (10.1 → 12.0): the pair is
  /// bound by their 38 MB of memory traffic, which the cluster epilogue's time already overlapped; the
  /// step +10 to +50 µs at b=64.
  bool wgmma_qkv_slices = false;
  /// wgmma_qkv_slices from this many tokens (below, the decode attention may split each sequence's
  /// keys, and then the slices are summed by a kernel of their own before rope_kv)
  int wgmma_qkv_slices_min_n = 2;
  /// bf16 gate_up projections (backend::linear_silu_mul) of wgmma_swiglu_min_n ..
  /// wgmma_swiglu_max_n tokens on the wgmma GEMM with the SwiGLU in its epilogue (sm_90; elsewhere,
  /// and at token counts the GEMV takes or batch_invariant keeps row-invariant, the GEMM and silu_mul
  /// as without it): the silu_mul kernel, its launch gap and gate_up's write and re-read go.
  /// On the H200 (bench/NOTES.md, session 16), step against cuBLAS's gate_up + silu_mul: batch 2
  /// −31 µs, 4 −35, 8 −37, 16 −39, 32 −41; at 48 +50, 64 +52, 128 +295 (its 64- and 128-token
  /// tiles lose to cuBLAS in a step, though at 64 it wins by 0.4 µs on its own), hence 32.
  bool wgmma_swiglu = true;
  int wgmma_swiglu_min_n = 2;
  int wgmma_swiglu_max_n = 32;
  /// linear_add_rmsnorm (o_proj, down_proj) at wgmma_qkv_min_n .. skinny_gemm_max_n tokens as the
  /// wgmma GEMM's K slices (separate blocks, no cluster, f32 sums summed by the add + rmsnorm
  /// kernel, as split_linears does with cuBLASLt), where one block an SM leaves room for ≥ 2 slices;
  /// elsewhere split_linears' path. At batch 64 it measured −17 µs on one machine and +24 on
  /// another (session 15), +27 / −18 / −16 on an H100 (session 22), so down stops at
  /// wgmma_split_max_n; below, on H100s in three processes of 2-3 rounds (session 22) against
  /// cuBLASLt's slices: batch 8 −36 to −39 µs a step (one process's first round +14), batch 16
  /// −30 to −70, batch 32 −21 to −74 (bench/NOTES.md). Not yet measured on an H200.
  bool wgmma_split = true;
  /// wgmma_split only up to this many tokens (beyond, split_linears' cuBLASLt slices)
  int wgmma_split_max_n = 32;
  /// ... and up to this many for a product whose K is no longer than its rows (o_proj: hidden ×
  /// hidden; down, K = ffn, keeps wgmma_split_max_n). Session 22's b=64 timelines on an H100:
  /// cuBLASLt's o_proj 6.7 µs a layer for 8.4 MB, our slices 3.9-5.9 (the attention before it
  /// +1.5, as o_proj's early weight requests share its bandwidth); steps at b=64 −17 to −26 µs in
  /// 6 of 7 same-process rounds (the seventh was the process's first round, which reads fast for
  /// whichever variant runs it).
  int wgmma_split_short_k_max_n = 128;
  /// bf16 linears of skinny_gemm_min_n ≤ n ≤ skinny_gemm_max_n tokens on the Hopper skinny GEMM
  /// (kernels/cuda/skinny_wgmma.cu: TMA weight ring, wgmma with the weights as A, K split in a
  /// cluster); takes precedence over skinny_gemm; sm_90 only (elsewhere cuBLAS as without it).
  /// Off: per shape within ±10% of cuBLAS, but the b=64 step measured 0.15-0.2 ms slower with it
  /// (each launch 6-9 µs besides its bytes under ncu; bench/NOTES.md, session 5).
  bool skinny_wgmma = false;

  /// linear_add_rmsnorm at cuBLAS batch sizes (beyond the GEMV's, up to split_linear_max_n tokens,
  /// bf16): the linear as 2 or 4 float32 K slices (strided cuBLASLt batches) summed by the add +
  /// rmsnorm kernel, where its tuning timed that faster than the plain GEMM by > 0.5 µs (at batch 64
  /// on the H200: down 13.3 -> 11.3 µs with cuBLAS's reduce kernel gone, o_proj 6.0 -> 5.1 in
  /// graphs of GEMMs; the steps −10 to −15 µs at batch 32 and 64; bench/NOTES.md, session 10).
  /// Off: linear, then add_rmsnorm.
  bool split_linears = true;
  /// The split must beat the plain GEMM by this many µs: the norm's kernel then reads S float32
  /// slices from L2 instead of one bf16 tensor (~2 MB at batch 64, 2048 wide, S 4). Tests force the
  /// split with a large negative margin.
  float split_linear_margin_us = 0.5f;
  /// The split runs up to this many tokens: at 256 the steps measured 3-16 µs slower with it
  /// although its tuning timed the down GEMM 4.7 µs faster (bench/NOTES.md, session 10).
  int split_linear_max_n = 128;
  /// The file that keeps the GEMM choices timed by gemm_tune and split_linears between processes
  /// (kernels/cuda/tuning_cache.hpp): a backend reads the choices made before on this GPU model and
  /// cuBLASLt version, and adds its new ones. Without it every process times afresh, and where two
  /// algorithms time within noise of each other they round differently: the same greedy request
  /// gave other tokens after a restart (session 30, bench/NOTES.md). Empty: no file.
  std::string gemm_tuning_cache;

  /// bf16 decode steps of one token: every decoder layer in one persistent kernel
  /// (kernels/cuda/fused_decode.cu: a producer warp an SM streams all the weights through a
  /// shared-memory ring, the layers' ops meet at grid-wide barriers) instead of ~6 launches a layer.
  /// Not under batch_invariant. Experimental, off: it matches the op-by-op layers in the parity
  /// tests and HF's goldens, but a step measured slower (1.37-1.45 ms against 0.91-0.92 at batch
  /// 1). Its repeated launches failed now and then until session 8 found the cause (a ring slot's
  /// full-barrier parity wait passed a phase early; bench/NOTES.md, session 8). Session 10: its
  /// weight stream alone (no arithmetic, no barriers) runs at 2.5 TB/s, ~60% of the copy rate, and
  /// its waits cost ~40 µs a layer besides; 1.35 ms a step against 0.89 op by op. Session 12: the
  /// stream alone 2.6 TB/s (3.7 with fused_l2_ahead 8), the kernel 1065 µs for the 1B's 16 layers
  /// against ~750 op by op: five grid barriers a layer of >= 3.4 µs each are its critical path.
  bool fused_decode = false;
  /// with fused_decode: stages the producer asks L2 for while its ring is full
  /// (fused_decode_args::l2_ahead; 0 = none, the default: the whole kernel measured within noise)
  int fused_l2_ahead = 0;

  /// Between decode graphs, no copy-engine ops: a step's plan (uploads ≤ 64 KB) is read by a kernel
  /// straight from the pinned staging slot, with the previous draw's ids laid over it in the same
  /// kernel (copy_draw), and the greedy argmax writes the tokens into pinned host memory itself (no
  /// copy back). Off: cudaMemcpyAsync for all three, as before session 9 (each hand-over between the
  /// compute and copy engines cost several µs a step; bench/NOTES.md, session 9).
  bool kernel_copies = true;

  /// Row-invariant numerics (bf16; speculative decoding turns it on): a step of up to 16 tokens
  /// computes every token's row with the very arithmetic a step of that token alone would use, so a
  /// verification pass of k + 1 tokens gives bit for bit the logits of k + 1 decode steps. bf16
  /// linears of ≤ 16 rows run on the GEMV (whatever small_gemm says: its reduction order over K does
  /// not depend on the number of rows), and attention splits keys into fixed runs of 256
  /// (batch_invariant_split_len) instead of a split count chosen from the batch, with the executor
  /// passing such steps one query row per sequence (caps().row_invariant_rows).
  bool batch_invariant = false;
};

/// Keys per flash-decoding split under batch_invariant.
inline constexpr int batch_invariant_split_len = 256;

/// Where a server keeps the GEMM tuning cache (cuda_backend_options::gemm_tuning_cache):
/// $CONVEYOR_CACHE_DIR/gemm-tuning.txt, else $XDG_CACHE_HOME/conveyor/gemm-tuning.txt, else
/// $HOME/.cache/conveyor/gemm-tuning.txt; empty (no file) where CONVEYOR_CACHE_DIR is "off" or no
/// home is known.
std::string default_gemm_tuning_cache();

/// Creates a backend on `options.device`: one stream, one cuBLAS handle, workspace allocated here.
/// Returns an error value (not an exception, not an abort) when there is no usable device, the
/// ordinal is out of range or the dtype is not bf16/f32.
result<std::unique_ptr<backend>> make_cuda_backend(const cuda_backend_options& options = {});

/// The cudaStream_t a CUDA backend runs its ops on (for NCCL collectives that must be ordered with
/// them); nullptr when `b` is not a CUDA backend.
void* cuda_stream_of(backend& b);

}  // namespace conveyor::kernels
