#pragma once
// Launcher of the Hopper skinny GEMM (skinny_wgmma.cu: TMA + wgmma, sm_90a), callable from host C++.
// Its own header rather than launch.hpp, so adding it does not rebuild every other kernel file.
#include <cuda_runtime.h>

#include <cstdio>

#include "skinny_gemm.hpp"

namespace conveyor::kernels::cuda {

/// Shapes launch_skinny_wgmma takes: 1 ≤ n ≤ skinny_gemm_max_tokens, cols a multiple of 8 (the
/// tensor map's row pitch is a multiple of 16 bytes); the caller also checks dtype and 16-byte alignment.
bool skinny_wgmma_supported(int n, int rows, int cols);
/// Raises the kernels' shared-memory limit on the current device and finds the driver's tensor-map
/// encoder; false where either is missing (then the caller keeps cuBLAS).
bool skinny_wgmma_init();
/// out[n, rows] = x[n, cols] · wᵀ (+ bias) on the wgmma kernel; false (nothing launched) when the
/// tensor maps could not be encoded. `pdl`: launch as a programmatic dependent of the previous kernel
/// (the first stages' weights are requested before it waits). `push_reduce`: where K is split over a
/// cluster, each block stores its partial sums into the block that owns those rows and the cluster
/// meets once, instead of twice around remote loads (the same sums in the same order: same bits).
bool launch_skinny_wgmma(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s, bool push_reduce = false);
/// out[n, ffn] = silu(gate) * up of the product x · gate_upᵀ (a.w: gate_up [2 ffn, cols], gate rows
/// first; a.rows = 2 ffn; a.out: [n, ffn]), one kernel instead of the GEMM and silu_mul, with the
/// same bf16 roundings as that pair; false (nothing launched) when the maps could not be encoded.
bool launch_skinny_wgmma_swiglu(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s);
/// The same product cut along K into S slices of separate blocks (64-row tiles, no cluster), each
/// slice's f32 sums without the bias in parts[s][n, rows] (as lt_gemm::run_split lays them out), for
/// a following kernel that sums the slices (launch_split_add_rmsnorm). S ≤ max_splits is the most
/// that keeps one block an SM; returns S, or 0 (nothing launched) where S would be 1 or the tensor
/// maps could not be encoded. a.bias and a.out are not used.
int launch_skinny_wgmma_slices(const skinny_gemm_args& a, float* parts, int max_splits, bool pdl, int sms,
                               cudaStream_t s);

/// launch_skinny_wgmma's blocks and K splits (128-row tiles, its cluster size S), each split's f32
/// sums without the bias stored to parts[s][n, rows] instead of summed in the cluster, for a consumer
/// that adds them up as the cluster does (0 + part 0 + part 1 + ..., then the bias and the bf16
/// rounding of store_linear_out: the same bits as launch_skinny_wgmma's output). Returns S, or 0
/// (nothing launched) where that launch would not split K, would split it more than max_splits
/// ways, or the tensor maps could not be encoded. parts holds S × n × rows floats.
int launch_skinny_wgmma_split_parts(const skinny_gemm_args& a, float* parts, int max_splits, bool pdl, int sms,
                                    cudaStream_t s);
inline constexpr int skinny_wgmma_max_splits = 8;

/// Diagnostics (bench): with SKINNY_WGMMA_STAMPS=1 in the environment when the backend starts, the
/// plain-epilogue launches stamp every block's progress (%globaltimer); this prints the last run of
/// each stamped launch (at most 64, in launch order, a captured graph's launches once each), µs after
/// its first block saw its predecessor finish. Returns the launches printed (0: stamping off).
int skinny_wgmma_stamps_report(std::FILE* f);

}  // namespace conveyor::kernels::cuda
