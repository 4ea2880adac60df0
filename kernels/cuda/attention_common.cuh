#pragma once
// What attention.cu and attention_prefill.cu both use (internal to kernels/cuda): the 4-warp block of
// the CUDA-core and tensor-core kernels, the paged cache's element index, the mma.sync fragment
// helpers (bf16 pairs, ldmatrix, cp.async), and the tensor-core prefill's launcher.
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "device_types.cuh"
#include "launch.hpp"

namespace conveyor::kernels::cuda::attention_detail {

constexpr int warps = 4;
constexpr int block_threads = warps * 32;

/// Cache element index of key `j` of a sequence (its block table row `table`), kv head `kvh`.
__device__ __forceinline__ std::size_t cache_index(const std::int32_t* table, int block_size, int j, int kv_heads,
                                                   int kvh, int head_dim) {
  const std::size_t slot = static_cast<std::size_t>(table[j / block_size]) * block_size + j % block_size;
  return (slot * kv_heads + kvh) * head_dim;
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/// Zeroes a warp's f32 accumulator fragments of D output columns (D / 8 n8 tiles).
template <int D>
__device__ __forceinline__ void zero_fragments(float (&o)[D / 8][4]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.0f;
}

/// bf16 prefill attention on tensor cores (head_dim 64 or 128, heads a multiple of kv_heads):
/// prefill_gqa_tc_kernel where `gqa` and the group is 1, 2, 4 or 8, else prefill_tc_kernel
/// (attention_prefill.cu).
void launch_prefill_tc(const __nv_bfloat16* qkv, const attn_shape& sh, const attention_batch& b,
                       const kv_layout& layout, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                       bool gqa, cudaStream_t s);

}  // namespace conveyor::kernels::cuda::attention_detail
