// Skinny bf16 linear for decode batches on Hopper's own machinery (sm_90a): out[n, rows] =
// x[n, cols] · Wᵀ (+ bias), 1 ≤ n ≤ 128 tokens (meant for 17..128). At n = 64 the weights are ~16×
// the activations, so the kernel is a weight stream with the math on the side; session 4's
// mma.sync + cp.async kernel (skinny_gemm.cu) was capped by mma.sync's rate and by its 16-byte copy
// requests (bench/NOTES.md), so this one moves both to the hardware built for them:
//
// - TMA: a producer warp fills a ring of `stages` shared-memory stages with one 2D tensor copy of the
//   weight tile (BM = 128 or 256 rows × 64 k) and one of the activation tile (N tokens × 64 k; tokens past
//   n and k past cols arrive as zeros), completion counted on the stage's `full` mbarrier; the
//   consumers hand a stage back on its `empty` mbarrier.
// - wgmma (swap-AB): the weight tile is A (64 rows a warpgroup, K-major, 128-byte swizzle, straight
//   from the row-major [rows, cols] weight), the activation tile is B (K-major too), the f32
//   accumulator is rows × tokens in registers (transposed on the store). Two consumer warpgroups
//   (BM 128), or four (BM 256: x re-read half as often) where there are ≥ 256 rows an SM (the LM
//   head); 4 wgmma m64nNk16 a warpgroup a stage, one wgmma group in flight behind the one issued.
// - Where the row tiles leave a quarter of the SMs idle (qkv, o_proj, down), K is split over S ≤ 8 blocks of
//   one thread-block cluster; every block writes its f32 tile into its own shared memory and sums
//   1/S of the cluster's tiles through distributed shared memory in a fixed order (deterministic,
//   no workspace, no second kernel). Otherwise the grid is at most one block an SM and each block
//   owns a contiguous run of rows (the LM head: ~972 rows, 4 tiles of 256, the last one shifted back to
//   end at the run's end: its overlap comes from L2, and the blocks stay balanced), its ring
//   running on across tiles.
// - PDL: the first stages' weight tiles are requested before griddepcontrol.wait (weights never
//   depend on the previous kernel); the activation tiles and every store come after it.
//
// Measured (session 5, bench/NOTES.md): correct and deterministic, within ±10% of cuBLAS per shape
// back to back, but in a decode step each launch costs 6-9 µs besides its bytes (ncu: the SMs are
// active 62-78% of the kernel's time: launch ramp, clusters of 8, a ragged tail), so the option
// stays off. The open lead is the scheduling, not the streaming: finer work units handed out
// dynamically with a deterministic fix-up, or fewer, fused launches.
#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime (no -lcuda)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "device_types.cuh"
#include "linear_epilogue.cuh"
#include "mbarrier.cuh"
#include "skinny_wgmma.hpp"

namespace conveyor::kernels::cuda {

namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int BK = 64;  // k a stage: one 128-byte swizzle span
constexpr int MAX_STAGES = 8;
constexpr int MAX_SPLITS = 8;  // portable cluster size
static_assert(MAX_SPLITS == skinny_wgmma_max_splits, "skinny_wgmma.hpp");
// Dynamic shared memory: up to 1 KB to align the base to the 1024 bytes the 128-byte swizzle
// repeats over, 1 KB of barriers, then the ring (reused as the reduction tile).
constexpr int HEAD_BYTES = 2048;
// WGS consumer warpgroups of 64 weight rows each (BM rows a block) and the producer warp; N tokens.
template <int N, int WGS>
struct shape {
  static constexpr int BM = 64 * WGS;
  static constexpr int CONSUMERS = 128 * WGS;
  static constexpr int THREADS = CONSUMERS + 32;
  static constexpr int W_BYTES = BM * BK * 2;
  static constexpr int STAGE = W_BYTES + N * BK * 2;
  static constexpr int RED_PITCH = BM + 4;  // f32 reduction tile [token][row]: conflict-free fragment stores
  static constexpr int RED_BYTES = N * RED_PITCH * 4;
  // push: the owner's receive area [source split][owned row][token], tokens N + 2 apart (even, so a
  // fragment's two adjacent tokens go as one 8-byte store); BM / splits owned rows a block.
  static constexpr int PUSH_PITCH = N + 2;
  static constexpr int PUSH_BYTES = BM * PUSH_PITCH * 4;
};

// The kernel's epilogue, fixed at compile time so that each instance holds only its own live
// ranges: with the three behind run-time branches (sessions 14-15) ptxas gave every instance the
// union, 128-168 registers and spills at N ≥ 96 (80-96 and none with the plain one alone).
enum class epi {
  plain,   // bf16 out (+ bias): one block's rows (splits == 1) or the cluster's DSMEM sum of K splits
  slices,  // f32 partial sums of K slices to `parts` (launch_skinny_wgmma_slices)
  swiglu,  // silu(gate) * up of gate_up's paired rows (launch_skinny_wgmma_swiglu)
  push,    // bf16 out (+ bias), K split over a cluster: each block stores its partial sums into the
           // block that owns those rows (push_area), the cluster meets once (wgmma_push_reduce)
};

struct params {
  const float* bias;
  bf16* out;
  int rows, n, ktiles;
  int splits;          // cluster size along K; 1: no split, each block owns rows_per_block rows
  int rows_per_block;  // splits == 1
  int stages;
  int evict_first;  // weight copies with an L2 evict-first hint (read once; x and the rest stay)
  // Slices mode (launch_skinny_wgmma_slices): with splits > 1 and no cluster, block (tile, split)
  // stores its f32 partial sums (no bias) to parts[split][token][row] for a following kernel that
  // sums the slices anyway (split_add_rmsnorm), instead of the cluster's DSMEM reduction.
  float* parts;
  // SwiGLU mode (launch_skinny_wgmma_swiglu, WGS even, no split): the weight is gate_up [2 ffn, cols]
  // and `rows` = ffn, the output's width. A block's tile is BM / 2 ffn indices f: the first WGS / 2
  // warpgroups multiply gate rows f, the others up rows ffn + f (two TMA boxes of BM / 2 rows a
  // stage), and out[t, f] = silu(gate) * up, each rounded as the op-by-op path rounds it.
  int ffn;
  // Diagnostics (SKINNY_WGMMA_STAMPS, skinny_wgmma_stamps_report): nullptr, or stamp_slots
  // %globaltimer stamps a block at blockIdx.x * stamp_slots (slot meanings at stamp_slot).
  unsigned long long* stamps;
};

// Where a block's time goes (SKINNY_WGMMA_STAMPS): the slots of its stamps.
namespace stamp_slot {
constexpr int entry = 0, issued = 1, producer_waited = 2, waited = 3, stage0 = 4, stages_seen = 8, mma_done = 12,
              reduce = 13, exit = 14, sm = 15, last_issued = 16;
}  // namespace stamp_slot
constexpr int stamp_slots = 32;

// One 2D tensor tile (64 k × box rows) global → shared, counted on `bar`.
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int k, int row, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void tma_2d_hint(void* dst, const CUtensorMap* map, int k, int row, std::uint64_t* bar,
                                            std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle TMA writes: rows of 128
// bytes, 8-row groups 1024 bytes apart (stride byte offset), the leading offset unused for this
// layout; the k16 steps inside the swizzle span advance the start address by 32 bytes.
__device__ __forceinline__ std::uint64_t sw128_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int G>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(G) : "memory");
}
// The cluster's split barrier (push epilogue): every thread of every block arrives, then waits.
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma steps.
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 × N] += A[64 × 16] · B[16 × N], both from shared memory (descriptors), f32 accumulators.
// Generated: one operand list per N (wgmma takes the accumulators as N / 2 separate registers).
template <int N>
struct wgmma_n;
template <>
struct wgmma_n<32> {
  __device__ __forceinline__ static void mma(float (&d)[16], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <>
struct wgmma_n<64> {
  __device__ __forceinline__ static void mma(float (&d)[32], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <>
struct wgmma_n<96> {
  __device__ __forceinline__ static void mma(float (&d)[48], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <>
struct wgmma_n<128> {
  __device__ __forceinline__ static void mma(float (&d)[64], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <int N, int WGS, epi E>
__global__ void __launch_bounds__(shape<N, WGS>::THREADS, 1)
    skinny_wgmma_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, params p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built without the sm_90a target, which wgmma needs (CMake's default is 90a)
#else
  using S = shape<N, WGS>;
  constexpr int STAGE = S::STAGE, BM = S::BM, CONSUMERS = S::CONSUMERS, THREADS = S::THREADS;
  constexpr int W_BYTES = S::W_BYTES, RED_PITCH = S::RED_PITCH;
  constexpr int R = N / 2;  // accumulators a thread
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + MAX_STAGES;
  unsigned char* ring = smem + 1024;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int stages = p.stages, rows = p.rows, n = p.n;
  unsigned long long* const st = p.stamps == nullptr ? nullptr : p.stamps + blockIdx.x * stamp_slots;
  auto stamp = [&](int slot) {
    if (st != nullptr) st[slot] = global_ns();
  };
  if (tid == 0) {
    stamp(stamp_slot::entry);
    if (st != nullptr) st[stamp_slot::sm] = smid();
  }

  // This block's work: rows [row_lo, row_hi) in `items` tiles of BM rows, k tiles [kt0, kt0 + nkt).
  int row_lo, row_hi, items, kt0, nkt, split = 0;
  constexpr int bm = E == epi::swiglu ? BM / 2 : BM;  // output rows a tile
  if (E != epi::swiglu && p.splits > 1) {
    const int tile = blockIdx.x / p.splits;
    split = blockIdx.x % p.splits;  // the block's rank in its cluster (clusters run along x)
    row_lo = tile * BM;
    row_hi = min(rows, row_lo + BM);
    items = 1;
    const int per = (p.ktiles + p.splits - 1) / p.splits;
    kt0 = min(p.ktiles, split * per);
    nkt = min(p.ktiles, kt0 + per) - kt0;
  } else {
    row_lo = blockIdx.x * p.rows_per_block;
    row_hi = min(rows, row_lo + p.rows_per_block);
    items = (row_hi - row_lo + bm - 1) / bm;
    kt0 = 0;
    nkt = p.ktiles;
  }
  // Tile i stores rows [row_lo + BM i, ...) and loads BM rows from here: the last tile of a run
  // ends at the run's end (its overlap with the tile before is in L2), unless the run is shorter.
  auto load_row = [&](int i) { return max(row_lo, min(row_lo + bm * i, row_hi - bm)); };
  // push: the peers' partial sums land on this block's first ring slots, so the block arrives at
  // the cluster barrier once its last use of those slots is over (often long before its last
  // stage), and a block stores into its peers only after every one of them has arrived.
  constexpr bool push = E == epi::push;  // launched with p.splits > 1 only
  int push_last = -1;  // the last iteration that uses a slot under the push area
  if (push && items * nkt > 0) {
    const int need = min(stages, (S::PUSH_BYTES + STAGE - 1) / STAGE), last = items * nkt - 1;
    const int cycle = last / stages * stages;
    push_last = last - cycle < need ? last : cycle + need - 1;
  }

  if (tid == CONSUMERS) {  // the producer's first copies need both descriptors
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&tw)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&tx)) : "memory");
  }
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, CONSUMERS / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == CONSUMERS / 32) {  // the producer warp: lane 0 issues every copy
    if (lane == 0) {
      std::uint64_t policy = 0;
      if (p.evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      auto copy_w = [&](unsigned char* dst, int k, int row, std::uint64_t* bar) {
        if (p.evict_first) {
          tma_2d_hint(dst, &tw, k, row, bar, policy);
        } else {
          tma_2d(dst, &tw, k, row, bar);
        }
      };
      auto load_w = [&](int slot, int it) {
        unsigned char* dst = ring + slot * STAGE;
        const int k = (kt0 + it % nkt) * BK, row = load_row(it / nkt);
        copy_w(dst, k, row, full + slot);
        if constexpr (E == epi::swiglu) {  // the up rows of the same f
          copy_w(dst + W_BYTES / 2, k, p.ffn + row, full + slot);
        }
      };
      // x's k tile of item it: after the wait, since the previous kernel writes x.
      auto load_x = [&](int slot, int it) {
        tma_2d(ring + slot * STAGE + W_BYTES, &tx, (kt0 + it % nkt) * BK, 0, full + slot);
      };
      const int total = items * nkt;
      const int pre = min(stages, total);
      for (int it = 0; it < pre; ++it) {  // weights first: they do not depend on the previous kernel
        mbar_expect_tx(full + it, STAGE);
        load_w(it, it);
      }
      stamp(stamp_slot::issued);
      grid_dep_wait();
      grid_dep_trigger();
      stamp(stamp_slot::producer_waited);
      for (int it = 0; it < pre; ++it) load_x(it, it);
      for (int it = pre; it < total; ++it) {
        const int s = it % stages;
        mbar_wait(empty + s, ((it / stages) & 1) ^ 1);  // its previous use has been handed back
        mbar_expect_tx(full + s, STAGE);
        load_w(s, it);
        load_x(s, it);
      }
      stamp(stamp_slot::last_issued);
    } else {
      grid_dep_wait();
      grid_dep_trigger();
    }
    __syncwarp();
    if (push) cluster_arrive_release();  // the producer writes the ring only through the stages it issued
  } else {  // WGS consumer warpgroups of 64 rows each
    grid_dep_wait();  // the output may still be read by the previous kernel
    grid_dep_trigger();
    if (tid == 0) stamp(stamp_slot::waited);
    const int wg = warp / 4, g = lane / 4, q = lane % 4;
    float acc[R];
    int it = 0;
    bool arrived = false;
    for (int i = 0; i < items; ++i) {
#pragma unroll
      for (int e = 0; e < R; ++e) acc[e] = 0.0f;
      for (int kk = 0; kk < nkt; ++kk, ++it) {
        const int s = it % stages;
        mbar_wait(full + s, (it / stages) & 1);
        if (tid == 0 && it < stamp_slot::stages_seen) stamp(stamp_slot::stage0 + it);
        const std::uint32_t a0 = smem_addr(ring + s * STAGE + wg * 64 * 128);
        const std::uint32_t b0 = smem_addr(ring + s * STAGE + W_BYTES);
        fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16) {
          wgmma_n<N>::mma(acc, sw128_desc(a0 + 32 * k16), sw128_desc(b0 + 32 * k16));
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's group is done: hand that stage back
        fence_acc(acc);
        if (kk > 0 && lane == 0) mbar_arrive(empty + (it - 1) % stages);
        if (push && kk > 0 && it - 1 == push_last) {
          cluster_arrive_release();
          arrived = true;
        }
      }
      wgmma_wait<0>();
      fence_acc(acc);
      if (nkt > 0 && lane == 0) mbar_arrive(empty + (it - 1) % stages);
      if (tid == 0 && i == 0) stamp(stamp_slot::mma_done);
      if (push && !arrived) cluster_arrive_release();

      // Fragment e = 4 j + 2 h + c: row 16 (warp % 4) + g + 8 h of the warpgroup's 64, token 8 j + 2 q + c.
      const int r0 = wg * 64 + (warp % 4) * 16 + g;
      if constexpr (E == epi::slices) {
        float* part = p.parts + static_cast<std::size_t>(split) * n * rows;
#pragma unroll
        for (int e = 0; e < R; ++e) {
          const int row = row_lo + r0 + ((e >> 1) & 1) * 8, t = (e >> 2) * 8 + 2 * q + (e & 1);
          if (t < n && row < row_hi) part[static_cast<std::size_t>(t) * rows + row] = acc[e];
        }
      } else if constexpr (E == epi::swiglu) {
        // The up half hands its sums to the gate half through shared memory past the ring (the same
        // fragment slot: thread tid - CONSUMERS / 2 holds the up row of thread tid's gate row).
        constexpr int HALF = CONSUMERS / 2;
        float* xch = reinterpret_cast<float*>(ring + stages * STAGE);
        if (tid >= HALF) {
#pragma unroll
          for (int e = 0; e < R; ++e) xch[e * HALF + tid - HALF] = acc[e];
        }
        asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");
        if (tid < HALF) {
          const int lrow = load_row(i), slo = row_lo + bm * i, shi = min(slo + bm, row_hi);
#pragma unroll
          for (int e = 0; e < R; ++e) {
            const int f = lrow + r0 + ((e >> 1) & 1) * 8, t = (e >> 2) * 8 + 2 * q + (e & 1);
            if (t < n && f >= slo && f < shi) {
              const float gv = linear_out_value(acc[e], p.bias, f);
              const float uv = linear_out_value(xch[e * HALF + tid], p.bias, p.ffn + f);
              p.out[static_cast<std::size_t>(t) * rows + f] = silu_mul_out(gv, uv);
            }
          }
        }
        asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");  // xch is free for the next tile
      } else if constexpr (push) {
        // Fragment pairs (c = 0, 1: adjacent tokens) as one 8-byte store into the owner of the row.
        cluster_wait_acquire();  // every peer is done with its ring slots under the push area
        cg::cluster_group cluster = cg::this_cluster();
        float* area = reinterpret_cast<float*>(ring);
        const int owned = BM / p.splits;
#pragma unroll
        for (int e = 0; e < R; e += 2) {
          const int r = r0 + ((e >> 1) & 1) * 8, t = (e >> 2) * 8 + 2 * q;
          float* dst = cluster.map_shared_rank(area, r / owned) + (split * owned + r % owned) * S::PUSH_PITCH + t;
          *reinterpret_cast<float2*>(dst) = make_float2(acc[e], acc[e + 1]);
        }
      } else if (p.splits == 1) {
        const int lrow = load_row(i), slo = row_lo + BM * i, shi = min(slo + BM, row_hi);
#pragma unroll
        for (int e = 0; e < R; ++e) {
          const int row = lrow + r0 + ((e >> 1) & 1) * 8, t = (e >> 2) * 8 + 2 * q + (e & 1);
          if (t < n && row >= slo && row < shi) {
            store_linear_out(acc[e], p.bias, row, p.out + static_cast<std::size_t>(t) * rows + row);
          }
        }
      } else {
        asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");  // both warpgroups are done with the ring
        float* red = reinterpret_cast<float*>(ring);
#pragma unroll
        for (int e = 0; e < R; ++e) {
          const int r = r0 + ((e >> 1) & 1) * 8, t = (e >> 2) * 8 + 2 * q + (e & 1);
          red[t * RED_PITCH + r] = acc[e];
        }
      }
    }
  }
  // Sum over the cluster's K splits (fixed order) and store; each block stores 1/splits of the tile.
  const int splits = p.splits;
  if constexpr (push) {
    if (warp == CONSUMERS / 32) cluster_wait_acquire();  // the consumers waited before their stores
    cluster_arrive_release();
    cluster_wait_acquire();  // every peer's partial sums are in this block's push area
    if (tid == 0) stamp(stamp_slot::reduce);
    const float* area = reinterpret_cast<const float*>(ring);
    const int owned = BM / splits;
    for (int i = tid; i < owned * n; i += THREADS) {  // consecutive threads: consecutive rows
      const int rl = i % owned, t = i / owned, row = row_lo + split * owned + rl;
      if (row >= row_hi) continue;
      float sum = 0.0f;  // as the pull sum: 0 + part 0 + part 1 + ...
      for (int part = 0; part < splits; ++part) sum += area[(part * owned + rl) * S::PUSH_PITCH + t];
      store_linear_out(sum, p.bias, row, p.out + static_cast<std::size_t>(t) * rows + row);
    }
    if (tid == 0) stamp(stamp_slot::exit);  // no peer reads this block's memory: it leaves at once
    return;
  }
  if (E != epi::plain || splits == 1) {
    if (tid == 0) stamp(stamp_slot::exit);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's tile is in its shared memory
  if (tid == 0) stamp(stamp_slot::reduce);
  const float* red = reinterpret_cast<const float*>(ring);
  constexpr int R4 = BM / 4;
  for (int i = split * THREADS + tid; i < n * R4; i += splits * THREADS) {
    const int t = i / R4, r = (i % R4) * 4;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[MAX_SPLITS];  // every split's load in flight before the (fixed-order) sum
#pragma unroll
    for (int part = 0; part < MAX_SPLITS; ++part) {
      if (part < splits) v[part] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, part) + t * RED_PITCH + r);
    }
#pragma unroll
    for (int part = 0; part < MAX_SPLITS; ++part) {
      if (part < splits) {
        s.x += v[part].x;
        s.y += v[part].y;
        s.z += v[part].z;
        s.w += v[part].w;
      }
    }
    const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = row_lo + r + j;
      if (row >= row_hi) break;
      store_linear_out(sv[j], p.bias, row, p.out + static_cast<std::size_t>(t) * rows + row);
    }
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
  if (tid == 0) stamp(stamp_slot::exit);
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major bf16 [rows, cols] matrix as 64 (k) × box_rows tiles in the 128-byte swizzle; rows
// and columns past the end arrive as zeros.
bool make_map(CUtensorMap* m, const void* base, int cols, int rows, int box_rows) {
  const auto encode = encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {BK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int env_int(const char* name) {  // timing overrides (time_cuda_ops), 0 when unset
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoi(v);
}

constexpr int smem_limit = 227 * 1024;  // an H100/H200 block's opt-in maximum

// Diagnostics (SKINNY_WGMMA_STAMPS=1, bench only): every launch of the plain epilogue gets one of
// stamp_launches slots of block stamps in turn (a captured graph keeps the slot it was given, and
// each replay overwrites it), and skinny_wgmma_stamps_report() prints what the last runs stamped.
constexpr int stamp_launches = 64, stamp_max_blocks = 256;
struct stamp_launch {
  int n = 0, rows = 0, cols = 0, grid = 0, splits = 0, stages = 0;
};
struct stamp_state {
  unsigned long long* buf = nullptr;  // [stamp_launches][stamp_max_blocks][stamp_slots]
  int next = 0;
  stamp_launch launches[stamp_launches];
};
stamp_state& stamps() {
  static stamp_state s;
  return s;
}
// The stamps of a launch about to be made (nullptr where stamping is off or the grid too large).
unsigned long long* stamps_for(int n, int rows, int cols, int grid, int splits, int stages) {
  stamp_state& st = stamps();
  if (st.buf == nullptr || grid > stamp_max_blocks) return nullptr;
  const int slot = st.next++ % stamp_launches;
  st.launches[slot] = stamp_launch{n, rows, cols, grid, splits, stages};
  return st.buf + static_cast<std::size_t>(slot) * stamp_max_blocks * stamp_slots;
}

// Whether `clusters` clusters of `splits` blocks of `smem` bytes all fit on the GPU at once
// (cudaOccupancyMaxActiveClusters, asked once per configuration).
template <int N, int WGS>
bool clusters_fit(int splits, int clusters, int smem) {
  static int fit[MAX_SPLITS + 1] = {};  // by splits: the clusters that fit, 0 = not asked yet
  if (fit[splits] == 0) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(splits * clusters));
    cfg.blockDim = dim3(shape<N, WGS>::THREADS);
    cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, skinny_wgmma_kernel<N, WGS, epi::plain>, &cfg) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    fit[splits] = n > 0 ? n : -1;
  }
  return fit[splits] >= clusters;
}

// The product's shape and outputs; the launchers add the split and the stages.
params params_of(const skinny_gemm_args& a) {
  params p{};
  p.bias = a.bias;
  p.out = a.out;
  p.rows = a.rows;
  p.n = a.n;
  p.ktiles = (a.cols + BK - 1) / BK;
  return p;
}

// `parts` (launch_skinny_wgmma_split_parts): the same blocks, K splits and sums, but each split's f32
// tile goes to parts[split][token][row] (the slices epilogue, no cluster) for the consumer to add up;
// returns 0 without launching where the product would not be split. Else the splits launched (1: none).
template <int N, int WGS>
int launch_cfg(const skinny_gemm_args& a, bool pdl, bool push, float* parts, int max_parts, int sms, cudaStream_t s) {
  using S = shape<N, WGS>;
  CUtensorMap tw, tx;
  if (!make_map(&tw, a.w, a.cols, a.rows, S::BM) || !make_map(&tx, a.x, a.cols, a.n, N)) return 0;
  static const int force_splits = env_int("SKINNY_WGMMA_SPLITS"), force_stages = env_int("SKINNY_WGMMA_STAGES");
  static const bool no_pdl = env_int("SKINNY_WGMMA_NOPDL") != 0;
  static const int evict_first = env_int("SKINNY_WGMMA_EVICT");
  static const int only = env_int("SKINNY_WGMMA_ONLY");  // timing: 1 = split grids only, 2 = unsplit only
  params p = params_of(a);
  p.evict_first = evict_first;
  const int tiles = (a.rows + S::BM - 1) / S::BM;
  // Row tiles that leave a quarter of the GPU idle: split K over a cluster while the blocks stay
  // within one an SM and each split keeps ≥ 2 k tiles.
  int splits = 1;
  if (tiles * 4 <= sms * 3) {
    while (splits < MAX_SPLITS && tiles * splits * 2 <= sms && p.ktiles >= splits * 4) splits *= 2;
  }
  if (force_splits > 0) splits = std::min(force_splits, MAX_SPLITS);
  if (parts != nullptr) {
    // No cluster, so no fit check to pass: the most stages one block an SM holds.
    if constexpr (WGS == 2) {
      if (splits == 1 || splits > max_parts || only == 2) return 0;
      p.parts = parts;
      p.splits = splits;
      p.stages = std::clamp((smem_limit - HEAD_BYTES) / S::STAGE, 2, MAX_STAGES);
      launch_kx(launch_extras{pdl && !no_pdl, -1, 1}, skinny_wgmma_kernel<N, 2, epi::slices>,
                dim3(static_cast<unsigned>(tiles * splits)), dim3(S::THREADS),
                static_cast<std::size_t>(HEAD_BYTES + p.stages * S::STAGE), s, tw, tx, p);
      return splits;
    } else {
      return 0;  // 256-row blocks fill the GPU unsplit
    }
  }
  // push: the 128-row blocks' instance only (256-row blocks fill the GPU without a K split), and
  // splits that divide the block's rows (SKINNY_WGMMA_SPLITS may force others).
  const bool pushed = push && splits > 1 && WGS == 2 && S::BM % splits == 0;
  const int epi_bytes = pushed ? S::PUSH_BYTES : S::RED_BYTES;  // the epilogue's area over the ring
  // The most stages, unless the clusters would then not all fit at once (an SM each, grouped by
  // GPC): then the stages of two blocks an SM. (Session 5, call 3: the stages of two blocks an SM
  // wherever ≥ 4 fit, for more PDL overlap with the neighbouring kernels, made the b=64 step 50 µs
  // slower and gate_up 2 µs slower.)
  const int full_budget = smem_limit - HEAD_BYTES, half = (smem_limit + 1024) / 2 - 1024 - HEAD_BYTES;
  int budget = full_budget;
  if (splits > 1 && !clusters_fit<N, WGS>(splits, tiles,
                                          HEAD_BYTES + std::max(std::min(MAX_STAGES, full_budget / S::STAGE) * S::STAGE,
                                                                epi_bytes))) {
    budget = half;
  }
  int stages = std::clamp(budget / S::STAGE, 2, MAX_STAGES);
  if (force_stages > 0) stages = std::clamp(force_stages, 2, std::min(MAX_STAGES, (smem_limit - HEAD_BYTES) / S::STAGE));
  p.stages = stages;
  p.splits = splits;
  if ((only == 1 && splits == 1) || (only == 2 && splits > 1)) return 0;
  int grid = tiles * splits;
  if (splits == 1) {
    p.rows_per_block = tiles <= sms ? S::BM : (a.rows + sms - 1) / sms;
    grid = (a.rows + p.rows_per_block - 1) / p.rows_per_block;
  }
  p.stamps = stamps_for(a.n, a.rows, a.cols, grid, splits, stages);
  const auto kernel = pushed ? skinny_wgmma_kernel<N, 2, epi::push> : skinny_wgmma_kernel<N, WGS, epi::plain>;
  launch_kx(launch_extras{pdl && !no_pdl, -1, splits}, kernel, dim3(static_cast<unsigned>(grid)), dim3(S::THREADS),
            static_cast<std::size_t>(HEAD_BYTES + std::max(stages * S::STAGE, epi_bytes)), s, tw, tx, p);
  return splits;
}

// Slices mode: 64-row tiles (one consumer warpgroup), K cut into S ≤ max_splits slices of
// separate blocks (no cluster: a cluster of S can only start where S SMs of one GPC are free, which
// after a kernel that fills every SM is late), S the most that keeps the grid within one block an
// SM and ≥ 4 k tiles a slice; 0 (nothing launched) where S would be 1 or the maps fail.
template <int N>
int launch_slices(const skinny_gemm_args& a, float* parts, int max_splits, bool pdl, int sms, cudaStream_t s) {
  using S = shape<N, 1>;
  params p = params_of(a);
  p.bias = nullptr;
  p.out = nullptr;
  p.parts = parts;
  const int tiles = (a.rows + S::BM - 1) / S::BM;
  int splits = 1;
  while (splits * 2 <= std::min(max_splits, MAX_SPLITS) && tiles * splits * 2 <= sms && p.ktiles >= splits * 2 * 4) {
    splits *= 2;
  }
  if (splits == 1) return 0;
  CUtensorMap tw, tx;
  if (!make_map(&tw, a.w, a.cols, a.rows, S::BM) || !make_map(&tx, a.x, a.cols, a.n, N)) return 0;
  p.splits = splits;
  const int per = (p.ktiles + splits - 1) / splits;
  p.stages = std::clamp(std::min((smem_limit - HEAD_BYTES) / S::STAGE, per), 2, MAX_STAGES);
  launch_kx(launch_extras{pdl, -1, 1}, skinny_wgmma_kernel<N, 1, epi::slices>, dim3(static_cast<unsigned>(tiles * splits)),
            dim3(S::THREADS), static_cast<std::size_t>(HEAD_BYTES + std::max(p.stages * S::STAGE, S::RED_BYTES)), s,
            tw, tx, p);
  return splits;
}

// SwiGLU mode: two consumer warpgroups (gate, up) of BM / 2 = 64 rows each, no split (gate_up's
// 2 ffn rows fill the GPU at decode sizes), the exchange tile after the ring.
template <int N>
bool launch_swiglu(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s) {
  using S = shape<N, 2>;
  constexpr int HALF_ROWS = S::BM / 2;
  constexpr int XCH_BYTES = S::CONSUMERS / 2 * (N / 2) * 4;
  if (a.rows % 2 != 0) return false;
  const int ffn = a.rows / 2;
  CUtensorMap tw, tx;
  if (!make_map(&tw, a.w, a.cols, a.rows, HALF_ROWS) || !make_map(&tx, a.x, a.cols, a.n, N)) return false;
  params p = params_of(a);
  p.rows = ffn;
  p.ffn = ffn;
  p.splits = 1;
  const int tiles = (ffn + HALF_ROWS - 1) / HALF_ROWS;
  p.rows_per_block = tiles <= sms ? HALF_ROWS : (ffn + sms - 1) / sms;
  const int grid = (ffn + p.rows_per_block - 1) / p.rows_per_block;
  // Timing overrides (bench/NOTES.md, session 16: why the 64-token tile loses in a step).
  static const int force_stages = env_int("SKINNY_WGMMA_SWIGLU_STAGES");
  static const bool no_pdl = env_int("SKINNY_WGMMA_SWIGLU_NOPDL") != 0;
  const int most = std::clamp((smem_limit - HEAD_BYTES - XCH_BYTES) / S::STAGE, 2, MAX_STAGES);
  p.stages = force_stages > 0 ? std::clamp(force_stages, 2, most) : most;
  launch_kx(launch_extras{pdl && !no_pdl, -1, 1}, skinny_wgmma_kernel<N, 2, epi::swiglu>, dim3(static_cast<unsigned>(grid)), dim3(S::THREADS),
            static_cast<std::size_t>(HEAD_BYTES + p.stages * S::STAGE + XCH_BYTES), s, tw, tx, p);
  return true;
}

template <int N>
int launch_n(const skinny_gemm_args& a, bool pdl, bool push, float* parts, int max_parts, int sms, cudaStream_t s) {
  static const int force_bm = env_int("SKINNY_WGMMA_BM");
  // 256-row blocks halve the activation tiles' re-reads from L2 (n / 256 of the weight bytes instead
  // of n / 128) where there are rows enough to fill the GPU with them.
  const bool wide = force_bm != 0 ? force_bm == 256 : a.rows >= 256 * sms;
  return wide ? launch_cfg<N, 4>(a, pdl, push, parts, max_parts, sms, s)
              : launch_cfg<N, 2>(a, pdl, push, parts, max_parts, sms, s);
}

template <int N, int WGS, epi E>
void allow_smem() {
  using S = shape<N, WGS>;
  static_assert(HEAD_BYTES + std::max(S::RED_BYTES, S::PUSH_BYTES) <= smem_limit && HEAD_BYTES + 2 * S::STAGE <= smem_limit,
                "smem");
  static_assert(E != epi::swiglu || HEAD_BYTES + 2 * S::STAGE + S::CONSUMERS / 2 * (N / 2) * 4 <= smem_limit,
                "smem (swiglu)");
  CONVEYOR_CUDA_CHECK(
      cudaFuncSetAttribute(skinny_wgmma_kernel<N, WGS, E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_limit));
}
template <int N>
void allow_smem_n() {  // every instance the launchers use at this N
  allow_smem<N, 2, epi::plain>();
  allow_smem<N, 4, epi::plain>();
  allow_smem<N, 1, epi::slices>();
  allow_smem<N, 2, epi::slices>();
  allow_smem<N, 2, epi::swiglu>();
  allow_smem<N, 2, epi::push>();
}

}  // namespace

bool skinny_wgmma_supported(int n, int rows, int cols) {
  return n >= 1 && n <= skinny_gemm_max_tokens && rows >= 1 && cols >= 8 && cols % 8 == 0;
}

bool skinny_wgmma_init() {
  int dev = 0, major = 0;
  CONVEYOR_CUDA_CHECK(cudaGetDevice(&dev));
  CONVEYOR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9 || encoder() == nullptr) return false;  // wgmma is sm_90a's alone
  if (env_int("SKINNY_WGMMA_STAMPS") != 0 && stamps().buf == nullptr) {
    const std::size_t bytes = sizeof(unsigned long long) * stamp_launches * stamp_max_blocks * stamp_slots;
    CONVEYOR_CUDA_CHECK(cudaMalloc(&stamps().buf, bytes));
    CONVEYOR_CUDA_CHECK(cudaMemset(stamps().buf, 0, bytes));
  }
  allow_smem_n<32>();
  allow_smem_n<64>();
  allow_smem_n<96>();
  allow_smem_n<128>();
  return true;
}

// Token tiles of 32, 64, 96 and 128 (wgmma's N): padding tokens cost math and x bytes, not weight bytes.
// launch(std::integral_constant<int, N>) with the smallest tile that holds n tokens.
namespace {
template <class F>
auto by_token_tile(int n, F&& launch) {
  if (n <= 32) return launch(std::integral_constant<int, 32>{});
  if (n <= 64) return launch(std::integral_constant<int, 64>{});
  if (n <= 96) return launch(std::integral_constant<int, 96>{});
  return launch(std::integral_constant<int, 128>{});
}
int launch_any_n(const skinny_gemm_args& a, bool pdl, bool push, float* parts, int max_parts, int sms,
                 cudaStream_t s) {
  return by_token_tile(a.n, [&](auto N) { return launch_n<N()>(a, pdl, push, parts, max_parts, sms, s); });
}
}  // namespace

bool launch_skinny_wgmma(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s, bool push_reduce) {
  return launch_any_n(a, pdl, push_reduce, nullptr, 0, sms, s) > 0;
}

int launch_skinny_wgmma_split_parts(const skinny_gemm_args& a, float* parts, int max_splits, bool pdl, int sms,
                                    cudaStream_t s) {
  return launch_any_n(a, pdl, false, parts, max_splits, sms, s);
}

bool launch_skinny_wgmma_swiglu(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s) {
  return by_token_tile(a.n, [&](auto N) { return launch_swiglu<N()>(a, pdl, sms, s); });
}

int launch_skinny_wgmma_slices(const skinny_gemm_args& a, float* parts, int max_splits, bool pdl, int sms,
                               cudaStream_t s) {
  return by_token_tile(a.n, [&](auto N) { return launch_slices<N()>(a, parts, max_splits, pdl, sms, s); });
}

namespace {

// The q-quantile (0..1) of v (sorted in place); 0 where empty.
double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int skinny_wgmma_stamps_report(std::FILE* f) {
  stamp_state& st = stamps();
  if (st.buf == nullptr) return 0;
  CONVEYOR_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h(static_cast<std::size_t>(stamp_launches) * stamp_max_blocks * stamp_slots);
  CONVEYOR_CUDA_CHECK(cudaMemcpy(h.data(), st.buf, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
  // Columns: µs after the launch's earliest consumer wait release (its predecessor's end, as
  // near as a block can see it); median / max over the blocks (entry: min / median).
  std::fprintf(f,
               "[wgmma-stamps] slot n rows cols grid splits stages | entry min/med | issued med | wait min/med/max | "
               "stage0 med/max | stage%d med/max | mma med/max | reduce med/max | exit med/max | t0_us\n",
               stamp_slot::stages_seen - 1);
  int printed = 0;
  unsigned long long base = 0;
  for (int l = 0; l < std::min(st.next, stamp_launches); ++l) {
    const unsigned long long* b = h.data() + static_cast<std::size_t>(l) * stamp_max_blocks * stamp_slots;
    if (b[stamp_slot::waited] == 0) continue;
    if (base == 0 || b[stamp_slot::waited] < base) base = b[stamp_slot::waited];
  }
  for (int l = 0; l < std::min(st.next, stamp_launches); ++l) {
    const stamp_launch& la = st.launches[l];
    const unsigned long long* b = h.data() + static_cast<std::size_t>(l) * stamp_max_blocks * stamp_slots;
    unsigned long long t0 = ~0ull;
    for (int k = 0; k < la.grid; ++k) {
      const unsigned long long w = b[k * stamp_slots + stamp_slot::waited];
      if (w != 0) t0 = std::min(t0, w);
    }
    if (t0 == ~0ull) continue;
    auto col = [&](int slot) {
      std::vector<double> v;
      for (int k = 0; k < la.grid; ++k) {
        const unsigned long long x = b[k * stamp_slots + slot];
        if (x != 0) v.push_back((static_cast<double>(x) - static_cast<double>(t0)) * 1e-3);
      }
      return v;
    };
    auto e = col(stamp_slot::entry), is = col(stamp_slot::issued), w = col(stamp_slot::waited);
    auto s0 = col(stamp_slot::stage0), sl = col(stamp_slot::stage0 + stamp_slot::stages_seen - 1);
    auto m = col(stamp_slot::mma_done), r = col(stamp_slot::reduce), x = col(stamp_slot::exit);
    std::fprintf(f,
                 "[wgmma-stamps] %2d %3d %6d %5d %4d %d %d | %6.2f %6.2f | %6.2f | %5.2f %5.2f %5.2f | %5.2f %5.2f | "
                 "%5.2f %5.2f | %5.2f %5.2f | %5.2f %5.2f | %5.2f %5.2f | %.1f\n",
                 l, la.n, la.rows, la.cols, la.grid, la.splits, la.stages, quantile(e, 0.0), quantile(e, 0.5),
                 quantile(is, 0.5), quantile(w, 0.0), quantile(w, 0.5), quantile(w, 1.0), quantile(s0, 0.5),
                 quantile(s0, 1.0), quantile(sl, 0.5), quantile(sl, 1.0), quantile(m, 0.5), quantile(m, 1.0),
                 quantile(r, 0.5), quantile(r, 1.0), quantile(x, 0.5), quantile(x, 1.0),
                 (static_cast<double>(t0) - static_cast<double>(base)) * 1e-3);
    ++printed;
  }
  return printed;
}

}  // namespace conveyor::kernels::cuda
