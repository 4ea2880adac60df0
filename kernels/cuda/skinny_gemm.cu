// Skinny bf16 linear for decode batches (1 ≤ n ≤ 128 tokens; meant for 17..128):
// out[n, rows] = x[n, cols] · Wᵀ (+ bias). At n = 64 the weights are ~16× the activations, so the
// kernel is meant to be a weight stream: cuBLAS ran the 1B's layer GEMMs at 966 µs a step against a
// 584 µs weight-read floor, partly in a separate split-K reduce kernel (bench/NOTES.md, session 3).
// Measured (session 4): slower than cuBLAS on the 1B's shapes at n = 64 (b=64 step 1.63 vs 1.34 ms),
// faster on o_proj and on Qwen2-1.5B's fused qkv (2048×1536); so it is opt-in
// (cuda_backend_options::skinny_gemm). ncu: neither DRAM (53%), L2, the tensor pipe (27%) nor issue
// is saturated; the 128-byte-per-row stage reads wait ~5 µs (bench/NOTES.md has the next steps).
//
// A block owns BM = 128 weight rows and a K range. Its W tile and the matching x tile (all n tokens)
// go through a STAGES-deep cp.async ring in shared memory (16 KB of weights per stage, 48 KB ahead
// of the math), 8 warps as 4 (rows) × 2 (tokens) compute on mma.sync m16n8k16 with W as A, and the
// accumulators hold the block's whole [n × 128] output tile.
//
// Where row tiles alone do not fill the GPU (qkv, o_proj, down_proj), K is split over S ≤ 8 blocks
// of one thread-block cluster: each writes its f32 tile into its own shared memory, and after a
// cluster barrier every block sums 1/S of the tile over the S blocks' shared memory (distributed
// shared memory, fixed order: deterministic) and writes it. No workspace, no second kernel.
//
// k order: as in gemv.cu, lane q's 8 contiguous k (one 16-byte shared load) feed logical k 2q, 2q+1,
// 2q+8, 2q+9 of two mmas; A and B use the same permutation, so every dot product is the same sum.
// Shared rows are 128 bytes (BK = 64 bf16) with 16-byte chunk c of row r stored at c ^ 4·(r & 1):
// the 8 lanes of a load phase (rows g, g+1; chunks q) then hit 32 distinct banks.
//
// Programmatic dependent launch: the first stages' weights are requested before griddepcontrol.wait
// (weights never depend on the previous kernel); x is read and out written only after it.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "device_types.cuh"
#include "linear_epilogue.cuh"
#include "mbarrier.cuh"
#include "skinny_gemm.hpp"

namespace conveyor::kernels::cuda {

namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int BK = 64;        // k per stage (one 128-byte shared row)
constexpr int THREADS = 256;  // 8 warps: WM along rows × 8 / WM along tokens
constexpr int STAGES = 4;
constexpr int MAX_SPLITS = 8;  // portable cluster size

// WM warps along rows with MT 16-row mma tiles each (BM = 16 · WM · MT rows a block); 8 / WM warps
// along tokens with NTW 8-token mma tiles each (NP = 8 · NTW · 8 / WM tokens, n padded up to it).
template <int WM, int MT, int NTW>
struct shape {
  static constexpr int WN = 8 / WM;
  static constexpr int BM = 16 * WM * MT;
  static constexpr int NP = 8 * NTW * WN;
  static constexpr int RED_PITCH = BM + 4;  // f32 reduction tile [token][row]: conflict-free fragment stores
  static constexpr int W_BYTES = BM * BK * 2;
  static constexpr int X_BYTES = NP * BK * 2;
  static constexpr int STAGE = W_BYTES + X_BYTES;
  static constexpr int RED_BYTES = NP * RED_PITCH * 4;
  static constexpr int SMEM = STAGE * STAGES > RED_BYTES ? STAGE * STAGES : RED_BYTES;
};

// 16 bytes global → shared; `bytes` = 0 fills zeros (past the end of K).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ int swz(int row, int chunk) { return chunk ^ ((row & 1) << 2); }

template <int WM, int MT, int NTW>
__global__ void __launch_bounds__(THREADS) skinny_gemm_kernel(skinny_gemm_args a) {
  using S = shape<WM, MT, NTW>;
  constexpr int BM = S::BM, RED_PITCH = S::RED_PITCH;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;
  const int wm = warp % WM, wn = warp / WM;
  const int rows = a.rows, cols = a.cols, n = a.n;
  const int row0 = blockIdx.y * BM;
  const int splits = gridDim.x, split = blockIdx.x;

  const int ktiles = (cols + BK - 1) / BK;
  const int per = (ktiles + splits - 1) / splits;
  const int kt0 = min(ktiles, split * per);
  const int nkt = min(ktiles, kt0 + per) - kt0;

  // Copy slots: thread tid moves 16-byte chunk tid % 8 of tile rows tid / 8 + 32 i (W: i < BM / 32,
  // x: i < NP / 32), so its shared offset within a tile is one number plus i · 4 KB, and its global
  // addresses advance by BK a k tile. (Recomputing them per copy cost ~11 instructions per mma.)
  constexpr int WI = BM / 32, XI = S::NP / 32;
  static_assert(S::NP % 32 == 0 && BM % 32 == 0, "copy slots");
  const int cr = tid / 8, cch = tid % 8;
  const int cpos = cr * 128 + swz(cr, cch) * 16;
  const uint4* wbase = reinterpret_cast<const uint4*>(a.w);
  const uint4* xbase = reinterpret_cast<const uint4*>(a.x);
  const int c16 = cols / 8;  // 16-byte chunks a row
  unsigned woff[WI], xoff[XI];
#pragma unroll
  for (int i = 0; i < WI; ++i) {  // rows past the end read a real row, never stored
    woff[i] = static_cast<unsigned>(min(row0 + cr + 32 * i, rows - 1)) * static_cast<unsigned>(c16) + cch;
  }
#pragma unroll
  for (int i = 0; i < XI; ++i) {  // padding tokens likewise
    xoff[i] = static_cast<unsigned>(min(cr + 32 * i, n - 1)) * static_cast<unsigned>(c16) + cch;
  }
  auto load_w = [&](int stage, int kt) {
    const int k8 = kt * (BK / 8);
    const bool in = k8 + cch < c16;
    unsigned char* dst = smem + stage * S::STAGE + cpos;
#pragma unroll
    for (int i = 0; i < WI; ++i) cp_async16(dst + i * 4096, in ? wbase + woff[i] + k8 : wbase, in ? 16 : 0);
  };
  auto load_x = [&](int stage, int kt) {
    const int k8 = kt * (BK / 8);
    const bool in = k8 + cch < c16;
    unsigned char* dst = smem + stage * S::STAGE + S::W_BYTES + cpos;
#pragma unroll
    for (int i = 0; i < XI; ++i) cp_async16(dst + i * 4096, in ? xbase + xoff[i] + k8 : xbase, in ? 16 : 0);
  };
  // Fragment offsets (rows (wm · MT + mt) · 16 + h · 8 + g, tokens wn · NTW · 8 + nt · 8 + g, chunk
  // kc · 4 + q); the row parity is g's, so the swizzle is per thread, the rest compile-time steps.
  const int a_row = wm * MT * 16 + g, b_row = wn * NTW * 8 + g;
  const int a_off0 = a_row * 128 + swz(g, q) * 16, a_off1 = a_row * 128 + swz(g, 4 + q) * 16;
  const int b_off0 = S::W_BYTES + b_row * 128 + swz(g, q) * 16, b_off1 = S::W_BYTES + b_row * 128 + swz(g, 4 + q) * 16;

  // Weights of the first stages before waiting on the previous kernel.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nkt) load_w(s, kt0 + s);
  grid_dep_wait();
  grid_dep_trigger();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) load_x(s, kt0 + s);
    cp_async_commit();  // group s holds x of stage s (group 0 also every early weight tile)
  }

  float acc[MT][NTW][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  int cur = 0, nxt = STAGES - 1;  // ring slots of k tile kt and of kt + STAGES - 1
  for (int kt = 0; kt < nkt; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt is in; stage kt - 1 is free (every warp finished it)
    if (kt + STAGES - 1 < nkt) {
      load_w(nxt, kt0 + kt + STAGES - 1);
      load_x(nxt, kt0 + kt + STAGES - 1);
    }
    cp_async_commit();
    const unsigned char* st = smem + cur * S::STAGE;
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {
      const unsigned char* wa = st + (kc == 0 ? a_off0 : a_off1);
      const unsigned char* xb = st + (kc == 0 ? b_off0 : b_off1);
      uint4 w[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) w[mt][h] = *reinterpret_cast<const uint4*>(wa + (mt * 16 + h * 8) * 128);
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xb + nt * 8 * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(acc[mt][nt], w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y, xv.x, xv.y);
          mma16816(acc[mt][nt], w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w, xv.z, xv.w);
        }
      }
    }
    cur = cur + 1 == STAGES ? 0 : cur + 1;
    nxt = nxt + 1 == STAGES ? 0 : nxt + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is reused as the reduction tile

  // Fragment (row g / g + 8, tokens 2q, 2q + 1) → red[token][row].
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = (wm * MT + mt) * 16 + g + (e >= 2 ? 8 : 0);
        const int t = wn * NTW * 8 + nt * 8 + 2 * q + (e & 1);
        red[t * RED_PITCH + r] = acc[mt][nt][e];
      }

  // Sum over the cluster's K splits (fixed order) and store; each block stores 1/splits of the tile.
  auto finish = [&](auto&& part) {
    constexpr int R4 = BM / 4;
    for (int i = split * THREADS + tid; i < n * R4; i += splits * THREADS) {
      const int t = i / R4, r = (i % R4) * 4;
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int p = 0; p < splits; ++p) {
        const float4 v = *reinterpret_cast<const float4*>(part(p) + t * RED_PITCH + r);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = row0 + r + j;
        if (row >= rows) break;
        store_linear_out(sv[j], a.bias, row, a.out + static_cast<std::size_t>(t) * rows + row);
      }
    }
  };
  if (splits == 1) {
    __syncthreads();
    finish([&](int) { return static_cast<const float*>(red); });
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's tile is in its shared memory
    finish([&](int p) { return static_cast<const float*>(cluster.map_shared_rank(red, p)); });
    cluster.sync();  // no block leaves while another still reads its shared memory
  }
}

template <int WM, int MT, int NTW>
int blocks_per_sm() {
  static const int per_sm = [] {  // the same on every device of a machine (one GPU model)
    int blocks = 0;
    CONVEYOR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, skinny_gemm_kernel<WM, MT, NTW>, THREADS,
                                                                      shape<WM, MT, NTW>::SMEM));
    return std::max(1, blocks);
  }();
  return per_sm;
}

template <int WM, int MT, int NTW>
void launch_cfg(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s) {
  using S = shape<WM, MT, NTW>;
  const int tiles = (a.rows + S::BM - 1) / S::BM;
  const int ktiles = (a.cols + BK - 1) / BK;
  // Split K while the grid stays within the blocks that fit at once and each split keeps ≥ 4 k tiles.
  int splits = 1;
  const int fit = blocks_per_sm<WM, MT, NTW>() * sms;
  while (splits < MAX_SPLITS && tiles * splits * 2 <= fit && ktiles >= splits * 8) splits *= 2;
  launch_kx(launch_extras{pdl, -1, splits}, skinny_gemm_kernel<WM, MT, NTW>,
            dim3(static_cast<unsigned>(splits), static_cast<unsigned>(tiles)), dim3(THREADS), S::SMEM, s, a);
}

template <int WM, int MT, int NTW>
void allow_smem() {
  CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<WM, MT, NTW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           shape<WM, MT, NTW>::SMEM));
}

}  // namespace

bool skinny_gemm_supported(int n, int rows, int cols) {
  return n >= 1 && n <= skinny_gemm_max_tokens && rows >= 1 && cols >= 8 && cols % 8 == 0;
}

void skinny_gemm_init() {
  allow_smem<4, 2, 2>();
  allow_smem<4, 2, 4>();
  allow_smem<4, 2, 6>();
  allow_smem<4, 2, 8>();
}

// 128-row blocks for every shape: 256 (warp tile 64 rows, x re-read a quarter as often) and 64 rows
// (more blocks for o_proj / down_proj) measured the same or slower (bench/NOTES.md, session 4).
void launch_skinny_gemm(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s) {
  if (a.n <= 32) return launch_cfg<4, 2, 2>(a, pdl, sms, s);
  if (a.n <= 64) return launch_cfg<4, 2, 4>(a, pdl, sms, s);
  if (a.n <= 96) return launch_cfg<4, 2, 6>(a, pdl, sms, s);
  return launch_cfg<4, 2, 8>(a, pdl, sms, s);
}

}  // namespace conveyor::kernels::cuda
