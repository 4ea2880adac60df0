#include "cuda_draws.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "check.hpp"
#include "conveyor/kernels/sampling.hpp"

namespace conveyor::kernels::cuda {

cuda_draws::cuda_draws(draw_context ctx)
    : device_(ctx.device),
      stream_(ctx.stream),
      t_(ctx.t),
      rows_per_pass_(ctx.rows_per_pass),
      kernel_copies_(ctx.kernel_copies),
      num_sms_(ctx.num_sms),
      alloc_(std::move(ctx.alloc)) {}

cuda_draws::~cuda_draws() {
  for (draw_slot& d : draw_slots_) free_draw_slot(d);
  free_workspace();
}

int cuda_draws::user_slot(int slot) {
  if (slot != 0 && slot != 1) fail_cuda("draw", "draw slot must be 0 or 1", __FILE__, __LINE__);
  return slot;
}

void cuda_draws::draw(int slot, const void* logits, int n, int vocab, const sample_params* params) {
  draw_slot& d = draw_slots_[static_cast<std::size_t>(slot)];
  d.n = 0;
  if (n <= 0) return;
  ensure_sample_workspace(vocab);
  if (d.done != nullptr) CONVEYOR_CUDA_CHECK(cudaEventSynchronize(d.done));
  if (n > d.rows) {
    const int rows = std::max(n, std::max(rows_per_pass_, 2 * d.rows));
    free_draw_buffers(d);
    d.params_dev = static_cast<device_sample_params*>(alloc_(rows * sizeof(device_sample_params)));
    d.tokens_dev = static_cast<std::int32_t*>(alloc_(rows * sizeof(std::int32_t)));
    if (d.params_dev == nullptr || d.tokens_dev == nullptr ||
        cudaMallocHost(reinterpret_cast<void**>(&d.params_host), rows * sizeof(device_sample_params)) != cudaSuccess ||
        cudaMallocHost(reinterpret_cast<void**>(&d.tokens_host), rows * sizeof(std::int32_t)) != cudaSuccess) {
      fail_cuda("draw", "out of memory for the sampling parameters", __FILE__, __LINE__);
    }
    d.rows = rows;
  }
  if (d.done == nullptr) CONVEYOR_CUDA_CHECK(cudaEventCreateWithFlags(&d.done, cudaEventDisableTiming));
  bool all_greedy = true;
  for (int i = 0; i < n; ++i) {
    const sample_params& p = params[i];
    const bool greedy = p.temperature <= 0.0f || p.top_k == 1;
    d.params_host[i] = device_sample_params{p.temperature, p.top_k, p.top_p, greedy ? 1 : 0,
                                            greedy ? 0.0 : sample_uniform(p.seed, p.step)};
    all_greedy = all_greedy && greedy;
  }
  // Greedy rows need no parameters on the device (a decode step's usual draw: one copy fewer).
  if (!all_greedy) {
    CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(d.params_dev, d.params_host, n * sizeof(device_sample_params),
                                        cudaMemcpyHostToDevice, stream_));
  }
  const std::size_t row_bytes = static_cast<std::size_t>(vocab) * dtype_size(t_);
  // Where the argmax kernel writes the tokens into the pinned host buffer itself, the copy back
  // (a copy-engine op between two decode graphs, several µs of hand-over) is left out.
  bool host_written = true;
  for (int r0 = 0; r0 < n; r0 += rows_per_pass_) {
    const int rows = std::min(rows_per_pass_, n - r0);
    bool any_random = false;
    for (int i = r0; i < r0 + rows; ++i) any_random = any_random || d.params_host[i].greedy == 0;
    host_written = launch_sample(t_, static_cast<const std::uint8_t*>(logits) + r0 * row_bytes, rows, vocab,
                                 all_greedy ? nullptr : d.params_dev + r0, any_random, sample_ws_,
                                 d.tokens_dev + r0, stream_, kernel_copies_ ? d.tokens_host + r0 : nullptr, num_sms_) &&
                   host_written;
  }
  if (!host_written) {
    CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(d.tokens_host, d.tokens_dev, n * sizeof(std::int32_t),
                                        cudaMemcpyDeviceToHost, stream_));
  }
  CONVEYOR_CUDA_CHECK(cudaEventRecord(d.done, stream_));
  d.n = n;
}

void cuda_draws::take(int slot, std::int32_t* tokens) {
  const draw_slot& d = draw_slots_[static_cast<std::size_t>(slot)];
  set_device();
  if (d.n == 0) return;
  CONVEYOR_CUDA_CHECK(cudaEventSynchronize(d.done));
  std::memcpy(tokens, d.tokens_host, d.n * sizeof(std::int32_t));
}

cuda_draws::drawn_tokens cuda_draws::drawn(int slot) const {
  const draw_slot& d = draw_slots_[static_cast<std::size_t>(slot)];
  return drawn_tokens{d.tokens_dev, d.n};
}

void cuda_draws::free_workspace() {
  sample_workspace& ws = sample_ws_;
  for (void* p : {static_cast<void*>(ws.keys_in), static_cast<void*>(ws.keys_out), static_cast<void*>(ws.idx_in),
                  static_cast<void*>(ws.idx_out), static_cast<void*>(ws.offsets), ws.sort_temp,
                  static_cast<void*>(ws.argmax_keys), static_cast<void*>(ws.argmax_done)}) {
    if (p != nullptr) cudaFree(p);
  }
  ws = sample_workspace{};
}

void cuda_draws::set_device() { CONVEYOR_CUDA_CHECK(cudaSetDevice(device_)); }

void cuda_draws::ensure_sample_workspace(int vocab) {
  if (sample_ws_.vocab == vocab) return;
  free_workspace();
  sample_workspace& ws = sample_ws_;
  ws.rows = rows_per_pass_;
  ws.vocab = vocab;
  const std::size_t cells = static_cast<std::size_t>(ws.rows) * vocab;
  ws.keys_in = static_cast<float*>(alloc_(cells * 4));
  ws.keys_out = static_cast<float*>(alloc_(cells * 4));
  ws.idx_in = static_cast<std::int32_t*>(alloc_(cells * 4));
  ws.idx_out = static_cast<std::int32_t*>(alloc_(cells * 4));
  ws.offsets = static_cast<std::int32_t*>(alloc_((ws.rows + 1) * 4));
  ws.sort_temp_bytes = sample_sort_temp_bytes(ws.rows, vocab);
  ws.sort_temp = alloc_(ws.sort_temp_bytes);
  ws.argmax_keys = static_cast<unsigned long long*>(alloc_(ws.rows * sizeof(unsigned long long)));
  ws.argmax_done = static_cast<unsigned*>(alloc_(ws.rows * sizeof(unsigned)));
  if (!ws.keys_in || !ws.keys_out || !ws.idx_in || !ws.idx_out || !ws.offsets || !ws.sort_temp ||
      !ws.argmax_keys || !ws.argmax_done) {
    fail_cuda("sampling workspace", "out of device memory", __FILE__, __LINE__);
  }
  CONVEYOR_CUDA_CHECK(cudaMemsetAsync(ws.argmax_keys, 0, ws.rows * sizeof(unsigned long long), stream_));
  CONVEYOR_CUDA_CHECK(cudaMemsetAsync(ws.argmax_done, 0, ws.rows * sizeof(unsigned), stream_));
  launch_sample_init(ws, stream_);
}

void cuda_draws::free_draw_buffers(draw_slot& d) {
  for (void* p : {static_cast<void*>(d.params_dev), static_cast<void*>(d.tokens_dev)}) {
    if (p != nullptr) cudaFree(p);
  }
  for (void* p : {static_cast<void*>(d.params_host), static_cast<void*>(d.tokens_host)}) {
    if (p != nullptr) cudaFreeHost(p);
  }
  d.params_dev = d.params_host = nullptr;
  d.tokens_dev = d.tokens_host = nullptr;
  d.rows = 0;
}

void cuda_draws::free_draw_slot(draw_slot& d) {
  free_draw_buffers(d);
  if (d.done != nullptr) cudaEventDestroy(d.done);
  d = draw_slot{};
}

}  // namespace conveyor::kernels::cuda
