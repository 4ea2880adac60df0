"""torch.distributed all-reduce bus bandwidth on the GPUs of this host (the peer of allreduce_bench).
Run: torchrun --nproc_per_node N bench/multi_gpu_peer.py"""
import os
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    if rank == 0:
        print(f"torch.distributed all-reduce, {n} GPUs, bf16 (host-timed, synchronised)")
        print(f"{'bytes':>12} {'time_us':>12} {'busbw_GB/s':>14}")
    for size in [8 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]:
        x = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        iters = 20 if size >= 16 << 20 else 200
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) / iters
        if rank == 0:
            print(f"{size:>12} {t * 1e6:>12.1f} {size * 2 * (n - 1) / n / t / 1e9:>14.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
