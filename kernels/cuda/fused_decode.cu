// The decoder layers of a one-token decode step as one persistent kernel: one block an SM, all of a
// step's layers in one launch. EXPERIMENTAL (cuda_backend_options::fused_decode, off): correct in
// its tests, slower than the op-by-op step so far (bench/NOTES.md, sessions 7, 8 and 10, has the
// measurements, the launch failure consume()'s waits had, the stream's own rate and what to try
// next).
//
// Why: at batch 1 every weight byte is read once, and the op-by-op step (6 launches a layer) lost
// ~20 µs a layer to kernel boundaries and to the short GEMVs' ramp-up and tail (bench/NOTES.md,
// sessions 4-6): the weight stream stopped at each boundary. Here it never stops. A producer warp
// a block copies the block's rows of every matrix of every layer, in order, into a ring of
// shared-memory stages with bulk copies (TMA), and never waits for anything but a free slot: weights
// do not depend on activations. The 8 computing warps follow the same schedule; between matrices
// they wait at a grid-wide barrier (global memory) for the activations the next matrix reads, while
// the producer keeps filling the ring with that matrix's rows.
//
// A layer, as the op-by-op path computes it (each intermediate rounded to bf16 where that path
// stores it, sums of squares in double as rmsnorm_bf16x8_kernel does):
//   every block: residual += delta; xs = rmsnorm(residual) * input_norm  (the residual lives in each
//                block's shared memory: every block computes the same values); attention blocks
//                start their cached keys' K/V loads (cp.async)
//   qkv rows of this block -> qkv_out                                    | barrier
//   attention units (kv head, split of <= attn_unit_keys keys): rope of q and the new k (the unit
//   holding the last key writes k and v to the cache), flash-decoding partials; the last split of a
//   KV head to finish combines its group's heads -> attn_out             | barrier
//   every block: xs = attn_out; o rows -> o_out                          | barrier
//   every block: residual += o_out; xs = rmsnorm(residual) * post_norm
//   (gate, up) row pairs -> act = silu(gate) * up                        | barrier
//   every block: xs = act; down rows -> delta                            | barrier (not after the last)
// A matrix is cut into 16 KB stages of whole rows (or gate/up pairs); block b streams stages b,
// b + grid, ... (share_of; session 10: with a contiguous 1/grid of the rows a block, the stream-only
// rate was 2.2 TB/s); each stage is consumed by one warp (stage number mod 8).
//
// sync[0] counts barrier arrivals (grid_sync has the variants); the blocks count their exits in
// sync[1]; the last one zeroes the words, so the next launch starts at zero. Every block must be
// resident at once: one block an SM (its shared memory allows no second), grid = SM count.
#include "fused_decode.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "device_types.cuh"
#include "mbarrier.cuh"

namespace conveyor::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int consumer_warps = 8;
constexpr int consumers = consumer_warps * 32;
constexpr int block_threads = consumers + 32;  // + the producer warp
constexpr int stage_bytes = 16 * 1024;
constexpr int max_stages = 12;
constexpr int max_group = 8;
constexpr int max_head_dim = 128;
constexpr int max_dpl = max_head_dim / 32;  // head dims a lane holds in attention
constexpr int barrier_bytes = 2 * max_stages * 8;

__device__ __forceinline__ float ldcg_bf(const bf16* p) {
  return __uint_as_float(static_cast<std::uint32_t>(__ldcg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

// The computing warps' barrier. Non-aligned `barrier.sync` after a __syncwarp: in grid_sync and
// attention_units, thread 0 spins alone inside an `if` before it, and `bar.sync` (= barrier.sync
// .aligned) is undefined for a warp whose threads reach it apart (the launches failed now and then).
__device__ __forceinline__ void consumer_sync() {
  __syncwarp();
  asm volatile("barrier.sync 1, %0;" ::"n"(consumers) : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// All computing threads of all blocks: every global write before it is visible to every read after.
// `index`: this launch's barrier number (1, 2, ...). sync[0] counts arrivals. Modes (the fastest
// is chosen by measurement, time_cuda_ops fused):
// 0: atomicAdd, then poll the count with ld.acquire until it reaches index × grid;
// 1: fence + red.add (no return), poll the count with relaxed loads and a short back-off, fence;
// 2: the last block to arrive (atom.add's return) publishes `index` in sync[2]; the others poll
//    that word, which no atomic touches while they poll.
__device__ void grid_sync(unsigned* sync, unsigned index, int mode) {
  consumer_sync();
  if (threadIdx.x == 0) {
    const unsigned target = index * gridDim.x;
    if (mode == 0) {
      __threadfence();
      atomicAdd(sync, 1u);
      while (load_acquire(sync) < target) {
      }
      __threadfence();
    } else if (mode == 1) {
      fence_acq_rel();
      asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(sync) : "memory");
      while (load_relaxed(sync) < target) __nanosleep(32);
      fence_acq_rel();
    } else {
      fence_acq_rel();
      if (atomicAdd(sync, 1u) == target - 1) {
        fence_acq_rel();  // acquire the others' writes before releasing them to the waiters
        asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(sync + 2), "r"(index) : "memory");
      } else {
        while (load_relaxed(sync + 2) < index) {
        }
      }
      fence_acq_rel();
    }
  }
  consumer_sync();
}


/// This block's share of a matrix (a unit is a row, or a gate/up pair of rows; `per_stage` units a
/// 16 KB stage). Contiguous: units [u0, u1), its stages in order. Interleaved
/// (fused_decode_args::interleave): the matrix is cut into stages of per_stage units and block b
/// takes stages b, b + grid, b + 2 grid, ..., so at any moment the blocks read neighbouring stages
/// (one window of ~2 MB GPU-wide) instead of 132 streams 1/132 of the matrix apart.
struct share {
  int u0 = 0, u1 = 0, per_stage = 1, stages = 0;
  bool interleaved = false;
  /// the k-th stage's first unit and its units
  __device__ int first(int k) const {
    return interleaved ? (k * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x)) * per_stage
                       : u0 + k * per_stage;
  }
  __device__ int count(int k) const { return min(per_stage, u1 - first(k)); }
};
__device__ __forceinline__ share share_of(int units, int unit_bytes, bool interleave) {
  share s;
  s.per_stage = stage_bytes / unit_bytes;
  s.interleaved = interleave;
  if (interleave) {
    const int total = (units + s.per_stage - 1) / s.per_stage;
    s.u0 = 0;
    s.u1 = units;
    s.stages = total > static_cast<int>(blockIdx.x) ? (total - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x : 0;
  } else {
    s.u0 = static_cast<int>(static_cast<long long>(blockIdx.x) * units / gridDim.x);
    s.u1 = static_cast<int>(static_cast<long long>(blockIdx.x + 1) * units / gridDim.x);
    s.stages = (s.u1 - s.u0 + s.per_stage - 1) / s.per_stage;
  }
  return s;
}

// The four matrices of a layer, in stream order: what the producer copies and the warps read.
struct matrix {
  const bf16* w;
  int units, cols;
  bool pair;  // gate_up: unit u = rows u and ffn + u
};
__device__ __forceinline__ matrix matrix_of(const fused_decode_args& a, const fused_layer& L, int m) {
  const int qkv_rows = (a.heads + 2 * a.kv_heads) * a.head_dim;
  switch (m) {
    case 0:
      return {L.qkv, qkv_rows, a.hidden, false};
    case 1:
      return {L.o, a.hidden, a.heads * a.head_dim, false};
    case 2:
      return {L.gate_up, a.ffn, a.hidden, true};
    default:
      return {L.down, a.hidden, a.ffn, false};
  }
}
__device__ __forceinline__ int unit_bytes(const matrix& m) { return m.cols * 2 * (m.pair ? 2 : 1); }

// A word of host-mapped memory the host reads while the kernel runs (fused_decode_args::progress).
__device__ __forceinline__ void publish(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Where a stage of the producer's stream comes from: matrix `mi` of layer `l`, the block's k-th stage
// of it. advance() steps to the next stage of the stream (matrices without rows for this block
// skipped, as consume()'s loops skip them).
struct stream_cursor {
  int l = 0, mi = 0, k = 0;
  matrix m{};
  share s{};
  __device__ bool valid(const fused_decode_args& a) const { return l < a.num_layers; }
  __device__ void settle(const fused_decode_args& a) {
    while (l < a.num_layers) {
      m = matrix_of(a, a.layer[l], mi);
      s = share_of(m.units, unit_bytes(m), a.interleave != 0);
      if (k < s.stages) return;
      k = 0;
      if (++mi == 4) {
        mi = 0;
        ++l;
      }
    }
  }
  // The matrix and the share are recomputed only when the cursor leaves a matrix: the producer's
  // per-stage work is in series with its copies (matrix_of's parameter loads and share_of's
  // divisions at every stage: stream-only 784 µs a launch in session 11, 754 with this; bench/NOTES.md
  // session 12).
  __device__ void advance(const fused_decode_args& a) {
    if (++k < s.stages) return;
    settle(a);
  }
  // The stage's rows: `cnt` units from unit u (a gate/up pair: rows u.. and ffn + u..).
  __device__ int first_unit() const { return s.first(k); }
  __device__ int units() const { return s.count(k); }
  // Bytes of each of the stage's regions (a pair stage has two: gate rows, then the same up rows),
  // and where region `up` (0 or 1) starts in global memory.
  __device__ unsigned region_bytes() const { return static_cast<unsigned>(units()) * static_cast<unsigned>(m.cols) * 2; }
  __device__ const unsigned char* region(const fused_decode_args& a, int up) const {
    return reinterpret_cast<const unsigned char*>(m.w + static_cast<std::size_t>(first_unit() + up * a.ffn) * m.cols);
  }
};

// The producer warp: every stage of every matrix of every layer, as soon as its slot is free. Lane 0
// waits for the slot and arms its full barrier; lanes 0 .. copy_split - 1 then each copy a piece of
// the stage (one bulk copy a lane and region: the GEMV's producer issues 16 row copies a stage).
__device__ void produce(const fused_decode_args& a, unsigned char* ring, std::uint64_t* full, std::uint64_t* empty,
                        int nstages, int lane) {
  const int split = max(1, min(32, a.copy_split));
  stream_cursor c;
  c.settle(a);
  // l2_ahead: a second cursor walks up to l2_ahead stages past the one waited for; each stage it
  // passes while the ring is full is asked of L2, so the copy finds it there when its slot frees.
  stream_cursor pf = c;
  unsigned pf_seq = 0;
  // The next stage after `seq` within l2_ahead asked of L2; false when there is none left to ask.
  auto prefetch_next = [&](unsigned seq) {
    for (; pf_seq <= seq && pf.valid(a); ++pf_seq) pf.advance(a);  // stages already copied need none
    if (pf_seq > seq + static_cast<unsigned>(a.l2_ahead) || !pf.valid(a)) return false;
    for (int r = 0; r < (pf.m.pair ? 2 : 1); ++r) bulk_prefetch_l2(pf.region(a, r), pf.region_bytes());
    pf.advance(a);
    ++pf_seq;
    return true;
  };
  for (unsigned seq = 0; c.valid(a); ++seq, c.advance(a)) {
    const int slot = static_cast<int>(seq % nstages);
    const unsigned use = seq / nstages;
    const unsigned bytes = c.region_bytes();
    if (lane == 0) {
      if (a.progress != nullptr) publish(a.progress + gridDim.x + blockIdx.x, seq);
      if (use > 0) {
        while (a.l2_ahead > 0 && !mbar_test(empty + slot, (use - 1) & 1) && prefetch_next(seq)) {
        }
        mbar_wait(empty + slot, (use - 1) & 1);
      }
      mbar_expect_tx(full + slot, bytes * (c.m.pair ? 2 : 1));
    }
    __syncwarp();
    if (lane < split) {
      // Piece `lane` of each region, cut at 16-byte multiples (rows are, so bytes is).
      const unsigned p0 = bytes / 16 * lane / split * 16, p1 = bytes / 16 * (lane + 1) / split * 16;
      if (p1 > p0) {
        unsigned char* dst = ring + static_cast<std::size_t>(slot) * stage_bytes;
        for (int r = 0; r < (c.m.pair ? 2 : 1); ++r) bulk_copy(dst + r * bytes + p0, c.region(a, r) + p0, p1 - p0, full + slot);
      }
    }
  }
}

// Dot products of two rows of a stage with x (shared memory, `cols` bf16 each), summed over the warp.
__device__ __forceinline__ void dot2(const bf16* ra, const bf16* rb, const bf16* x, int cols, int lane, float& sa,
                                     float& sb) {
  float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
  const uint4* pa = reinterpret_cast<const uint4*>(ra);
  const uint4* pb = reinterpret_cast<const uint4*>(rb);
  const uint4* px = reinterpret_cast<const uint4*>(x);
  for (int c = lane; c < cols / 8; c += 32) {
    const uint4 xv = px[c], av = pa[c], bv = pb[c];
    const std::uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
    const std::uint32_t as[4] = {av.x, av.y, av.z, av.w};
    const std::uint32_t bs[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      a0 = fmaf(bf_lo(as[e]), bf_lo(xs[e]), a0);
      a1 = fmaf(bf_hi(as[e]), bf_hi(xs[e]), a1);
      b0 = fmaf(bf_lo(bs[e]), bf_lo(xs[e]), b0);
      b1 = fmaf(bf_hi(bs[e]), bf_hi(xs[e]), b1);
    }
  }
  sa = warp_sum(a0 + a1);
  sb = warp_sum(b0 + b1);
}

// The computing warps' side of one matrix: the stages this warp owns (stage number mod 8), each
// unit's sums handed to epi(unit, sum_a, sum_b) on lane 0 (sum_b: the up row of a pair).
template <class Epi>
__device__ void consume(const matrix& m, const bf16* xs, unsigned& seq, const unsigned char* ring, std::uint64_t* full,
                        std::uint64_t* empty, int nstages, int warp, int lane, bool interleave, Epi epi) {
  const share s = share_of(m.units, unit_bytes(m), interleave);
  for (int k = 0; k < s.stages; ++k, ++seq) {
    if (static_cast<int>(seq % consumer_warps) != warp) continue;
    const int slot = static_cast<int>(seq % nstages);
    const unsigned use = seq / nstages;
    // The slot's previous use (seq - nstages) belongs to another warp (11 stages, 8 warps), and its
    // bytes may still be landing (bulk copies complete out of order): full is then one phase behind,
    // where a wait for parity use & 1 passes at once. Waiting first until that use's warp has released
    // the slot (empty is at most one phase behind: the producer issued seq - 8, which this warp read,
    // after seq - nstages) makes full this use's phase or the next, never the one before.
    if (use > 0) mbar_wait(empty + slot, (use - 1) & 1);
    mbar_wait(full + slot, use & 1);
    const int u = s.first(k), cnt = s.count(k);
    const bf16* st = reinterpret_cast<const bf16*>(ring + static_cast<std::size_t>(slot) * stage_bytes);
    if (m.pair) {
      for (int j = 0; j < cnt; ++j) {
        float g, up;
        dot2(st + static_cast<std::size_t>(j) * m.cols, st + static_cast<std::size_t>(cnt + j) * m.cols, xs, m.cols,
             lane, g, up);
        if (lane == 0) epi(u + j, g, up);
      }
    } else {
      for (int j = 0; j < cnt; j += 2) {
        const int jb = min(j + 1, cnt - 1);
        float sa, sb;
        dot2(st + static_cast<std::size_t>(j) * m.cols, st + static_cast<std::size_t>(jb) * m.cols, xs, m.cols, lane,
             sa, sb);
        if (lane == 0) {
          epi(u + j, sa, 0.0f);
          if (jb != j) epi(u + jb, sb, 0.0f);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + slot);  // this warp has read the slot
  }
}

// fused_decode_args::stream_only: the computing warps' side of the whole stream without arithmetic
// or barriers (each stage waited for and handed back, as consume() does): the stream's own rate.
__device__ void release_stream(const fused_decode_args& a, std::uint64_t* full, std::uint64_t* empty, int nstages,
                               int warp, int lane) {
  stream_cursor c;
  c.settle(a);
  for (unsigned seq = 0; c.valid(a); ++seq, c.advance(a)) {
    if (static_cast<int>(seq % consumer_warps) != warp) continue;
    const int slot = static_cast<int>(seq % nstages);
    const unsigned use = seq / nstages;
    if (use > 0) mbar_wait(empty + slot, (use - 1) & 1);
    mbar_wait(full + slot, use & 1);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + slot);
  }
}

// residual (shared, bf16) += delta (global, when given); xs = rmsnorm(residual) * w, as
// rmsnorm_bf16x8_kernel rounds it.
__device__ void norm_into(bf16* res, const bf16* delta, int hidden, const float* w, float eps, bf16* xs,
                          double* red) {
  const int tid = threadIdx.x, chunks = hidden / 8;
  double ss = 0.0;
  for (int c = tid; c < chunks; c += consumers) {
    uint4 v = reinterpret_cast<uint4*>(res)[c];
    std::uint32_t* p = reinterpret_cast<std::uint32_t*>(&v);
    if (delta != nullptr) {
      const uint4 d = __ldcg(reinterpret_cast<const uint4*>(delta) + c);
      const std::uint32_t* dp = reinterpret_cast<const std::uint32_t*>(&d);
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = pack_bf16x2(bf_lo(p[e]) + bf_lo(dp[e]), bf_hi(p[e]) + bf_hi(dp[e]));
      reinterpret_cast<uint4*>(res)[c] = v;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const double x0 = bf_lo(p[e]), x1 = bf_hi(p[e]);
      ss += x0 * x0 + x1 * x1;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (tid % 32 == 0) red[tid / 32] = ss;
  consumer_sync();
  double total = 0.0;
#pragma unroll
  for (int i = 0; i < consumer_warps; ++i) total += red[i];
  const float inv = 1.0f / sqrtf(static_cast<float>(total / hidden) + eps);
  for (int c = tid; c < chunks; c += consumers) {
    uint4 v = reinterpret_cast<const uint4*>(res)[c];
    std::uint32_t* p = reinterpret_cast<std::uint32_t*>(&v);
    const float4 w0 = reinterpret_cast<const float4*>(w)[2 * c], w1 = reinterpret_cast<const float4*>(w)[2 * c + 1];
    const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = pack_bf16x2(wv[2 * e] * (bf_lo(p[e]) * inv), wv[2 * e + 1] * (bf_hi(p[e]) * inv));
    reinterpret_cast<uint4*>(xs)[c] = v;
  }
  consumer_sync();  // xs complete; red may be reused
}

// Shared memory for the K and V rows a unit prefetches (cp.async) while qkv streams.
constexpr int kv_prefetch_bytes = 16 * 1024;
// Keys a unit prefetches: 64, or what kv_prefetch_bytes holds (K and V rows).
__host__ __device__ constexpr int prefetch_keys(int hd) {
  return kv_prefetch_bytes / (4 * hd) < 64 ? kv_prefetch_bytes / (4 * hd) : 64;
}
// Key splits of the attention: at most unit_keys (and prefetch_keys) a unit where the blocks a KV
// head gets allow. A unit's keys are a dependent chain per warp (a warp sum and two exps a key and
// query head), so fewer keys a unit on more blocks shorten the phase every block waits for.
__device__ __forceinline__ int splits_for(int span, int blocks, int kv_heads, int hd, int unit_keys) {
  const int cap = max(1, min(prefetch_keys(hd), unit_keys));
  return max(1, min((span + cap - 1) / cap, blocks / kv_heads));
}

// The keys of attention unit `unit` at this step (window and splits as attention_units uses them).
struct unit_keys {
  int units, kvh, sp, S, p0, p1, ctx;
};
__device__ __forceinline__ unit_keys keys_of(const fused_decode_args& a, const fused_layer& L, int unit) {
  unit_keys k;
  k.ctx = a.ctx_len[0];
  const int start = L.window > 0 ? max(0, k.ctx - L.window) : 0;
  const int span = k.ctx - start;
  k.S = splits_for(span, gridDim.x, a.kv_heads, a.head_dim, a.attn_unit_keys);
  k.units = a.kv_heads * k.S;
  k.kvh = unit / k.S;
  k.sp = unit % k.S;
  k.p0 = start + static_cast<int>(static_cast<long long>(k.sp) * span / k.S);
  k.p1 = start + static_cast<int>(static_cast<long long>(k.sp + 1) * span / k.S);
  return k;
}
__device__ __forceinline__ std::size_t key_row(const fused_decode_args& a, int p, int kvh) {
  const std::size_t slot = static_cast<std::size_t>(a.block_table[p / a.block_size]) * a.block_size + p % a.block_size;
  return (slot * a.kv_heads + kvh) * a.head_dim;
}

// This block's first attention unit of layer L: its cached keys' K and V rows (not the new key's,
// which this launch writes) into kvp (K rows, then V rows, prefetch_keys(hd) apart), by cp.async. The
// weights of qkv stream meanwhile; attention_units waits for them.
__device__ void prefetch_kv(const fused_decode_args& a, const fused_layer& L, bf16* kvp) {
  const unit_keys k = keys_of(a, L, blockIdx.x);
  if (!a.prefetch || blockIdx.x >= k.units) return;
  const int hd = a.head_dim, cap = prefetch_keys(hd), cpr = hd / 8;
  const int n = min(k.p1 - k.p0, cap) - (k.p0 + min(k.p1 - k.p0, cap) > k.ctx - 1 ? 1 : 0);
  for (int c = threadIdx.x; c < n * 2 * cpr; c += consumers) {
    const int i = c / (2 * cpr), r = c % (2 * cpr), kv = r / cpr, ch = r % cpr;
    const bf16* src = (kv ? L.v_cache : L.k_cache) + key_row(a, k.p0 + i, k.kvh) + ch * 8;
    bf16* dst = kvp + (static_cast<std::size_t>(kv) * cap + i) * hd + ch * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Shared-memory floats of the attention scratch.
__host__ __device__ constexpr int attention_floats(int group, int hd) {
  return hd + group * hd + 2 * hd + consumer_warps * group * 2 + consumer_warps * group * hd;
}

// The attention units of this block (unit = (KV head, split of the keys)): each writes, per query head
// of its group, the unnormalised (max, sum, acc[hd]) of its keys to partials[head][split]; the last
// unit of a KV head to finish (an arrival count a head) combines its group's splits into attn_out.
// cs: (cos, sin) × rope scaling per pair of dims at this step's position (shared memory).
__device__ void attention_units(const fused_decode_args& a, const fused_layer& L, const float2* cs, float* att,
                                const bf16* kvp, int* flag, int warp, int lane) {
  const int hd = a.head_dim, half = hd / 2, G = a.heads / a.kv_heads, cap = prefetch_keys(hd);
  const int S = keys_of(a, L, 0).S, ctx = a.ctx_len[0];
  asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's prefetched rows (prefetch_kv)
  float* qs = att;                                // [G][hd]
  float* kn = qs + G * hd;                        // [hd] the new key, roped
  float* vn = kn + hd;                            // [hd]
  float* ml = vn + hd;                            // [warp][G][2]
  float* accs = ml + consumer_warps * G * 2;      // [warp][G][hd]
  const int dpl = (hd + 31) / 32;
  for (int unit = blockIdx.x; unit < a.kv_heads * S; unit += gridDim.x) {
    const unit_keys uk = keys_of(a, L, unit);
    const int kvh = uk.kvh, sp = uk.sp, p0 = uk.p0, p1 = uk.p1;
    const bool prefetched = a.prefetch && unit == static_cast<int>(blockIdx.x);  // prefetch_kv's unit
    // rope_kv's work for this KV head and its query heads (same angles and rounding).
    for (int idx = threadIdx.x; idx < (G + 1) * half; idx += consumers) {
      const int g = idx / half, i = idx % half;
      const bf16* x = a.qkv_out + (g < G ? kvh * G + g : a.heads + kvh) * hd;
      const float xa = ldcg_bf(x + i), xb = ldcg_bf(x + i + half);
      const float2 c = cs[i];
      const bf16 ra = __float2bfloat16_rn(xa * c.x - xb * c.y), rb = __float2bfloat16_rn(xb * c.x + xa * c.y);
      if (g < G) {
        qs[g * hd + i] = __bfloat162float(ra);
        qs[g * hd + i + half] = __bfloat162float(rb);
      } else {
        const bf16* v = a.qkv_out + (a.heads + a.kv_heads + kvh) * hd;
        const float va = ldcg_bf(v + i), vb = ldcg_bf(v + i + half);
        kn[i] = __bfloat162float(ra);
        kn[i + half] = __bfloat162float(rb);
        vn[i] = va;
        vn[i + half] = vb;
        if (sp == S - 1) {  // the split holding the last key stores the new key and value
          const std::size_t slot = static_cast<std::size_t>(a.slots[0]) * a.kv_heads + kvh;
          bf16* kd = L.k_cache + slot * hd;
          bf16* vd = L.v_cache + slot * hd;
          kd[i] = ra;
          kd[i + half] = rb;
          vd[i] = __float2bfloat16_rn(va);
          vd[i + half] = __float2bfloat16_rn(vb);
        }
      }
    }
    consumer_sync();
    // One key at a time (K and V come from shared memory, prefetched): the query stays in shared
    // memory too, so the registers hold only the accumulators (with every key batched and q in
    // registers the kernel spilled, and its local memory had almost no L1 left to live in).
    float acc[max_group][max_dpl], m[max_group], l[max_group];
#pragma unroll
    for (int g = 0; g < max_group; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < max_dpl; ++j) acc[g][j] = 0.0f;
    }
    for (int p = p0 + warp; p < p1; p += consumer_warps) {
      const bool new_key = p == ctx - 1;
      const bf16* kr = nullptr;
      const bf16* vr = nullptr;
      if (!new_key) {
        if (prefetched && p - p0 < cap) {
          kr = kvp + static_cast<std::size_t>(p - p0) * hd;
          vr = kvp + static_cast<std::size_t>(cap + p - p0) * hd;
        } else {
          kr = L.k_cache + key_row(a, p, kvh);
          vr = L.v_cache + key_row(a, p, kvh);
        }
      }
      float kd[max_dpl], vd[max_dpl];
#pragma unroll
      for (int j = 0; j < max_dpl; ++j) {
        const int d = lane + 32 * j;
        const bool in = j < dpl && d < hd;
        kd[j] = !in ? 0.0f : (new_key ? kn[d] : __bfloat162float(kr[d]));
        vd[j] = !in ? 0.0f : (new_key ? vn[d] : __bfloat162float(vr[d]));
      }
#pragma unroll
      for (int g = 0; g < max_group; ++g) {
        if (g >= G) break;
        float sc = 0.0f;
#pragma unroll
        for (int j = 0; j < max_dpl; ++j) {
          const int d = lane + 32 * j;
          if (j < dpl && d < hd) sc = fmaf(qs[g * hd + d], kd[j], sc);
        }
        sc = warp_sum(sc) * a.scale;
        const float mn = fmaxf(m[g], sc);
        const float corr = expf(m[g] - mn), pe = expf(sc - mn);
        l[g] = l[g] * corr + pe;
#pragma unroll
        for (int j = 0; j < max_dpl; ++j) acc[g][j] = fmaf(pe, vd[j], acc[g][j] * corr);
        m[g] = mn;
      }
    }
#pragma unroll
    for (int g = 0; g < max_group; ++g) {
      if (g >= G) break;
      if (lane == 0) {
        ml[(warp * G + g) * 2] = m[g];
        ml[(warp * G + g) * 2 + 1] = l[g];
      }
#pragma unroll
      for (int j = 0; j < max_dpl; ++j) {
        const int d = lane + 32 * j;
        if (j < dpl && d < hd) accs[(warp * G + g) * hd + d] = acc[g][j];
      }
    }
    consumer_sync();
    for (int idx = threadIdx.x; idx < G * hd; idx += consumers) {
      const int g = idx / hd, d = idx % hd;
      float mx = -INFINITY;
      for (int w = 0; w < consumer_warps; ++w) mx = fmaxf(mx, ml[(w * G + g) * 2]);
      float A = 0.0f, Ls = 0.0f;
      for (int w = 0; w < consumer_warps; ++w) {
        const float mw = ml[(w * G + g) * 2];
        if (mw == -INFINITY) continue;  // a warp without keys
        const float e = expf(mw - mx);
        A += accs[(w * G + g) * hd + d] * e;
        Ls += ml[(w * G + g) * 2 + 1] * e;
      }
      float* P = a.partials + (static_cast<std::size_t>(kvh * G + g) * S + sp) * (hd + 2);
      P[d] = A;
      if (d == 0) {
        P[hd] = mx;
        P[hd + 1] = Ls;
      }
    }
    consumer_sync();
    if (threadIdx.x == 0) {
      __threadfence();
      const unsigned before = atomicAdd(a.head_sync + kvh, 1u);  // after the fence: a release
      *flag = before == static_cast<unsigned>(S - 1);
      if (*flag) {
        a.head_sync[kvh] = 0;  // every split of this head has arrived; the next layer counts again
        __threadfence();
      }
    }
    consumer_sync();
    if (*flag) {  // the last split of this KV head: its group's output
      for (int idx = threadIdx.x; idx < G * hd; idx += consumers) {
        const int g = idx / hd, d = idx % hd;
        const float* P = a.partials + static_cast<std::size_t>(kvh * G + g) * S * (hd + 2);
        float mx = -INFINITY, A = 0.0f, Ls = 0.0f;
        for (int s0 = 0; s0 < S; s0 += 16) {  // all of a chunk's loads at once
          float mv[16], lv[16], av[16];
#pragma unroll
          for (int s = 0; s < 16; ++s) {
            const float* q = P + (s0 + s) * (hd + 2);
            mv[s] = s0 + s < S ? __ldcg(q + hd) : -INFINITY;
            lv[s] = s0 + s < S ? __ldcg(q + hd + 1) : 0.0f;
            av[s] = s0 + s < S ? __ldcg(q + d) : 0.0f;
          }
          float cm = mx;
#pragma unroll
          for (int s = 0; s < 16; ++s) cm = fmaxf(cm, mv[s]);
          const float r = mx == -INFINITY ? 0.0f : expf(mx - cm);
          A *= r;
          Ls *= r;
#pragma unroll
          for (int s = 0; s < 16; ++s) {
            const float e = mv[s] == -INFINITY ? 0.0f : expf(mv[s] - cm);
            A += av[s] * e;
            Ls += lv[s] * e;
          }
          mx = cm;
        }
        a.attn_out[(kvh * G + g) * hd + d] = __float2bfloat16_rn(A / Ls);
      }
    }
    consumer_sync();  // the scratch and the flag are reused by the next unit
  }
}

// dst (shared) = src (global, written by other blocks before the last barrier), `count` bf16
// (a multiple of 8): every thread's loads first, then its stores.
__device__ void load_vector(bf16* dst, const bf16* src, int count) {
  constexpr int U = 4;
  const int chunks = count / 8;
  for (int base = threadIdx.x; base < chunks; base += U * consumers) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + u * consumers;
      if (c < chunks) v[u] = __ldcg(reinterpret_cast<const uint4*>(src) + c);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + u * consumers;
      if (c < chunks) reinterpret_cast<uint4*>(dst)[c] = v[u];
    }
  }
  consumer_sync();
}

__device__ __forceinline__ float bias_at(const float* b, int i) { return b != nullptr ? b[i] : 0.0f; }


// A block's shared memory, as fused_decode_kernel lays it out.
struct block_smem {
  std::uint64_t* full;
  std::uint64_t* empty;
  unsigned char* ring;
  int nstages;
  bf16* xs;
  bf16* res;
  float2* cs;
  float* att;
  bf16* kvp;
  double* red;
  int* flag;
};

// The computing warps: every layer, phase by phase.
__device__ void compute_layers(const fused_decode_args& a, const block_smem& sm, int warp, int lane) {
  std::uint64_t* full = sm.full;
  std::uint64_t* empty = sm.empty;
  const unsigned char* ring = sm.ring;
  const int nstages = sm.nstages;
  bf16* xs = sm.xs;
  bf16* res = sm.res;
  float2* cs = sm.cs;
  float* att = sm.att;
  bf16* kvp = sm.kvp;
  double* red = sm.red;
  grid_dep_wait();
  grid_dep_trigger();

  if (a.stream_only) {
    release_stream(a, full, empty, nstages, warp, lane);
    return;
  }
  load_vector(res, a.residual, a.hidden);
  // Every layer rotates by the same angles: (cos, sin) once, as rope_kv computes them.
  for (int i = threadIdx.x; i < a.head_dim / 2; i += consumers) {
    const float angle = static_cast<float>(a.positions[0]) * a.inv_freq[i];
    double sn, cn;
    sincos(static_cast<double>(angle), &sn, &cn);
    cs[i] = make_float2(static_cast<float>(cn) * a.rope_scaling, static_cast<float>(sn) * a.rope_scaling);
  }
  consumer_sync();
  unsigned seq = 0, barriers = 0;
  auto sync_grid = [&] {
    ++barriers;
    grid_sync(a.sync, barriers, a.barrier_mode);
  };
  for (int l = 0; l < a.num_layers; ++l) {
    const fused_layer& L = a.layer[l];
    unsigned long long* tr =
        a.trace != nullptr ? a.trace + (static_cast<std::size_t>(blockIdx.x) * a.num_layers + l) * fused_trace_points
                           : nullptr;
    int point = 0;
    auto stamp = [&] {
      if (tr != nullptr && threadIdx.x == 0) tr[point] = global_ns();
      if (a.progress != nullptr && threadIdx.x == 0) {
        publish(a.progress + blockIdx.x, static_cast<unsigned>(l * fused_trace_points + point + 1));
      }
      ++point;
    };
    stamp();
    prefetch_kv(a, L, kvp);
    norm_into(res, (l > 0 || a.first_adds_delta) ? a.delta : nullptr, a.hidden, L.input_norm, a.eps, xs, red);
    stamp();
    consume(matrix_of(a, L, 0), xs, seq, ring, full, empty, nstages, warp, lane, a.interleave != 0, [&](int r, float s, float) {
      a.qkv_out[r] = __float2bfloat16_rn(s + bias_at(L.qkv_bias, r));
    });
    stamp();
    sync_grid();
    stamp();
    attention_units(a, L, cs, att, kvp, sm.flag, warp, lane);
    stamp();
    sync_grid();
    stamp();
    load_vector(xs, a.attn_out, a.heads * a.head_dim);
    stamp();
    consume(matrix_of(a, L, 1), xs, seq, ring, full, empty, nstages, warp, lane, a.interleave != 0, [&](int r, float s, float) {
      a.o_out[r] = __float2bfloat16_rn(s + bias_at(L.o_bias, r));
    });
    stamp();
    sync_grid();
    stamp();
    norm_into(res, a.o_out, a.hidden, L.post_norm, a.eps, xs, red);
    stamp();
    consume(matrix_of(a, L, 2), xs, seq, ring, full, empty, nstages, warp, lane, a.interleave != 0, [&](int u, float sg, float su) {
      const float g = __bfloat162float(__float2bfloat16_rn(sg + bias_at(L.gate_up_bias, u)));
      const float up = __bfloat162float(__float2bfloat16_rn(su + bias_at(L.gate_up_bias, a.ffn + u)));
      a.act[u] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * up);
    });
    stamp();
    sync_grid();
    stamp();
    load_vector(xs, a.act, a.ffn);
    stamp();
    consume(matrix_of(a, L, 3), xs, seq, ring, full, empty, nstages, warp, lane, a.interleave != 0, [&](int r, float s, float) {
      a.delta[r] = __float2bfloat16_rn(s + bias_at(L.down_bias, r));
    });
    stamp();
    if (l + 1 < a.num_layers) sync_grid();
    stamp();
  }
  if (blockIdx.x == 0) {
    for (int c = threadIdx.x; c < a.hidden / 8; c += consumers) {
      reinterpret_cast<uint4*>(a.residual)[c] = reinterpret_cast<const uint4*>(res)[c];
    }
  }
  consumer_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) {  // every block is past its last barrier
      a.sync[0] = 0;
      a.sync[1] = 0;
      a.sync[2] = 0;
      __threadfence();
    }
  }
}

__global__ void __launch_bounds__(block_threads, 1) fused_decode_kernel(const __grid_constant__ fused_decode_args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ double red[consumer_warps];
  __shared__ int flag;
  const int nstages = a.ring_stages;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + max_stages;
  unsigned char* ring = smem + barrier_bytes;
  const int xs_width = max(max(a.hidden, a.ffn), a.heads * a.head_dim);
  bf16* xs = reinterpret_cast<bf16*>(ring + static_cast<std::size_t>(nstages) * stage_bytes);
  bf16* res = xs + ((xs_width + 63) / 64) * 64;
  float2* cs = reinterpret_cast<float2*>(res + ((a.hidden + 63) / 64) * 64);  // [head_dim / 2]
  float* att = reinterpret_cast<float*>(cs + a.head_dim / 2);
  bf16* kvp = reinterpret_cast<bf16*>(att + attention_floats(a.heads / a.kv_heads, a.head_dim) - a.head_dim);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < nstages; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == consumer_warps) {
    // Weights never depend on the previous kernel: no griddepcontrol.wait before streaming them.
    produce(a, ring, full, empty, nstages, lane);
    __syncwarp();
  } else {
    compute_layers(a, block_smem{full, empty, ring, nstages, xs, res, cs, att, kvp, red, &flag}, warp, lane);
  }
  // Every stage has been consumed and every copy has landed: the barriers are retired before the
  // shared memory goes to the next block on this SM.
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < nstages; ++i) {
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(full + i)) : "memory");
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(empty + i)) : "memory");
    }
  }
}

std::size_t dynamic_smem(const fused_decode_args& a, int nstages) {
  const int xs_width = std::max(std::max(a.hidden, a.ffn), a.heads * a.head_dim);
  return barrier_bytes + static_cast<std::size_t>(nstages) * stage_bytes + ((xs_width + 63) / 64) * 64 * 2 +
         ((a.hidden + 63) / 64) * 64 * 2 + attention_floats(a.heads / a.kv_heads, a.head_dim) * sizeof(float) +
         kv_prefetch_bytes;
  // (attention_floats counts the (cos, sin) table's head_dim floats)
}

int max_dynamic_smem() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncAttributes fa{};
    cudaFuncGetAttributes(&fa, fused_decode_kernel);
    const int limit = optin - static_cast<int>(fa.sharedSizeBytes);
    cudaFuncSetAttribute(fused_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
    return limit;
  }();
  return bytes;
}

}  // namespace

bool fused_decode_supported(int hidden, int ffn, int heads, int kv_heads, int head_dim) {
  if (hidden <= 0 || ffn <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0) return false;
  if (hidden % 8 != 0 || ffn % 8 != 0 || (heads * head_dim) % 8 != 0) return false;
  // A stage holds at least one unit: a gate/up pair of hidden-wide rows, an o row, a down row.
  if (hidden * 4 > stage_bytes || ffn * 2 > stage_bytes || heads * head_dim * 2 > stage_bytes) return false;
  if (heads % kv_heads != 0 || heads / kv_heads > max_group || kv_heads > fused_max_kv_heads) return false;
  if (head_dim % 8 != 0 || head_dim > max_head_dim) return false;  // 16-byte rows for cp.async
  fused_decode_args probe;
  probe.hidden = hidden;
  probe.ffn = ffn;
  probe.heads = heads;
  probe.kv_heads = kv_heads;
  probe.head_dim = head_dim;
  return static_cast<int>(dynamic_smem(probe, consumer_warps)) <= max_dynamic_smem();
}

std::size_t fused_decode_partial_floats(int heads, int kv_heads, int head_dim, int blocks) {
  const int max_splits = std::max(1, blocks / kv_heads);
  return static_cast<std::size_t>(heads) * max_splits * (head_dim + 2);
}

int fused_decode_blocks(int sms) {
  max_dynamic_smem();  // raises the kernel's shared-memory limit, without which no launch fits
  int per_sm = 0;
  // The largest launch leaves room for no second block an SM; any launch needs one to fit.
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_decode_kernel, block_threads,
                                                    barrier_bytes + 4 * stage_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return per_sm >= 1 ? sms : 0;
}

void launch_fused_decode(const fused_decode_args& args, int blocks, cudaStream_t s, bool pdl, bool cooperative) {
  fused_decode_args a = args;
  const int limit = max_dynamic_smem();
  a.ring_stages = max_stages;
  // At least consumer_warps stages: consume()'s waits are exact only while a warp's previous stage
  // (seq - 8) is issued after the slot's previous use (seq - nstages).
  while (a.ring_stages > consumer_warps && static_cast<int>(dynamic_smem(a, a.ring_stages)) > limit) {
    --a.ring_stages;
  }
  launch_extras x;
  x.pdl = pdl && !cooperative;
  x.cooperative = cooperative;
  launch_kx(x, fused_decode_kernel, dim3(blocks), dim3(block_threads), dynamic_smem(a, a.ring_stages),
            s, a);
  CONVEYOR_CUDA_LAUNCHED("fused decode");
}

}  // namespace conveyor::kernels::cuda
