// Small-batch linear (bf16, n ≤ 16 tokens) on tensor cores, with the op before it folded into its
// load. Decode at small batch is all skinny GEMMs: cuBLAS runs them well under the copy bandwidth and
// each op costs a launch. Here a block owns 16 output rows and all of K; its warps split K into
// 32-wide chunks, stream their rows with 16-byte loads and feed mma.sync m16n8k16 (W as A, up to 8
// tokens as B's columns per n-tile), and the block sums the warps' partial tiles in shared memory.
//
// The k order inside each mma is permuted: lane q's 8 contiguous k (one 16-byte load) go to logical k
// 2q, 2q+1, 2q+8, 2q+9 of two mmas. A and B use the same permutation, so every dot product is the same
// sum; this keeps both operands as plain coalesced 16-byte loads.
//
// In a grid of one wave x is staged in shared memory by all threads at once (loading it chunk by chunk
// inside the weight loop exposed one L2 round trip per chunk: o_proj and down_proj ran at 1.3-1.5
// TB/s).
//
// Prologues (the op the engine issued before this linear, done here instead of in its own launch):
// - norm: x = rmsnorm(residual [+ delta]) * w. Every block normalises the n rows into shared memory.
//   With delta, residual += delta must happen once: the last block to finish reading writes it back
//   (an arrival counter), and writes the normalised rows too, so memory ends as the op-by-op path
//   leaves it.
// - silu: x = silu(gate) * up from gate_up rows, computed as the chunks are loaded; block 0 writes x.
// Rounding matches the op-by-op path (each intermediate rounded to bf16 where that path stores it).
//
// Weights reach the warps one of two ways:
// - registers (tma off): each warp loads U chunks, waits for them, multiplies, loads the next U;
//   at most ~128 KB in flight an SM, which held gate_up at ~3.4 TB/s.
// - shared-memory stages (tma, the default): a producer warp copies 16-row k-slices with
//   cp.async.bulk into a ring, an mbarrier counts their bytes, the 8 computing warps read their
//   chunks from the stage and hand it back; the ring's bytes are in flight, not the warps' registers.
//   Slices are multiples of 256 columns, so warp w sums chunks ≡ w (mod 8) in increasing order as the
//   8-warp register kernel does: the same bits, for every n.
//
// Programmatic dependent launch: weights never depend on the previous kernel, so a block loads its
// first weights (registers) or the producer fills the ring (tma) before griddepcontrol.wait, and the
// weight stream starts while the previous kernel drains. The next kernel is let launch at this one's
// start, or with late_trigger only after the prologue: what it requests early (attention's K/V and
// o_proj's weights after qkv) otherwise queues in front of the prologue's few L2 round trips, which
// took 3-6 µs behind such a flood (bench/NOTES.md, session 17).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "device_types.cuh"
#include "linear_epilogue.cuh"
#include "mbarrier.cuh"
#include "launch.hpp"

namespace conveyor::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

// Weights are read once per step: stream them past L1 (which keeps x).
__device__ __forceinline__ uint4 load_stream(const uint4* p) { return __ldcs(p); }


constexpr int max_tokens = 16;

// Diagnostics (gemv_args::stamps, time_cuda_ops gemv-stamps): where a block's time goes, as
// %globaltimer nanoseconds. Slots of a block: 0 entry, 1 producer's last stage issued, 2 past
// griddepcontrol.wait, 3 prologue done, 4 exit, 5 the SM's id, 6 the first stage consumed by
// warp 0, 8 + u (u < 56) stage u seen full by warp 0, 64 + u (u < 64) stage u issued.

template <int NT, int WARPS, int PRO, bool TMA>
__global__ void __launch_bounds__(WARPS * 32 + (TMA ? 32 : 0)) gemv_kernel(gemv_args a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ float red[WARPS][NT][4][32];
  __shared__ double ss_part[WARPS][NT * 8];
  __shared__ float inv_s[NT * 8];
  __shared__ int last_s;
  __shared__ __align__(8) std::uint64_t go_bar;  // pre_wait_stages: the prologue is done

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int cols = a.cols, n = a.n;
  unsigned long long* const stamp_at = a.stamps == nullptr ? nullptr : a.stamps + blockIdx.x * gemv_stamp_slots;
  if (stamp_at != nullptr && threadIdx.x == 0) {
    stamp_at[0] = global_ns();
    stamp_at[5] = smid();
  }
  constexpr int threads = WARPS * 32;  // the computing threads (TMA: plus one producer warp)
  // Barrier of the computing threads (with TMA the producer warp runs on its own).
  auto sync = [] {
    if constexpr (TMA) {
      asm volatile("bar.sync 1, %0;" ::"n"(threads) : "memory");
    } else {
      __syncthreads();
    }
  };
  // Dynamic shared memory: [TMA: full and empty barriers, 128 B][x staged][TMA: weight stages].
  unsigned char* dyn = smem_raw + (TMA ? 128 : 0);
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem_raw);
  std::uint64_t* empty = full + 8;
  if constexpr (TMA) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < a.tma_stages; ++i) {
        mbar_init(full + i, 1);
        mbar_init(empty + i, WARPS);
      }
      mbar_init(&go_bar, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  // A block serves tiles blockIdx.x, + gridDim.x, ... (more than one where the grid is capped at the
  // blocks that fit at once): the next tile's first weights load while this one's are reduced.
  const int tiles = gemv_tiles(a.rows);
  int tile = blockIdx.x;
  const uint4* wa = nullptr;
  const uint4* wb = nullptr;
  auto set_rows = [&](int t) {
    const int ra = min(t * 16 + g, a.rows - 1), rb = min(t * 16 + g + 8, a.rows - 1);
    wa = reinterpret_cast<const uint4*>(a.w + static_cast<std::size_t>(ra) * cols);
    wb = reinterpret_cast<const uint4*>(a.w + static_cast<std::size_t>(rb) * cols);
  };
  set_rows(tile);
  const int chunks = (cols + 31) / 32;
  constexpr int U = NT == 1 ? 8 : 4;

  // First group of weights before waiting on the previous kernel: weights never depend on it.
  uint4 w_a[U], w_b[U];
  auto load_w = [&](int base) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int c = base + j * WARPS;
      if (c < chunks && c * 32 + q * 8 < cols) {
        w_a[j] = load_stream(wa + c * 4 + q);
        w_b[j] = load_stream(wb + c * 4 + q);
      } else {
        w_a[j] = make_uint4(0, 0, 0, 0);
        w_b[j] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  // TMA: stage u of this block is k-slice u % slices of its tile u / slices; the stages hold
  // 16 rows × tma_cols columns, row r at r × (that slice's columns) × 2 bytes.
  const int kslice = a.tma_cols, slices = (cols + kslice - 1) / kslice, nstages = a.tma_stages;
  const std::size_t stage_bytes = static_cast<std::size_t>(16) * kslice * sizeof(bf16);
  unsigned char* ring = dyn + a.tma_ring_offset;
  if constexpr (TMA) {
    if (warp == WARPS) {
      // Producer: every stage of every tile of this block, as soon as its slot is free. Weights do
      // not depend on the previous kernel: no griddepcontrol.wait, so the first stages stream while
      // it drains (the computing warps wait for it before they read x).
      if (a.late_trigger == 0) grid_dep_trigger();
      const int my_tiles = (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
      const int total = my_tiles * slices;
      for (int u = 0; u < total; ++u) {
        const int slot = u % nstages, use = u / nstages;
        const int t = static_cast<int>(blockIdx.x) + (u / slices) * static_cast<int>(gridDim.x);
        const int k0 = (u % slices) * kslice, kc = min(kslice, cols - k0);
        const int valid_rows = min(16, a.rows - t * 16);
        if (use > 0) mbar_wait(empty + slot, (use - 1) & 1);
        if (u == a.pre_wait_stages && u > 0) mbar_wait(&go_bar, 0);  // the rest after the prologue
        if (lane == 0) mbar_expect_tx(full + slot, static_cast<unsigned>(valid_rows * kc * sizeof(bf16)));
        __syncwarp();
        if (lane < valid_rows) {
          bulk_copy(ring + slot * stage_bytes + static_cast<std::size_t>(lane) * kc * sizeof(bf16),
                    a.w + static_cast<std::size_t>(t * 16 + lane) * cols + k0, static_cast<unsigned>(kc * sizeof(bf16)),
                    full + slot);
        }
        if (stamp_at != nullptr && lane == 0 && u < 64) stamp_at[64 + u] = global_ns();
      }
      if (stamp_at != nullptr && lane == 0) stamp_at[1] = global_ns();
      return;
    }
  } else {
    load_w(warp);
  }
  // The norm's weights never depend on the previous kernel: in registers before the wait (their
  // round trip to L2 was one of the norm prologue's three, session 17's stamps).
  // Chunks of 8 weights a thread holds from before the wait: with 256 computing threads a hidden size
  // up to 4096 (the 1B's 2048 needs one); wider rows load the rest in pass 2, as before.
  constexpr int pre_nw = 2;
  float4 nw_pre[pre_nw][2];
  const int pre_nw_used = a.norm_early != 0 ? pre_nw : 0;
  if constexpr (PRO == static_cast<int>(gemv_prologue::norm)) {
#pragma unroll
    for (int j = 0; j < pre_nw; ++j) {
      if (j >= pre_nw_used) break;
      const int i = threadIdx.x + j * threads;
      if (i < cols / 8) {
        nw_pre[j][0] = reinterpret_cast<const float4*>(a.norm_w)[i * 2];
        nw_pre[j][1] = reinterpret_cast<const float4*>(a.norm_w)[i * 2 + 1];
      }
    }
  }
  grid_dep_wait();
  if (a.late_trigger == 0) grid_dep_trigger();
  if (stamp_at != nullptr && threadIdx.x == 0) stamp_at[2] = global_ns();

  const int stride = cols + 8;  // padded rows of x in shared memory: conflict-free 16-byte reads
  bf16* xs = reinterpret_cast<bf16*>(dyn);
  const bool staged = PRO == static_cast<int>(gemv_prologue::norm) || a.stage_x;
  if (PRO != static_cast<int>(gemv_prologue::norm) && staged) {
    // All of a thread's loads first, then the arithmetic and the stores: the silu prologue of
    // down_proj (8192 columns, 4 chunks a thread) waited for one L2 round trip per chunk.
    const int vchunks = cols / 8, total = n * vchunks;
    constexpr int SU = 4;
    for (int base = threadIdx.x; base < total; base += threads * SU) {
      uint4 gv[SU], uv[SU];
#pragma unroll
      for (int k = 0; k < SU; ++k) {
        const int idx = base + k * threads;
        if (idx >= total) break;
        const int t = idx / vchunks, i = idx % vchunks;
        if constexpr (PRO == static_cast<int>(gemv_prologue::silu)) {
          const bf16* gu = a.x + static_cast<std::size_t>(t) * 2 * cols;
          gv[k] = __ldg(reinterpret_cast<const uint4*>(gu) + i);
          uv[k] = __ldg(reinterpret_cast<const uint4*>(gu + cols) + i);
        } else {
          gv[k] = __ldg(reinterpret_cast<const uint4*>(a.x + static_cast<std::size_t>(t) * cols) + i);
        }
      }
#pragma unroll
      for (int k = 0; k < SU; ++k) {
        const int idx = base + k * threads;
        if (idx >= total) break;
        const int t = idx / vchunks, i = idx % vchunks;
        uint4 v = gv[k];
        if constexpr (PRO == static_cast<int>(gemv_prologue::silu)) {
          v = make_uint4(silu_pair(gv[k].x, uv[k].x), silu_pair(gv[k].y, uv[k].y), silu_pair(gv[k].z, uv[k].z),
                         silu_pair(gv[k].w, uv[k].w));
          if (blockIdx.x == 0) reinterpret_cast<uint4*>(a.x_out + static_cast<std::size_t>(t) * cols)[i] = v;
        }
        *reinterpret_cast<uint4*>(xs + static_cast<std::size_t>(t) * stride + i * 8) = v;
      }
    }
    sync();
  }
  if constexpr (PRO == static_cast<int>(gemv_prologue::norm)) {
    const int vchunks = cols / 8;
    double ss[NT * 8];
#pragma unroll
    for (int t = 0; t < NT * 8; ++t) ss[t] = 0.0;
    // Pass 1: x = residual (+ delta, rounded as the residual stream is), sum of squares per token.
#pragma unroll
    for (int t = 0; t < NT * 8; ++t) {
      if (t >= n) break;
      const uint4* r4 = reinterpret_cast<const uint4*>(a.residual + static_cast<std::size_t>(t) * cols);
      const uint4* d4 = reinterpret_cast<const uint4*>(a.delta + static_cast<std::size_t>(t) * cols);
      for (int i = threadIdx.x; i < vchunks; i += threads) {
        uint4 v = r4[i];
        if (a.delta != nullptr) {
          const uint4 d = d4[i];
          std::uint32_t* vp = reinterpret_cast<std::uint32_t*>(&v);
          const std::uint32_t* dp = reinterpret_cast<const std::uint32_t*>(&d);
#pragma unroll
          for (int e = 0; e < 4; ++e) vp[e] = pack_bf16x2(bf_lo(vp[e]) + bf_lo(dp[e]), bf_hi(vp[e]) + bf_hi(dp[e]));
        }
        const std::uint32_t* vp = reinterpret_cast<const std::uint32_t*>(&v);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const double lo = bf_lo(vp[e]), hi = bf_hi(vp[e]);
          ss[t] += lo * lo + hi * hi;
        }
        *reinterpret_cast<uint4*>(xs + static_cast<std::size_t>(t) * stride + i * 8) = v;
      }
    }
#pragma unroll
    for (int t = 0; t < NT * 8; ++t) {
      double v = ss[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) ss_part[warp][t] = v;
    }
    sync();
    // Every thread of this block has read its residual (and delta) chunks: the arrival that elects
    // the block writing residual += delta goes out now, its round trip under the rest of the norm.
    unsigned ticket = 0;
    if (a.delta != nullptr && threadIdx.x == 0 && a.norm_early != 0) ticket = atomicAdd(a.counter, 1u);
    if (threadIdx.x < NT * 8) {
      double total = 0.0;
      for (int w = 0; w < WARPS; ++w) total += ss_part[w][threadIdx.x];
      inv_s[threadIdx.x] = 1.0f / sqrtf(static_cast<float>(total / cols) + a.eps);
    }
    sync();
    // Pass 2 (same chunks as pass 1, so no barrier between): x = w * (x * inv), rounded.
    const float4* nw = reinterpret_cast<const float4*>(a.norm_w);
    for (int t = 0; t < n; ++t) {
      const float inv = inv_s[t];
      for (int i = threadIdx.x, j = 0; i < vchunks; i += threads, ++j) {
        uint4* p = reinterpret_cast<uint4*>(xs + static_cast<std::size_t>(t) * stride + i * 8);
        uint4 v = *p;
        float4 w0, w1;
        if (j < pre_nw_used) {
#pragma unroll
          for (int jj = 0; jj < pre_nw; ++jj) {  // a constant index: the array stays in registers
            if (jj == j) {
              w0 = nw_pre[jj][0];
              w1 = nw_pre[jj][1];
            }
          }
        } else {
          w0 = nw[i * 2];
          w1 = nw[i * 2 + 1];
        }
        const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        std::uint32_t* vp = reinterpret_cast<std::uint32_t*>(&v);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          vp[e] = pack_bf16x2(wv[2 * e] * (bf_lo(vp[e]) * inv), wv[2 * e + 1] * (bf_hi(vp[e]) * inv));
        }
        *p = v;
      }
    }
    sync();
    // Materialise what the op-by-op path leaves in memory: the normalised rows, and with delta the
    // updated residual, written by the last block to arrive (every other block has read it by then).
    bool writer = blockIdx.x == 0;
    if (a.delta != nullptr) {
      if (threadIdx.x == 0) {
        if (a.norm_early == 0) ticket = atomicAdd(a.counter, 1u);
        last_s = ticket == gridDim.x - 1;
      }
      sync();
      writer = last_s != 0;
    }
    if (writer) {
      for (int t = 0; t < n; ++t) {
        uint4* r4 = reinterpret_cast<uint4*>(a.residual + static_cast<std::size_t>(t) * cols);
        const uint4* d4 = reinterpret_cast<const uint4*>(a.delta + static_cast<std::size_t>(t) * cols);
        uint4* o4 = reinterpret_cast<uint4*>(a.x_out + static_cast<std::size_t>(t) * cols);
        for (int i = threadIdx.x; i < vchunks; i += threads) {
          if (a.delta != nullptr) {
            uint4 v = r4[i];
            const uint4 d = d4[i];
            std::uint32_t* vp = reinterpret_cast<std::uint32_t*>(&v);
            const std::uint32_t* dp = reinterpret_cast<const std::uint32_t*>(&d);
#pragma unroll
            for (int e = 0; e < 4; ++e) vp[e] = pack_bf16x2(bf_lo(vp[e]) + bf_lo(dp[e]), bf_hi(vp[e]) + bf_hi(dp[e]));
            r4[i] = v;
          }
          o4[i] = *reinterpret_cast<const uint4*>(xs + static_cast<std::size_t>(t) * stride + i * 8);
        }
      }
      if (a.delta != nullptr && threadIdx.x == 0) *a.counter = 0u;  // ready for the next launch
    }
  }

  // One chunk (16 rows × 32 k of W in wa4 / wb4, zero where invalid) into the accumulators, x read
  // from where the prologue left it.
  auto mma_chunk = [&](float (&acc)[NT][2][4], int c, bool valid, const uint4& wa4, const uint4& wb4, int tile_now) {
    const int k0 = c * 32 + q * 8;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int t = nt * 8 + g;
      uint4 xv = make_uint4(0, 0, 0, 0);
      if (valid && t < n) {
        if (staged) {
          xv = *reinterpret_cast<const uint4*>(xs + static_cast<std::size_t>(t) * stride + k0);
        } else if constexpr (PRO == static_cast<int>(gemv_prologue::silu)) {
          const bf16* gu = a.x + static_cast<std::size_t>(t) * 2 * cols;
          const uint4 gv = __ldg(reinterpret_cast<const uint4*>(gu + k0));
          const uint4 uv = __ldg(reinterpret_cast<const uint4*>(gu + cols + k0));
          xv = make_uint4(silu_pair(gv.x, uv.x), silu_pair(gv.y, uv.y), silu_pair(gv.z, uv.z), silu_pair(gv.w, uv.w));
          if (tile_now == 0) *reinterpret_cast<uint4*>(a.x_out + static_cast<std::size_t>(t) * cols + k0) = xv;
        } else {
          xv = __ldg(reinterpret_cast<const uint4*>(a.x + static_cast<std::size_t>(t) * cols + k0));
        }
      }
      mma16816(acc[nt][0], wa4.x, wb4.x, wa4.y, wb4.y, xv.x, xv.y);
      mma16816(acc[nt][1], wa4.z, wb4.z, wa4.w, wb4.w, xv.z, xv.w);
    }
  };

  if (stamp_at != nullptr && threadIdx.x == 0) stamp_at[3] = global_ns();
  if (TMA && a.pre_wait_stages > 0 && threadIdx.x == 0) mbar_arrive(&go_bar);
  if (a.late_trigger != 0) grid_dep_trigger();
  [[maybe_unused]] int u = 0;  // TMA: stages consumed so far
  for (; tile < tiles; tile += gridDim.x) {
    const int row0 = tile * 16;
    float acc[NT][2][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][h][e] = 0.0f;

    if constexpr (TMA) {
      // Warp w takes chunks w, w + WARPS, ... of each slice; tma_cols is a multiple of 32 × WARPS, so
      // over the whole row that is chunks ≡ w (mod WARPS) in increasing order, as in the loop below
      // with 8 warps: the same sums in the same order.
      for (int sl = 0; sl < slices; ++sl, ++u) {
        const int slot = u % nstages;
        mbar_wait(full + slot, (u / nstages) & 1);
        if (stamp_at != nullptr && threadIdx.x == 0 && u < 56) stamp_at[8 + u] = global_ns();
        const int kbase = sl * kslice, kc = min(kslice, cols - kbase);
        const bf16* st = reinterpret_cast<const bf16*>(ring + slot * stage_bytes);
        const int lchunks = (kc + 31) / 32;
#pragma unroll 4
        for (int cl = warp; cl < lchunks; cl += WARPS) {
          const bool valid = cl * 32 + q * 8 < kc;
          uint4 wa4 = make_uint4(0, 0, 0, 0), wb4 = make_uint4(0, 0, 0, 0);
          if (valid) {
            wa4 = *reinterpret_cast<const uint4*>(st + static_cast<std::size_t>(g) * kc + cl * 32 + q * 8);
            wb4 = *reinterpret_cast<const uint4*>(st + static_cast<std::size_t>(g + 8) * kc + cl * 32 + q * 8);
          }
          mma_chunk(acc, kbase / 32 + cl, valid, wa4, wb4, tile);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);  // this warp is done with the slot
        if (stamp_at != nullptr && threadIdx.x == 0 && u == 0) stamp_at[6] = global_ns();
      }
    } else {
      for (int base = warp; base < chunks; base += WARPS * U) {
        if (base != warp) load_w(base);
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const int c = base + j * WARPS;
          mma_chunk(acc, c, c < chunks && c * 32 + q * 8 < cols, w_a[j], w_b[j], tile);
        }
      }
    }

    // Sum the warps' K slices: lane l holds (row g, tokens 2q, 2q+1) in e = 0, 1 and row g + 8 in 2, 3.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][nt][e][lane] = acc[nt][0][e] + acc[nt][1][e];
    if (!TMA && tile + static_cast<int>(gridDim.x) < tiles) {  // the next tile's first weights, before the reduction
      set_rows(tile + gridDim.x);
      load_w(warp);
    }
    sync();
    for (int idx = threadIdx.x; idx < NT * 4 * 32; idx += threads) {
      const int nt = idx / 128, e = (idx / 32) % 4, l = idx % 32;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) s += red[w][nt][e][l];
      const int row = row0 + l / 4 + (e >= 2 ? 8 : 0);
      const int tok = nt * 8 + 2 * (l % 4) + (e & 1);
      if (row < a.rows && tok < n) {
        store_linear_out(s, a.bias, row, a.out + static_cast<std::size_t>(tok) * a.rows + row);
      }
    }
    sync();  // red is rewritten by the next tile
  }
  if (stamp_at != nullptr && threadIdx.x == 0) stamp_at[4] = global_ns();
}

template <int NT, int WARPS, int PRO, bool TMA>
void launch_one(const gemv_args& a, std::size_t smem, bool pdl, int sms, cudaStream_t s) {
  // A grid of more tiles than fit at once is capped at the blocks that do (each then serves several
  // tiles and prefetches the next one's weights): one wave that streams instead of waves that each
  // start with a memory round trip. The resident count includes the shared memory of this launch.
  constexpr int threads = WARPS * 32 + (TMA ? 32 : 0);
  const int tiles = gemv_tiles(a.rows);
  int grid = tiles;
  if (a.cap_grid != 0 || TMA) {
    int per_sm = 0;
    CONVEYOR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<NT, WARPS, PRO, TMA>, threads, smem));
    grid = std::min(tiles, std::max(1, per_sm) * sms);
  }
  launch_k(pdl, gemv_kernel<NT, WARPS, PRO, TMA>, dim3(static_cast<unsigned>(grid)), dim3(threads), smem, s, a);
}

template <int NT, int WARPS, bool TMA>
void launch_nt(const gemv_args& a, gemv_prologue pro, std::size_t smem, bool pdl, int sms, cudaStream_t s) {
  switch (pro) {
    case gemv_prologue::none: return launch_one<NT, WARPS, 0, TMA>(a, smem, pdl, sms, s);
    case gemv_prologue::norm: return launch_one<NT, WARPS, 1, TMA>(a, smem, pdl, sms, s);
    case gemv_prologue::silu: return launch_one<NT, WARPS, 2, TMA>(a, smem, pdl, sms, s);
  }
}

// Shared memory a block may use (227 KB on sm_90) and what the kernel declares statically.
constexpr std::size_t smem_per_block = 227 * 1024;
// (An upper bound: the kernel's arrays plus 1 KB for alignment and what the compiler adds.)
template <int NT, int WARPS>
constexpr std::size_t static_smem() {
  return sizeof(float) * WARPS * NT * 4 * 32 + sizeof(double) * WARPS * NT * 8 + sizeof(float) * NT * 8 + 1024;
}
constexpr int tma_warps = 8;

/// Raises the kernels' dynamic shared-memory limit to `bytes`, or to what is left of a block's
/// 227 KB beside their static arrays if that is less.
template <int NT, int WARPS, bool TMA>
void allow_smem(std::size_t bytes) {
  for (auto* k : {gemv_kernel<NT, WARPS, 0, TMA>, gemv_kernel<NT, WARPS, 1, TMA>, gemv_kernel<NT, WARPS, 2, TMA>}) {
    cudaFuncAttributes attr{};
    CONVEYOR_CUDA_CHECK(cudaFuncGetAttributes(&attr, k));
    const std::size_t limit = std::min(bytes, smem_per_block - attr.sharedSizeBytes);
    CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit)));
  }
}

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

/// Stage width, stage count and shared memory of a TMA launch; false where two stages do not fit.
/// The stage width is a multiple of 32 × tma_warps so the arithmetic never depends on it (nor on n).
template <int NT>
bool plan_tma(gemv_args& a, gemv_prologue pro, std::size_t& smem) {
  const std::size_t ring = static_cast<std::size_t>(std::max(a.tma_ring_bytes, 2 * 16 * 256 * 2));
  constexpr std::size_t unit = 32 * tma_warps;  // columns
  std::size_t kslice = std::min(round_up(static_cast<std::size_t>(a.cols), unit),
                                std::max(unit, ring / 3 / 32 / unit * unit));  // a stage is 32 bytes a column
  for (int pass = 0; pass < 2; ++pass) {
    const bool staged = pro == gemv_prologue::norm || a.stage_x != 0;
    const std::size_t xs = staged ? round_up(gemv_norm_smem_bytes(a.n, a.cols), 128) : 0;
    const std::size_t fixed = static_smem<NT, tma_warps>() + 128 + xs;
    if (fixed < smem_per_block) {
      const std::size_t avail = smem_per_block - fixed;
      while (kslice > unit && avail / (32 * kslice) < 2) kslice -= unit;
      const std::size_t stages = std::min<std::size_t>(8, std::min(ring, avail) / (32 * kslice));
      const std::size_t fit = std::min<std::size_t>(8, avail / (32 * kslice));
      const std::size_t ns = stages >= 2 ? stages : fit;
      if (ns >= 2) {
        a.tma_cols = static_cast<int>(kslice);
        a.tma_stages = static_cast<int>(ns);
        a.tma_ring_offset = static_cast<int>(xs);
        smem = 128 + xs + ns * 32 * kslice;
        return true;
      }
    }
    if (pro == gemv_prologue::norm || a.stage_x == 0) return false;
    a.stage_x = 0;  // x from global instead (same values): room for the stages
  }
  return false;
}

}  // namespace

bool gemv_supported(int n, int rows, int cols) { return n >= 1 && n <= max_tokens && rows >= 1 && cols >= 8 && cols % 8 == 0; }

std::size_t gemv_norm_smem_bytes(int n, int cols) {
  return static_cast<std::size_t>(n) * (static_cast<std::size_t>(cols) + 8) * sizeof(bf16);
}

void gemv_init() {
  allow_smem<1, 8, false>(gemv_max_norm_smem);
  allow_smem<1, 16, false>(gemv_max_norm_smem);
  allow_smem<2, 8, false>(gemv_max_norm_smem);
  allow_smem<2, 16, false>(gemv_max_norm_smem);
  allow_smem<1, tma_warps, true>(smem_per_block);
  allow_smem<2, tma_warps, true>(smem_per_block);
}

bool gemv_single_wave(int rows, int sms) {
  const int tiles = gemv_tiles(rows);
  return tiles <= 2 * sms;  // 16 warps: one block per SM; 8 warps: two
}

bool gemv_one_wave(const gemv_args& a, int sms) {
  return gemv_single_wave(a.rows, sms) || ((a.cap_grid != 0 || a.tma != 0) && a.stage_capped != 0);
}

void launch_gemv(const gemv_args& args, gemv_prologue pro, bool pdl, int sms, cudaStream_t s) {
  gemv_args a = args;
  // Staging is a serial step at the start of every block: it pays in a grid of one wave (o_proj,
  // down_proj) and costs a round trip per wave in a larger one (gate_up, the LM head: batch 8 lost
  // 0.46 ms a step when every grid staged). A capped grid is one wave too (stage_capped).
  a.stage_x = gemv_one_wave(a, sms) && gemv_norm_smem_bytes(a.n, a.cols) <= gemv_max_norm_smem ? 1 : 0;
  std::size_t smem = 0;
  // tma: weights through shared-memory stages, 8 computing warps, whatever the shape and n (one
  // arithmetic for every n: batch_invariant). 16-byte aligned rows are needed for the bulk copies.
  if (a.tma != 0 && (reinterpret_cast<std::uintptr_t>(a.w) % 16) == 0 &&
      (a.n <= 8 ? plan_tma<1>(a, pro, smem) : plan_tma<2>(a, pro, smem))) {
    return a.n <= 8 ? launch_nt<1, tma_warps, true>(a, pro, smem, pdl, sms, s)
                    : launch_nt<2, tma_warps, true>(a, pro, smem, pdl, sms, s);
  }
  smem = pro == gemv_prologue::norm || a.stage_x ? gemv_norm_smem_bytes(a.n, a.cols) : 0;
  // A grid that fits on the SMs at once (o_proj, down_proj) gets 16 warps per block, for more loads
  // in flight; a larger one 8, so two blocks share an SM and a second wave comes later or never
  // (qkv_proj's 192 tiles ran as two waves of 16-warp blocks).
  const bool wide = gemv_tiles(a.rows) <= sms;
  if (a.n <= 8) {
    wide ? launch_nt<1, 16, false>(a, pro, smem, pdl, sms, s) : launch_nt<1, 8, false>(a, pro, smem, pdl, sms, s);
  } else {
    wide ? launch_nt<2, 16, false>(a, pro, smem, pdl, sms, s) : launch_nt<2, 8, false>(a, pro, smem, pdl, sms, s);
  }
}

}  // namespace conveyor::kernels::cuda
