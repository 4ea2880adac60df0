#include "conveyor/kernels/cpu_backend.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "conveyor/kernels/sampling.hpp"
#include "cpu_ops.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace conveyor::kernels {

namespace {

const float* f(const void* p) { return static_cast<const float*>(p); }
float* f(void* p) { return static_cast<float*>(p); }

/// float32 everywhere; memory is ordinary host memory, 64-byte aligned for the vector units.
class cpu_backend final : public backend {
 public:
  explicit cpu_backend(const cpu_backend_options& options) {
    caps_.name = "cpu";
    // FP8 here is the reference emulation the CUDA kernels are checked against (E4M3 decoded exactly).
    caps_.int8_weights = caps_.fp8_weights = true;
    if (options.threads > 0) openblas_set_num_threads(options.threads);
  }

  const backend_caps& caps() const override { return caps_; }

  void* alloc(std::size_t bytes) override {
    if (bytes == 0) bytes = 64;
    return ::operator new(round_up(bytes), std::align_val_t{64}, std::nothrow);
  }
  void release(void* ptr) override {
    if (ptr != nullptr) ::operator delete(ptr, std::align_val_t{64});
  }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) override {
    std::memset(dst, value, bytes);
  }
  void synchronize() override {}
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long avail = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    *total_bytes = static_cast<std::size_t>(pages) * page;
    *free_bytes = static_cast<std::size_t>(avail) * page;
  }

  weight upload_weight(const void* src, dtype src_type, std::int64_t rows, std::int64_t cols,
                       bool /*is_vector*/) override {
    const std::size_t count = static_cast<std::size_t>(rows) * cols;
    void* mem = alloc(count * 4);
    if (mem == nullptr) return {};
    convert_to_f32(src, src_type, count, f(mem));
    return weight{mem, dtype::f32, rows, cols};
  }
  void read_f32(const void* src, std::size_t count, float* dst) override {
    std::memcpy(dst, src, count * 4);
  }
  void write_f32(void* dst, const float* src, std::size_t count) override {
    std::memcpy(dst, src, count * 4);
  }

  void embedding(const std::int32_t* ids, int n, const weight& table, void* out) override {
    const std::size_t width = table.cols;
    for (int i = 0; i < n; ++i) {
      std::memcpy(f(out) + i * width, f(table.data) + static_cast<std::size_t>(ids[i]) * width,
                  width * 4);
    }
  }
  void rmsnorm(const void* x, int n, int width, const weight& w, float eps, void* out) override {
    cpu::rmsnorm(f(x), n, width, f(w.data), eps, f(out));
  }
  void add_rmsnorm(void* residual, const void* x, int n, int width, const weight& w, float eps,
                   void* out) override {
    cpu::add_rmsnorm(f(residual), f(x), n, width, f(w.data), eps, f(out));
  }
  void linear_add_rmsnorm(const void* x, int n, const weight& w, const weight& bias, void* out, void* residual,
                          int width, const weight& norm_w, float eps, void* norm_out) override {
    linear(x, n, w, bias, out);
    add_rmsnorm(residual, out, n, width, norm_w, eps, norm_out);
  }
  void linear_into_attention(const void* x, int n, const weight& w, const weight& bias, void* out) override {
    linear(x, n, w, bias, out);
  }
  void linear_silu_mul(const void* x, int n, const weight& w, const weight& bias, void* gate_up, int ffn,
                       void* out) override {
    linear(x, n, w, bias, gate_up);
    silu_mul(gate_up, n, ffn, out);
  }
  void add(void* acc, const void* x, std::size_t count) override {
    float* a = f(acc);
    const float* b = f(x);
    for (std::size_t i = 0; i < count; ++i) a[i] += b[i];
  }
  void linear(const void* x, int n, const weight& w, const weight& bias, void* out) override {
    if (w.type == dtype::i8 || w.type == dtype::f8e4m3) {
      if (quant_tile_.empty()) quant_tile_.resize(quant_tile_floats);
      return cpu::linear_quant(f(x), n, w.data, w.type, w.scales, static_cast<int>(w.rows), static_cast<int>(w.cols),
                               bias.empty() ? nullptr : f(bias.data), f(out), quant_tile_.data(), quant_tile_.size());
    }
    cpu::linear(f(x), n, f(w.data), static_cast<int>(w.rows), static_cast<int>(w.cols),
                bias.empty() ? nullptr : f(bias.data), f(out));
  }
  void rope(void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
            const float* inv_freq, float attention_scaling) override {
    cpu::rope(f(qkv), n, shape, positions, inv_freq, attention_scaling);
  }
  void kv_write(const void* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
                const kv_layout& /*layout*/, void* k_cache, void* v_cache) override {
    cpu::kv_write(f(qkv), n, shape, slots, f(k_cache), f(v_cache));
  }
  void attention(const void* qkv, const attn_shape& shape, const attention_batch& batch,
                 const kv_layout& layout, const void* k_cache, const void* v_cache,
                 void* out) override {
    cpu::attention(f(qkv), shape, batch, layout, f(k_cache), f(v_cache), f(out));
  }
  void silu_mul(const void* gate_up, int n, int ffn, void* out) override {
    cpu::silu_mul(f(gate_up), n, ffn, f(out));
  }
  void gather_rows(const void* x, const std::int32_t* rows, int n, int width, void* out) override {
    for (int i = 0; i < n; ++i) {
      std::memcpy(f(out) + static_cast<std::size_t>(i) * width,
                  f(x) + static_cast<std::size_t>(rows[i]) * width, static_cast<std::size_t>(width) * 4);
    }
  }
  // The op-by-op path is the CPU's only one (it is the reference the CUDA kernel is tested against).
  bool decode_layers(const decode_layers_call& /*c*/) override { return false; }
  void sample(const void* logits, int n, int vocab, const sample_params* params,
              std::int32_t* tokens) override {
    for (int i = 0; i < n; ++i) {
      tokens[i] = sample_row(f(logits) + static_cast<std::size_t>(i) * vocab, vocab, params[i], scratch_);
    }
  }
  // The host has no queue to overlap: a draw happens at once and waits in its slot.
  void draw(const void* logits, int n, int vocab, const sample_params* params, int slot) override {
    std::vector<std::int32_t>& d = drawn_.at(static_cast<std::size_t>(slot));
    d.resize(static_cast<std::size_t>(n));
    sample(logits, n, vocab, params, d.data());
  }
  void copy_draw(int slot, int n, std::int32_t* dst) override {
    std::memcpy(dst, drawn_.at(static_cast<std::size_t>(slot)).data(), static_cast<std::size_t>(n) * sizeof(std::int32_t));
  }
  void take_draw(int slot, std::int32_t* tokens) override {
    const std::vector<std::int32_t>& d = drawn_.at(static_cast<std::size_t>(slot));
    std::copy(d.begin(), d.end(), tokens);
  }

  // Ops run at once on the host: there is nothing to record or replay.
  bool can_capture() const override { return false; }
  void begin_capture() override {}
  capture_id end_capture() override { return 0; }
  void replay(capture_id /*id*/) override {}
  void drop_capture(capture_id /*id*/) override {}

 private:
  static std::size_t round_up(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

  /// 1 MiB of dequantized rows: stays in L2 between the dequantization and the sgemm reading it.
  static constexpr std::size_t quant_tile_floats = 1u << 18;

  backend_caps caps_;
  std::vector<float> quant_tile_;
  std::vector<std::pair<float, std::int32_t>> scratch_;
  std::array<std::vector<std::int32_t>, 2> drawn_;  // draw slots
};

}  // namespace

std::unique_ptr<backend> make_cpu_backend(const cpu_backend_options& options) {
  return std::make_unique<cpu_backend>(options);
}

}  // namespace conveyor::kernels
