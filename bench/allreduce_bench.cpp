// All-reduce bus bandwidth of Conveyor's NCCL collective over the GPUs of this host: one thread per
// GPU, bf16 in place, timed over many iterations after a warm-up. Bus bandwidth as nccl-tests defines
// it: bytes × 2 (n − 1) / n / time. bench/multi_gpu_peer.py measures torch.distributed's all-reduce
// on the same GPUs in the same run.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/transport/nccl_collective.hpp"
#include "flag_values.hpp"

using namespace conveyor;

int main(int argc, char** argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::fprintf(stderr, "allreduce_bench: no GPU\n");
    return 1;
  }
  if (argc > 2) {
    std::fprintf(stderr, "allreduce_bench: one argument at most (the number of GPUs)\n");
    return 2;
  }
  if (argc > 1) {
    std::string why;
    gpus = std::min(gpus, bench::parse_int_flag("GPUS", argv[1], 1, 1024, why));
    if (!why.empty()) {
      std::fprintf(stderr, "allreduce_bench: %s\n", why.c_str());
      return 2;
    }
  }
  auto id = transport::make_nccl_unique_id();
  if (!id) {
    std::fprintf(stderr, "allreduce_bench: %s\n", id.err().message.c_str());
    return 1;
  }
  const std::vector<std::size_t> sizes = {8u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20};
  std::vector<std::vector<double>> seconds(gpus, std::vector<double>(sizes.size()));
  std::vector<std::thread> ranks;
  for (int r = 0; r < gpus; ++r) {
    ranks.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      auto c = transport::make_nccl_collective(*id, gpus, r, r, stream);
      if (!c) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.err().message.c_str());
        return;
      }
      void* buf = nullptr;
      cudaMalloc(&buf, sizes.back());
      cudaMemset(buf, 0, sizes.back());
      for (std::size_t s = 0; s < sizes.size(); ++s) {
        const std::size_t count = sizes[s] / 2;  // bf16
        const int iters = sizes[s] >= (16u << 20) ? 20 : 200;
        for (int i = 0; i < 5; ++i) (void)(*c)->all_reduce_sum(buf, count, kernels::dtype::bf16);
        cudaStreamSynchronize(stream);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) (void)(*c)->all_reduce_sum(buf, count, kernels::dtype::bf16);
        cudaStreamSynchronize(stream);
        seconds[r][s] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      }
      cudaFree(buf);
    });
  }
  for (auto& t : ranks) t.join();
  std::printf("conveyor nccl all-reduce, %d GPUs, bf16 (host-timed, stream-synchronised)\n", gpus);
  std::printf("%12s %12s %14s\n", "bytes", "time_us", "busbw_GB/s");
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const double t = seconds[0][s];
    const double busbw = sizes[s] * 2.0 * (gpus - 1) / gpus / t / 1e9;
    std::printf("%12zu %12.1f %14.1f\n", sizes[s], t * 1e6, busbw);
  }
  return 0;
}
