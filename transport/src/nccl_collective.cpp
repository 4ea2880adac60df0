// NCCL collective (compiled only with CONVEYOR_HAVE_CUDA; see nccl_collective_stub.cpp otherwise).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "conveyor/transport/nccl_collective.hpp"

namespace conveyor::transport {
namespace {

using kernels::dtype;

error nccl_error(const char* what, ncclResult_t r) {
  return make_error(errc::internal, std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t to_nccl(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
    case dtype::i32: return ncclInt32;
  }
  return ncclFloat32;
}

class nccl_collective final : public collective {
 public:
  nccl_collective(ncclComm_t comm, int size, int rank, cudaStream_t stream)
      : comm_(comm), size_(size), rank_(rank), stream_(stream) {}
  ~nccl_collective() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  status all_reduce_sum(void* data, std::size_t count, dtype type) override {
    return check("ncclAllReduce", ncclAllReduce(data, data, count, to_nccl(type), ncclSum, comm_, stream_));
  }
  status all_gather(const void* in, void* out, std::size_t count, dtype type) override {
    return check("ncclAllGather", ncclAllGather(in, out, count, to_nccl(type), comm_, stream_));
  }
  status broadcast(void* data, std::size_t count, dtype type, int root) override {
    if (root < 0 || root >= size_) {
      return make_error(errc::invalid_argument, "nccl: broadcast root " + std::to_string(root) + " out of range");
    }
    return check("ncclBroadcast", ncclBroadcast(data, data, count, to_nccl(type), root, comm_, stream_));
  }

 private:
  status check(const char* what, ncclResult_t r) {
    if (r != ncclSuccess) return nccl_error(what, r);
    return ok_status();
  }
  ncclComm_t comm_;
  int size_;
  int rank_;
  cudaStream_t stream_;
};

}  // namespace

bool nccl_available() { return true; }

result<std::vector<std::byte>> make_nccl_unique_id() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return nccl_error("ncclGetUniqueId", r);
  std::vector<std::byte> blob(sizeof id.internal);
  std::memcpy(blob.data(), id.internal, sizeof id.internal);
  return blob;
}

result<std::unique_ptr<collective>> make_nccl_collective(std::span<const std::byte> unique_id, int size, int rank,
                                                         int device, void* cuda_stream) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal) {
    return make_error(errc::invalid_argument, "nccl: unique id blob is " + std::to_string(unique_id.size()) +
                                                  " bytes, expected " + std::to_string(sizeof id.internal));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return make_error(errc::invalid_argument, "nccl: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return make_error(errc::internal, std::string("nccl: cudaSetDevice: ") + cudaGetErrorString(e));
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess) {
    return nccl_error("ncclCommInitRank", r);
  }
  return std::unique_ptr<collective>(
      std::make_unique<nccl_collective>(comm, size, rank, static_cast<cudaStream_t>(cuda_stream)));
}

}  // namespace conveyor::transport
