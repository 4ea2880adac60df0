#pragma once
// The CUDA backend's token draws: the sampler's device workspace and three draw slots (draw()'s 0
// and 1, sample()'s 2). Kept apart from cuda_backend because it is state of its own, grown on
// demand and waited on by the host, that the layer ops never touch; the backend keeps what orders
// a draw among its ops (held ops flushed, the device set, no capture in progress) and calls in
// after that.
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "launch.hpp"

namespace conveyor::kernels::cuda {

/// What the draws take from the backend that owns them, fixed once its stream exists.
struct draw_context {
  int device = 0;
  cudaStream_t stream = nullptr;
  dtype t = dtype::f32;     ///< the logits' dtype (the backend's compute dtype)
  int rows_per_pass = 1;    ///< rows one pass of the sampler sorts (cuda_backend_options::sample_rows_per_pass)
  bool kernel_copies = true;  ///< cuda_backend_options::kernel_copies: the argmax may write host tokens
  int num_sms = 0;
  /// The backend's device allocation: nullptr where memory is out.
  std::function<void*(std::size_t)> alloc;
};

class cuda_draws {
 public:
  /// The slot sample() draws into.
  static constexpr int sample_slot = 2;
  /// A slot's last draw, as copy_draw reads it on the device.
  struct drawn_tokens {
    const std::int32_t* tokens_dev = nullptr;
    int n = 0;  ///< rows of the last draw
  };

  explicit cuda_draws(draw_context ctx);
  /// Frees the slots and the workspace (the owner destroys this before its stream).
  ~cuda_draws();
  cuda_draws(const cuda_draws&) = delete;
  cuda_draws& operator=(const cuda_draws&) = delete;

  /// `slot` where it is one of draw()'s (0 or 1); any other is a bug and aborts.
  static int user_slot(int slot);
  /// Queues the draw of n rows into `slot`: one upload of the parameters, the passes (the sort
  /// workspace holds rows_per_pass rows) back to back, one download (a wait per pass made batch
  /// 256 pay the round trip four times). Waits only for the slot's previous draw (its host
  /// parameters are reused). The caller has flushed its held ops, set the device and is not
  /// capturing.
  void draw(int slot, const void* logits, int n, int vocab, const sample_params* params);
  /// Waits for the slot's last draw and copies its tokens to the host.
  void take(int slot, std::int32_t* tokens);
  drawn_tokens drawn(int slot) const;

 private:
  /// A draw's parameters and tokens on both sides, and the event of its last copy back; each slot
  /// grows to the rows it is asked for.
  struct draw_slot {
    device_sample_params* params_host = nullptr;
    device_sample_params* params_dev = nullptr;
    std::int32_t* tokens_host = nullptr;
    std::int32_t* tokens_dev = nullptr;
    int rows = 0;  // capacity
    int n = 0;     // rows of the last draw
    cudaEvent_t done = nullptr;
  };

  void set_device();
  void ensure_sample_workspace(int vocab);
  void free_workspace();
  static void free_draw_buffers(draw_slot& d);
  static void free_draw_slot(draw_slot& d);

  int device_;
  cudaStream_t stream_;
  dtype t_;
  int rows_per_pass_;
  bool kernel_copies_;
  int num_sms_;
  std::function<void*(std::size_t)> alloc_;
  std::array<draw_slot, 3> draw_slots_{};  // draw()'s 0 and 1, sample()'s 2
  sample_workspace sample_ws_;
};

}  // namespace conveyor::kernels::cuda
