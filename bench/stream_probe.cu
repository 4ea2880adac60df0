// stream_probe: how fast a bulk-copy (TMA) weight stream into shared memory reads HBM on this GPU,
// by the shape of the stream alone: copies a stage, bytes a copy, stride between a stage's pieces,
// stages in flight, blocks an SM, who hands a stage back. No arithmetic: the consumers only wait for
// a stage and release it, as the fused decode kernel's stream_only mode does (bench/NOTES.md,
// session 10: that stream ran at 2.2-2.5 TB/s where the GEMV's reads the same bytes at ~4 TB/s; this
// tool separates the shapes the two differ in). A plain 16-byte-load kernel is the reference.
//
// usage: stream_probe [MB [CONFIG...]]   (MB of weights a run reads, default 256; every run reads a
//        region the runs before it did not touch, so nothing comes from L2; a CONFIG is
//        bps,stages,pieces,piece,row,order,release,issue and replaces the named rows)
// A configuration: bps (blocks an SM), stages, pieces (P rows a stage), piece bytes S, row bytes R,
// order (0: block b takes tiles b, b + grid, ...; 1: a contiguous run of tiles; 2: gate/up pairs,
// two pieces R bytes apart in matrices of 2R, stages interleaved over the blocks; 3: the fused
// decode kernel's stream of the 1B's 16 layers, 16 KB stages; 4: the same with gate_up's stages one
// contiguous 16 KB instead of gate and up halves 32 MB apart), release (0: the
// stage's warp (stage mod 8, or its slot's with fewer than 8 stages) alone; 1: all 8 warps), issue
// (0: lane p issues piece p; 1: lane 0 issues all pieces), and optionally skew (bytes the ring starts
// past a 1024-byte boundary).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.hpp"
#include "mbarrier.cuh"

namespace cuda = conveyor::kernels::cuda;

namespace {

struct config {
  int bps, stages, pieces, piece, row, order, release, issue;
  int skew;  // bytes the ring starts past its 1024-byte aligned place (a multiple of 16)
};

struct probe_args {
  const unsigned char* src;
  long long bytes;  // multiple of row × pieces
  int stages, pieces, piece, row, order, release, issue, skew;
};

constexpr int warps = 8;

// order 3: the fused decode kernel's whole stream for Llama-3.2-1B's 16 layers, laid out back to
// back: per layer qkv (3072 × 2048), o (2048 × 2048), gate_up (2 × 8192 × 2048: a stage is two
// rows of gate and the same two rows of up, 32 MB further), down (2048 × 8192), each cut into
// 16 KB stages that block b takes as b, b + grid, ...
__host__ __device__ constexpr long long l1b_matrix_bytes(int m) {
  return m == 0 ? 3072LL * 2048 * 2 : m == 1 ? 2048LL * 2048 * 2 : m == 2 ? 2LL * 8192 * 2048 * 2 : 2048LL * 8192 * 2;
}
constexpr long long l1b_layer_bytes = l1b_matrix_bytes(0) + l1b_matrix_bytes(1) + l1b_matrix_bytes(2) + l1b_matrix_bytes(3);
constexpr int l1b_layers = 16;
constexpr int l1b_stage = 16384;
__device__ long long l1b_count(int m) {  // this block's stages of matrix m
  const long long n = l1b_matrix_bytes(m) / l1b_stage;
  return n > blockIdx.x ? (n - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
}
struct l1b_cursor {  // the producer's place in the stream
  int l = 0, m = 0;
  long long k = 0;
  __device__ void settle() {
    while (l < l1b_layers && k >= l1b_count(m)) {
      k = 0;
      if (++m == 4) m = 0, ++l;
    }
  }
  __device__ long long offset(bool pairs) const {  // of the stage's first byte
    long long o = l * l1b_layer_bytes;
    for (int i = 0; i < m; ++i) o += l1b_matrix_bytes(i);
    const long long s = k * gridDim.x + blockIdx.x;
    if (m == 2 && pairs) return o + s * (l1b_stage / 2);  // gate rows here, up rows 32 MB on
    return o + s * l1b_stage;
  }
};

__global__ void __launch_bounds__(warps * 32 + 32) probe_kernel(probe_args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + 64;
  unsigned char* ring = smem + 1024 + a.skew;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < a.stages; ++i) {
      cuda::mbar_init(full + i, 1);
      cuda::mbar_init(empty + i, a.release ? warps : 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const long long tile_bytes = static_cast<long long>(a.row) * a.pieces;
  const long long tiles = a.bytes / tile_bytes;
  const int slices = a.row / a.piece;
  long long t0, tstep, tn;  // this block's tiles: t0, t0 + tstep, ... (tn of them)
  if (a.order == 0) {
    t0 = blockIdx.x;
    tstep = gridDim.x;
    tn = tiles > t0 ? (tiles - t0 + tstep - 1) / tstep : 0;
  } else {
    t0 = tiles * blockIdx.x / gridDim.x;
    tstep = 1;
    tn = tiles * (blockIdx.x + 1) / gridDim.x - t0;
  }
  long long total = tn * slices;
  // order 2 (gate/up pairs, as the fused kernel's gate_up stages): matrices of 2 × row bytes, stage i
  // of one = piece i of its first half and piece i of its second (row bytes apart); global stage
  // s = k × grid + b is block b's k-th.
  const long long pair_spm = a.row / a.piece;  // stages a matrix
  if (a.order >= 3) {
    total = 0;
    for (int l = 0; l < l1b_layers; ++l)
      for (int m = 0; m < 4; ++m) total += l1b_count(m);
  }
  if (a.order == 2) {
    const long long stages_all = a.bytes / (2LL * a.row) * pair_spm;
    total = stages_all > blockIdx.x ? (stages_all - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  }
  auto piece_src = [&](long long u, int p) -> const unsigned char* {
    if (a.order == 2) {
      const long long s = blockIdx.x + u * gridDim.x, m = s / pair_spm, i = s % pair_spm;
      return a.src + m * 2LL * a.row + i * a.piece + static_cast<long long>(p) * a.row;
    }
    const long long t = t0 + (u / slices) * tstep;
    return a.src + t * tile_bytes + (u % slices) * a.piece + static_cast<long long>(p) * a.row;
  };
  const int stage_bytes = a.pieces * a.piece;
  // The producer's turn for stage u of `bytes`: its slot free again, its barrier armed; the slot.
  auto acquire = [&](long long u, int bytes) {
    const int slot = static_cast<int>(u % a.stages);
    const unsigned use = static_cast<unsigned>(u / a.stages);
    if (use > 0) cuda::mbar_wait(empty + slot, (use - 1) & 1);
    if (lane == 0) cuda::mbar_expect_tx(full + slot, static_cast<unsigned>(bytes));
    __syncwarp();
    return slot;
  };
  if (warp == warps && a.order >= 3) {
    const bool pairs = a.order == 3;  // 4: gate_up's stages as one contiguous 16 KB instead
    l1b_cursor c;
    c.settle();
    for (long long u = 0; u < total; ++u, ++c.k, c.settle()) {
      const int slot = acquire(u, l1b_stage);
      unsigned char* dst = ring + static_cast<long long>(slot) * l1b_stage;
      const unsigned char* src = a.src + c.offset(pairs);
      if (lane == 0 && c.m == 2 && pairs) {
        cuda::bulk_copy(dst, src, l1b_stage / 2, full + slot);
        cuda::bulk_copy(dst + l1b_stage / 2, src + l1b_matrix_bytes(2) / 2, l1b_stage / 2, full + slot);
      } else if (lane == 0) {
        cuda::bulk_copy(dst, src, l1b_stage, full + slot);
      }
    }
    return;
  }
  if (warp == warps) {
    for (long long u = 0; u < total; ++u) {
      const int slot = acquire(u, stage_bytes);
      unsigned char* dst = ring + static_cast<long long>(slot) * stage_bytes;
      if (a.issue == 0) {
        for (int p = lane; p < a.pieces; p += 32) cuda::bulk_copy(dst + p * a.piece, piece_src(u, p), a.piece, full + slot);
      } else if (lane == 0) {
        for (int p = 0; p < a.pieces; ++p) cuda::bulk_copy(dst + p * a.piece, piece_src(u, p), a.piece, full + slot);
      }
    }
    return;
  }
  // With fewer stages than warps, stage u's warp is its slot's, so a slot has one consumer and a
  // parity wait cannot alias a phase two behind.
  const int owners = a.stages < warps ? a.stages : warps;
  for (long long u = 0; u < total; ++u) {
    if (!a.release && static_cast<int>(u % owners) != warp) continue;
    const int slot = static_cast<int>(u % a.stages);
    const unsigned use = static_cast<unsigned>(u / a.stages);
    // As fused_decode.cu's consume(): with more stages than warps the slot's previous use belongs to
    // another warp; wait until it was released before waiting for this use's phase.
    if (!a.release && use > 0) cuda::mbar_wait(empty + slot, (use - 1) & 1);
    cuda::mbar_wait(full + slot, use & 1);
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive(empty + slot);
  }
}

// The reference: every thread streams 16-byte loads (eight in flight), as a plain GEMV would.
__global__ void __launch_bounds__(256) load_kernel(const uint4* src, long long n, unsigned* sink) {
  unsigned acc = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  const long long mb = argc > 1 ? std::strtoll(argv[1], &end, 10) : 256;
  if (argc > 1 && (*end != '\0' || mb < 1 || mb > 16384)) {
    std::fprintf(stderr, "stream_probe: bad MB '%s' (want 1 to 16384: the MB a run reads)\n", argv[1]);
    return 2;
  }
  const long long bytes = mb << 20;
  // Named rows: the fused kernel's stream today, the GEMV's (96 KB ring, two blocks an SM), and the
  // steps between them one at a time.
  std::vector<config> cfgs = {
      // bps stages P  S      R      order release issue
      {1, 12, 1, 16384, 16384, 0, 0, 0},  // fused today: 16 KB contiguous stages, interleaved tiles
      {1, 12, 1, 16384, 16384, 1, 0, 0},  // fused, contiguous shares (session 10's first rate)
      {2, 6, 1, 16384, 16384, 0, 0, 0},   // fused shape, two blocks an SM
      {1, 12, 1, 16384, 16384, 0, 1, 0},  // fused shape, all warps release
      {2, 3, 16, 2048, 4096, 0, 1, 0},    // GEMV today (gate_up, K = 2048)
      {2, 3, 16, 2048, 16384, 0, 1, 0},   // GEMV on down's rows (K = 8192)
      {1, 6, 16, 2048, 4096, 0, 1, 0},    // GEMV shape, one block an SM
      {1, 6, 16, 2048, 4096, 0, 0, 0},    // GEMV shape, one block, one warp a stage
      {1, 6, 16, 2048, 4096, 0, 1, 1},    // GEMV shape, lane 0 issues all 16
      {1, 12, 8, 2048, 4096, 0, 0, 0},    // 16 KB stages of 8 strided 2 KB pieces
      {1, 12, 4, 4096, 4096, 0, 0, 0},    // 16 KB stages of 4 whole 4 KB rows (one copy a row)
      {1, 12, 16, 1024, 4096, 0, 0, 0},   // 16 KB stages of 16 strided 1 KB pieces
      {1, 24, 1, 8192, 8192, 0, 0, 0},    // 8 KB stages, 24 in flight
      {1, 48, 1, 4096, 4096, 0, 0, 0},    // 4 KB stages, 48 in flight
      {1, 6, 1, 32768, 32768, 0, 0, 0},   // 32 KB stages
      {1, 3, 1, 65536, 65536, 0, 0, 0},   // 64 KB stages
      {2, 6, 4, 4096, 4096, 0, 0, 0},     // 4 whole rows a stage, two blocks an SM
      {2, 3, 16, 2048, 4096, 1, 1, 0},    // GEMV shape, contiguous shares
      {1, 4, 16, 2048, 4096, 0, 1, 0},    // GEMV shape, one block, 4 stages (128 KB)
      {1, 6, 16, 2048, 16384, 0, 0, 0},   // GEMV shape on down's rows, one block, one warp a stage
      {1, 3, 16, 2048, 16384, 0, 1, 0},   // down today (128 tiles: one block an SM, 96 KB ring)
      {1, 3, 16, 2048, 4096, 0, 1, 0},    // GEMV shape, one block an SM with one block's ring
      {2, 3, 16, 2048, 8192, 0, 1, 0},    // down cut in two along K (two blocks an SM)
  };
  // Configurations on the command line (bps,stages,pieces,piece,row,order,release,issue each)
  // replace the named rows.
  if (argc > 2) {
    cfgs.clear();
    for (int i = 2; i < argc; ++i) {
      config c{};
      const int got = std::sscanf(argv[i], "%d,%d,%d,%d,%d,%d,%d,%d,%d", &c.bps, &c.stages, &c.pieces, &c.piece, &c.row,
                                  &c.order, &c.release, &c.issue, &c.skew);
      if ((got != 8 && got != 9) || c.bps < 1 || c.stages < 1 || c.pieces < 1 || c.piece < 16 || c.piece % 16 != 0 ||
          c.row < c.piece || c.skew < 0 || c.skew % 16 != 0 || c.order < 0 || c.order > 4 ||
          (c.order == 2 && c.pieces != 2) || (c.order >= 3 && (c.pieces != 1 || c.piece != 16384 || c.row != 16384))) {
        std::fprintf(stderr, "stream_probe: bad configuration '%s' (want bps,stages,pieces,piece,row,order,release,issue"
                             "[,skew] with piece and skew multiples of 16, row >= piece, order 0-4, 2 pieces"
                             " with order 2, one 16384-byte piece and row with orders 3 and 4)\n", argv[i]);
        return 2;
      }
      cfgs.push_back(c);
    }
  }
  int dev = 0, sms = 0;
  CONVEYOR_CUDA_CHECK(cudaGetDevice(&dev));
  CONVEYOR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int regions = 8;  // runs rotate over 8 regions: 2 GB at 256 MB, far past the 50 MB L2
  unsigned char* buf = nullptr;
  unsigned* sink = nullptr;
  CONVEYOR_CUDA_CHECK(cudaMalloc(&buf, bytes * regions));
  CONVEYOR_CUDA_CHECK(cudaMalloc(&sink, 4));
  CONVEYOR_CUDA_CHECK(cudaMemset(buf, 1, bytes * regions));
  CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  cudaEvent_t e0, e1;
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&e0));
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&e1));
  int run = 0;
  auto time_it = [&](auto launch) {
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
      const unsigned char* src = buf + (run++ % regions) * bytes;
      CONVEYOR_CUDA_CHECK(cudaEventRecord(e0));
      launch(src);
      CONVEYOR_CUDA_CHECK(cudaEventRecord(e1));
      CONVEYOR_CUDA_CHECK(cudaEventSynchronize(e1));
      CONVEYOR_CUDA_CHECK(cudaGetLastError());
      float ms = 0;
      CONVEYOR_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0 && ms < best) best = ms;  // the first run warms up
    }
    return best;
  };
  for (int bpsm : {4, 8}) {
    const float ms = time_it([&](const unsigned char* src) {
      load_kernel<<<sms * bpsm, 256>>>(reinterpret_cast<const uint4*>(src), bytes / 16, sink);
    });
    std::printf("ld16 blocks=%d x 256 threads: %.1f us, %.2f TB/s\n", sms * bpsm, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
  }
  std::printf("%-4s %-6s %-6s %-7s %-7s %-5s %-7s %-5s %-5s %10s %8s\n", "bps", "stages", "pieces", "piece", "row",
              "order", "release", "issue", "skew", "us", "TB/s");
  for (const config& c : cfgs) {
    const int stage_bytes = c.pieces * c.piece;
    const std::size_t smem = 1024 + static_cast<std::size_t>(c.skew) + static_cast<std::size_t>(c.stages) * stage_bytes;
    if (smem > 227u * 1024 || c.stages > 64 || c.pieces > 32 || c.row % c.piece != 0) {
      std::printf("%-4d %-6d %-6d %-7d %-7d %-5d %-7d %-5d %-5d   (does not fit: %zu B a block)\n", c.bps, c.stages,
                  c.pieces, c.piece, c.row, c.order, c.release, c.issue, c.skew, smem);
      continue;
    }
    probe_args a{};
    a.bytes = bytes / (static_cast<long long>(c.row) * c.pieces) * c.row * c.pieces;
    if (c.order == 2 && a.bytes < 2LL * c.row) {
      std::printf("(order 2 needs a run of at least 2 x row bytes)\n");
      continue;
    }
    if (c.order >= 3 && bytes < l1b_layers * l1b_layer_bytes) {
      std::printf("(order 3 needs a run of at least %lld MB)\n", (l1b_layers * l1b_layer_bytes >> 20) + 1);
      continue;
    }
    if (c.order >= 3) a.bytes = l1b_layers * l1b_layer_bytes;
    a.stages = c.stages;
    a.pieces = c.pieces;
    a.piece = c.piece;
    a.row = c.row;
    a.order = c.order;
    a.release = c.release;
    a.issue = c.issue;
    a.skew = c.skew;
    const float ms = time_it([&](const unsigned char* src) {
      a.src = src;
      probe_kernel<<<sms * c.bps, warps * 32 + 32, smem>>>(a);
    });
    int resident = 0;
    CONVEYOR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, probe_kernel, warps * 32 + 32, smem));
    std::printf("%-4d %-6d %-6d %-7d %-7d %-5d %-7d %-5d %-5d %10.1f %8.2f%s\n", c.bps, c.stages, c.pieces, c.piece,
                c.row, c.order, c.release, c.issue, c.skew, ms * 1e3, a.bytes / (ms * 1e-3) / 1e12,
                resident < c.bps ? "  (fewer blocks an SM fit)" : "");
  }
  return 0;
}
