#pragma once
// A backend that forwards every call to another one and times each replayed recording (a decode
// step's CUDA graph) with a pair of CUDA events around it. conveyor_bench compares that GPU time
// with the step's wall time: the rest is the host's turn between graphs (plan, launch, sampling,
// the token's download), the part an asynchronous host loop would hide (bench/NOTES.md, session 6).
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "conveyor/kernels/backend.hpp"
#include "conveyor/kernels/cuda_backend.hpp"

namespace conveyor::bench {

class graph_timer final : public kernels::backend {
 public:
  explicit graph_timer(kernels::backend& inner)
      : inner_(inner), stream_(static_cast<cudaStream_t>(kernels::cuda_stream_of(inner))) {}
  ~graph_timer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  /// Starts timing replays (forgets those timed so far); off again with stop().
  void start() {
    used_ = 0;
    on_ = true;
  }
  void stop() { on_ = false; }
  /// Replays timed since reset() and their summed GPU time in seconds (waits for the last one).
  int replays() const { return static_cast<int>(used_ / 2); }
  double graph_seconds() {
    double s = 0;
    for (std::size_t i = 0; i + 1 < used_; i += 2) {
      cudaEventSynchronize(events_[i + 1]);
      float ms = 0;
      if (cudaEventElapsedTime(&ms, events_[i], events_[i + 1]) == cudaSuccess) s += ms * 1e-3;
    }
    return s;
  }

  const kernels::backend_caps& caps() const override { return inner_.caps(); }
  void* alloc(std::size_t bytes) override { return inner_.alloc(bytes); }
  void release(void* p) override { inner_.release(p); }
  void upload(void* d, const void* s, std::size_t n) override { inner_.upload(d, s, n); }
  void download(void* d, const void* s, std::size_t n) override { inner_.download(d, s, n); }
  void fill_bytes(void* d, std::uint8_t v, std::size_t n) override { inner_.fill_bytes(d, v, n); }
  void synchronize() override { inner_.synchronize(); }
  void memory_info(std::size_t* f, std::size_t* t) override { inner_.memory_info(f, t); }
  kernels::weight upload_weight(const void* src, kernels::dtype type, std::int64_t rows, std::int64_t cols,
                                bool is_vector) override {
    return inner_.upload_weight(src, type, rows, cols, is_vector);
  }
  void read_f32(const void* s, std::size_t n, float* d) override { inner_.read_f32(s, n, d); }
  void write_f32(void* d, const float* s, std::size_t n) override { inner_.write_f32(d, s, n); }
  void embedding(const std::int32_t* ids, int n, const kernels::weight& t, void* out) override {
    inner_.embedding(ids, n, t, out);
  }
  void rmsnorm(const void* x, int n, int w, const kernels::weight& g, float eps, void* out) override {
    inner_.rmsnorm(x, n, w, g, eps, out);
  }
  void add_rmsnorm(void* r, const void* x, int n, int w, const kernels::weight& g, float eps, void* out) override {
    inner_.add_rmsnorm(r, x, n, w, g, eps, out);
  }
  void add(void* acc, const void* x, std::size_t n) override { inner_.add(acc, x, n); }
  void linear(const void* x, int n, const kernels::weight& w, const kernels::weight& b, void* out) override {
    inner_.linear(x, n, w, b, out);
  }
  void linear_add_rmsnorm(const void* x, int n, const kernels::weight& w, const kernels::weight& b, void* out,
                          void* r, int width, const kernels::weight& g, float eps, void* norm_out) override {
    inner_.linear_add_rmsnorm(x, n, w, b, out, r, width, g, eps, norm_out);
  }
  void linear_into_attention(const void* x, int n, const kernels::weight& w, const kernels::weight& b,
                             void* out) override {
    inner_.linear_into_attention(x, n, w, b, out);
  }
  void linear_silu_mul(const void* x, int n, const kernels::weight& w, const kernels::weight& b, void* gu, int ffn,
                       void* out) override {
    inner_.linear_silu_mul(x, n, w, b, gu, ffn, out);
  }
  void rope(void* qkv, int n, const kernels::attn_shape& sh, const std::int32_t* pos, const float* f,
            float sc) override {
    inner_.rope(qkv, n, sh, pos, f, sc);
  }
  void kv_write(const void* qkv, int n, const kernels::attn_shape& sh, const std::int32_t* slots,
                const kernels::kv_layout& l, void* k, void* v) override {
    inner_.kv_write(qkv, n, sh, slots, l, k, v);
  }
  void attention(const void* qkv, const kernels::attn_shape& sh, const kernels::attention_batch& b,
                 const kernels::kv_layout& l, const void* k, const void* v, void* out) override {
    inner_.attention(qkv, sh, b, l, k, v, out);
  }
  void silu_mul(const void* gu, int n, int ffn, void* out) override { inner_.silu_mul(gu, n, ffn, out); }
  void gather_rows(const void* x, const std::int32_t* rows, int n, int w, void* out) override {
    inner_.gather_rows(x, rows, n, w, out);
  }
  bool decode_layers(const kernels::decode_layers_call& c) override { return inner_.decode_layers(c); }
  void sample(const void* logits, int n, int vocab, const kernels::sample_params* p, std::int32_t* t) override {
    inner_.sample(logits, n, vocab, p, t);
  }
  void draw(const void* logits, int n, int vocab, const kernels::sample_params* p, int slot) override {
    inner_.draw(logits, n, vocab, p, slot);
  }
  void copy_draw(int slot, int n, std::int32_t* dst) override { inner_.copy_draw(slot, n, dst); }
  void take_draw(int slot, std::int32_t* t) override { inner_.take_draw(slot, t); }
  bool can_capture() const override { return inner_.can_capture(); }
  void begin_capture() override { inner_.begin_capture(); }
  kernels::capture_id end_capture() override { return inner_.end_capture(); }
  void replay(kernels::capture_id id) override {
    if (!on_) return inner_.replay(id);
    // The events are recorded on the backend's stream around the graph: the first fires when the
    // step's plan upload (queued before it) is done, the second when the graph's last kernel ends.
    while (events_.size() < used_ + 2) {
      cudaEvent_t e = nullptr;
      cudaEventCreate(&e);
      events_.push_back(e);
    }
    cudaEventRecord(events_[used_], stream_);
    inner_.replay(id);
    cudaEventRecord(events_[used_ + 1], stream_);
    used_ += 2;
  }
  void drop_capture(kernels::capture_id id) override { inner_.drop_capture(id); }

 private:
  kernels::backend& inner_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::size_t used_ = 0;
  bool on_ = false;
};

}  // namespace conveyor::bench
