// The CUDA backend: one device, one stream, one cuBLAS handle. Kernels live in the .cu files
// (launch.hpp); this file is plain host C++ (memory, copies, cuBLAS calls, dispatch, CUDA graphs).
//
// Fusion across calls (options.fuse, bf16): a rope (and, with the small-batch GEMV, an rmsnorm or
// silu_mul) is held back until the next call. If that call consumes its output (kv_write, or a small
// linear), the two run as one kernel; any other call first runs the held op on its own. So the
// engine keeps issuing plain ops (with everything on, a decode layer is 6 launches instead of 11).
// With fuse_attention the rope + kv_write pair is held once more, for the decode attention kernel.
// Held ops wait only for the next backend call, and the outputs they leave in memory are those of
// the op-by-op path.
#include "conveyor/kernels/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <vector>

#include "check.hpp"
#include "cuda_draws.hpp"
#include "fused_decode.hpp"
#include "launch.hpp"
#include "lt_gemm.hpp"
#include "quant_launch.hpp"
#include "skinny_gemm.hpp"
#include "skinny_wgmma.hpp"

namespace conveyor::kernels {

namespace {

using namespace cuda;

cudaDataType_t cuda_type(dtype t) { return t == dtype::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

class cuda_backend final : public backend {
 public:
  /// The stream every op runs on (collectives of a tensor-parallel group enqueue on it too).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  static result<std::unique_ptr<backend>> create(const cuda_backend_options& options) {
    int count = 0;
    if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
      cudaGetLastError();  // a failed query must not poison later calls
      return make_error(errc::unsupported, std::string("no usable CUDA device: ") + cudaGetErrorString(err));
    }
    if (count == 0) return make_error(errc::unsupported, "no usable CUDA device: none found");
    if (options.device < 0 || options.device >= count) {
      return make_error(errc::invalid_argument, "CUDA device " + std::to_string(options.device) +
                                                    " does not exist (this machine has " + std::to_string(count) + ")");
    }
    if (options.compute_dtype != dtype::bf16 && options.compute_dtype != dtype::f32) {
      return make_error(errc::unsupported, "the CUDA backend computes in bf16 or f32, not " +
                                               std::string(dtype_name(options.compute_dtype)));
    }
    if (options.sample_rows_per_pass < 1) return make_error(errc::invalid_argument, "sample_rows_per_pass must be >= 1");
    std::unique_ptr<cuda_backend> b(new cuda_backend(options));
    CONVEYOR_TRY(b->init());
    return std::unique_ptr<backend>(std::move(b));
  }

  ~cuda_backend() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& [id, exec] : graph_execs_) cudaGraphExecDestroy(exec);
    for (auto& slot : staging_) {
      if (slot.host != nullptr) cudaFreeHost(slot.host);
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
    }
    if (counter_ != nullptr) cudaFree(counter_);
    lt_.reset();
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    draws_.reset();  // the draw slots and the sampler workspace, while the stream still exists
    for (void* p : {cublas_ws_, quant_scratch_, static_cast<void*>(partials_), static_cast<void*>(split_parts_),
                    static_cast<void*>(qkv_parts_), static_cast<void*>(split_done_)}) {
      if (p != nullptr) cudaFree(p);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const backend_caps& caps() const override { return caps_; }

  // --- memory ---
  void* alloc(std::size_t bytes) override {
    set_device();
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<std::size_t>(bytes, 256)) != cudaSuccess) {
      cudaGetLastError();  // out of memory is reported as nullptr, not left as a sticky error
      return nullptr;
    }
    return p;
  }
  void release(void* ptr) override {
    if (ptr == nullptr) return;
    flush();  // a held op may use this memory
    set_device();
    CONVEYOR_CUDA_CHECK(cudaFree(ptr));
  }
  // Small copies (a step's plan, activations) go through a pinned staging buffer and return without
  // waiting for the GPU; large ones (weights) are copied from pageable memory and waited for. Either
  // way the caller may reuse its buffer at once.
  void upload(void* dst, const void* src, std::size_t bytes) override {
    flush();
    set_device();
    if (capturing_) fail_cuda("upload", "called while capturing", __FILE__, __LINE__);
    if (bytes <= staging_bytes) {
      staging_slot& slot = staging_[next_staging_];
      next_staging_ = (next_staging_ + 1) % staging_.size();
      CONVEYOR_CUDA_CHECK(cudaEventSynchronize(slot.done));  // the slot's last copy has been read
      std::memcpy(slot.host, src, bytes);
      // A step's plan (a few KB) is read by a kernel straight from the pinned slot: a copy-engine
      // op between two decode graphs cost several µs of hand-over each way (bench/NOTES.md, session
      // 9). Held until the next call, which may lay the previous draw over its ids (copy_draw).
      if (kernel_copies_ && bytes <= kernel_upload_bytes && bytes % 4 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 4 == 0) {
        pending_ = pending_upload{static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(slot.host),
                                  static_cast<int>(bytes / 4), &slot};
        return;
      }
      CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
      CONVEYOR_CUDA_CHECK(cudaEventRecord(slot.done, stream_));
      return;
    }
    CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    flush();
    set_device();
    CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) override {
    flush();
    set_device();
    CONVEYOR_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_));
  }
  void synchronize() override {
    flush();
    set_device();
    CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    set_device();
    CONVEYOR_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  }

  weight upload_weight(const void* src, dtype src_type, std::int64_t rows, std::int64_t cols,
                       bool is_vector) override {
    const dtype target = is_vector ? dtype::f32 : caps_.weight_dtype;
    const std::size_t count = static_cast<std::size_t>(rows) * cols;
    void* mem = alloc(count * dtype_size(target));
    if (mem == nullptr) return {};
    const void* host = src;
    if (src_type != target) {
      // Host conversion: loading is once per process, and it keeps a second device copy out of the
      // memory plan.
      convert_buf_.resize(count);
      convert_to_f32(src, src_type, count, convert_buf_.data());
      host = convert_buf_.data();
      if (target == dtype::bf16) {
        u16_buf_.resize(count);
        for (std::size_t i = 0; i < count; ++i) u16_buf_[i] = f32_to_bf16(convert_buf_[i]);
        host = u16_buf_.data();
      }
    }
    upload(mem, host, count * dtype_size(target));
    release_staging();
    return weight{mem, target, rows, cols};
  }
  void read_f32(const void* src, std::size_t count, float* dst) override {
    if (caps_.act_dtype == dtype::f32) return download(dst, src, count * 4);
    u16_buf_.resize(count);
    download(u16_buf_.data(), src, count * 2);
    for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(u16_buf_[i]);
  }
  void write_f32(void* dst, const float* src, std::size_t count) override {
    if (caps_.act_dtype == dtype::f32) return upload(dst, src, count * 4);
    u16_buf_.resize(count);
    for (std::size_t i = 0; i < count; ++i) u16_buf_[i] = f32_to_bf16(src[i]);
    upload(dst, u16_buf_.data(), count * 2);
  }

  // --- ops ---
  void embedding(const std::int32_t* ids, int n, const weight& table, void* out) override {
    flush();
    set_device();
    launch_embedding(t_, ids, n, table.data, static_cast<int>(table.cols), out, stream_);
  }
  void rmsnorm(const void* x, int n, int width, const weight& w, float eps, void* out) override {
    flush();
    set_device();
    if (can_hold_for_gemv(n) && x != out) {
      held_ = held_op{held_kind::norm, const_cast<void*>(x), nullptr, static_cast<const float*>(w.data), eps, out, n,
                      width};
      return;
    }
    launch_rmsnorm(t_, nullptr, x, n, width, static_cast<const float*>(w.data), eps, out, stream_, norm_how());
  }
  void add_rmsnorm(void* residual, const void* x, int n, int width, const weight& w, float eps,
                   void* out) override {
    flush();
    set_device();
    if (can_hold_for_gemv(n) && out != residual && out != x) {
      held_ = held_op{held_kind::norm, residual, x, static_cast<const float*>(w.data), eps, out, n, width};
      return;
    }
    launch_rmsnorm(t_, residual, x, n, width, static_cast<const float*>(w.data), eps, out, stream_, norm_how());
  }
  void linear_add_rmsnorm(const void* x, int n, const weight& w, const weight& bias, void* out, void* residual,
                          int width, const weight& norm_w, float eps, void* norm_out) override {
    if (split_linear_norm(x, n, w, bias, out, residual, width, norm_w, eps, norm_out)) return;
    linear(x, n, w, bias, out);
    add_rmsnorm(residual, out, n, width, norm_w, eps, norm_out);
  }
  void add(void* acc, const void* x, std::size_t count) override {
    flush();
    set_device();
    launch_add(t_, acc, x, count, stream_);
  }
  static skinny_gemm_args skinny_args(const void* x, int n, const weight& w, const weight& bias, void* out) {
    skinny_gemm_args a;
    a.w = static_cast<const __nv_bfloat16*>(w.data);
    a.bias = bias.empty() ? nullptr : static_cast<const float*>(bias.data);
    a.x = static_cast<const __nv_bfloat16*>(x);
    a.out = static_cast<__nv_bfloat16*>(out);
    a.rows = static_cast<int>(w.rows);
    a.cols = static_cast<int>(w.cols);
    a.n = n;
    return a;
  }
  // qkv on the wgmma GEMM at wgmma_qkv's token counts: it waits for its input with
  // griddepcontrol.wait and releases the attention kernel right after, so attention's blocks and
  // their pre-wait K/V requests (the ring kernel) start before qkv ends; after cuBLAS's GEMM they
  // wait for its completion (bench/NOTES.md, session 14). attention() reads qkv_early_.
  void linear_into_attention(const void* x, int n, const weight& w, const weight& bias, void* out) override {
    qkv_early_ = false;
    aim_prefetch(x, w, l2_prefetch_qkv);
    if (wgmma_qkv_ && n >= wgmma_qkv_min_n_ && n <= wgmma_qkv_max_n_ && wgmma_takes(x, n, w, out)) {
      flush();
      set_device();
      const skinny_gemm_args a = skinny_args(x, n, w, bias, out);
      // wgmma_qkv_slices: the K split's sums left for the attention prologue (held until it comes).
      if (wgmma_qkv_slices_ && n >= wgmma_qkv_slices_min_n_ && can_hold() && fuse_attention_ &&
          !wgmma_push_reduce_ && qkv_parts(n, a.rows)) {
        const int splits = launch_skinny_wgmma_split_parts(a, qkv_parts_, attention_rope_kv::max_splits, pdl_,
                                                           num_sms_, stream_);
        if (splits > 0) {
          held_ = held_op{held_kind::qkv_parts, nullptr, nullptr, nullptr, 0.0f, out, n, a.rows};
          held_.parts = qkv_parts_;
          held_.splits = splits;
          held_.bias = a.bias;
          qkv_early_ = pdl_;
          return;
        }
      }
      if (launch_skinny_wgmma(a, pdl_, num_sms_, stream_, wgmma_push_reduce_)) {
        qkv_early_ = pdl_;
        return;
      }
    }
    linear(x, n, w, bias, out);
  }
  // gate_up with the SwiGLU in the wgmma GEMM's epilogue at wgmma_swiglu's token counts; elsewhere
  // the GEMM and silu_mul (which the GEMV path may hold for the down projection's prologue).
  void linear_silu_mul(const void* x, int n, const weight& w, const weight& bias, void* gate_up, int ffn,
                       void* out) override {
    aim_prefetch(x, w, l2_prefetch_gate_up);
    if (wgmma_swiglu_ && n >= wgmma_swiglu_min_n_ && n <= wgmma_swiglu_max_n_ && wgmma_takes(x, n, w, out) &&
        w.rows == 2 * static_cast<std::int64_t>(ffn)) {
      flush();
      set_device();
      if (launch_skinny_wgmma_swiglu(skinny_args(x, n, w, bias, out), pdl_, num_sms_, stream_)) return;
    }
    linear(x, n, w, bias, gate_up);
    silu_mul(gate_up, n, ffn, out);
  }
  // Row-major out[n, rows] = x[n, cols] · Wᵀ is, in cuBLAS's column-major terms,
  // out(rows × n) = op_T(W: cols × rows) · x(cols × n).
  void linear(const void* x, int n, const weight& w, const weight& bias, void* out) override {
    if (n <= 0) return flush();
    set_device();
    if (w.type == dtype::i8 || w.type == dtype::f8e4m3) return quant_linear(x, n, w, bias, out);
    if (small_gemm_ && n <= small_gemm_max_n_ && t_ == dtype::bf16 && w.type == dtype::bf16 &&
        gemv_supported(n, static_cast<int>(w.rows), static_cast<int>(w.cols)) && aligned(x) && aligned(w.data) &&
        aligned(out)) {
      return small_linear(x, n, w, bias, out);
    }
    aim_prefetch(x, w, l2_prefetch_other);
    flush();
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    if ((skinny_gemm_ || skinny_wgmma_) && n >= skinny_min_n_ && n <= skinny_max_n_ && t_ == dtype::bf16 &&
        w.type == dtype::bf16 && skinny_gemm_supported(n, rows, cols) && aligned(x) && aligned(w.data) && aligned(out)) {
      const skinny_gemm_args a = skinny_args(x, n, w, bias, out);
      // The wgmma kernel where it runs (sm_90, tensor maps encoded), else the mma.sync one if asked.
      if (skinny_wgmma_ && skinny_wgmma_supported(n, rows, cols) && launch_skinny_wgmma(a, pdl_, num_sms_, stream_, wgmma_push_reduce_)) return;
      if (skinny_gemm_) return launch_skinny_gemm(a, pdl_, num_sms_, stream_);
    }
    // Decode batch sizes: the algorithm timed fastest for this shape (lt_gemm.hpp); prefill keeps
    // cublasGemmEx's choice, which ran at ~755 TFLOP/s there.
    if (gemm_tune_ && lt_ != nullptr && t_ == dtype::bf16 && w.type == dtype::bf16 && n <= gemm_tune_max_n &&
        lt_->run(w.data, x, out, rows, n, cols, stream_, capturing_, partials_, partial_floats_ * sizeof(float))) {
      if (!bias.empty()) launch_add_bias(t_, out, static_cast<const float*>(bias.data), n, rows, stream_);
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    CONVEYOR_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w.data,
                                       cuda_type(w.type), cols, x, cuda_type(t_), cols, &zero, out, cuda_type(t_),
                                       rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    // TODO(perf): fuse the bias into the GEMM epilogue (cuBLASLt) instead of a second pass.
    if (!bias.empty()) launch_add_bias(t_, out, static_cast<const float*>(bias.data), n, rows, stream_);
  }
  void rope(void* qkv, int n, const attn_shape& shape, const std::int32_t* positions, const float* inv_freq,
            float attention_scaling) override {
    // A qkv still in K slices stays so: the rope held with them (flush sums them first).
    const held_op h = held_;
    const bool parts = h.kind == held_kind::qkv_parts && h.out == qkv && h.n == n &&
                       h.width == (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim;
    if (parts) {
      held_.kind = held_kind::none;
    } else {
      flush();
    }
    set_device();
    if (can_hold()) {
      held_ = held_op{held_kind::rope, qkv, nullptr, nullptr, 0.0f, nullptr, n, 0, shape, positions, inv_freq,
                      attention_scaling};
      if (parts) {
        held_.parts = h.parts;
        held_.splits = h.splits;
        held_.bias = h.bias;
      }
      return;
    }
    if (parts) sum_qkv_parts(h);
    launch_rope(t_, qkv, n, shape, positions, inv_freq, attention_scaling, stream_);
  }
  void kv_write(const void* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
                const kv_layout& /*layout*/, void* k_cache, void* v_cache) override {
    set_device();
    if (held_.kind == held_kind::rope && held_.a == qkv && held_.n == n && held_.shape.num_heads == shape.num_heads &&
        held_.shape.num_kv_heads == shape.num_kv_heads && held_.shape.head_dim == shape.head_dim) {
      if (fuse_attention_) {  // the decode attention may take both (launch_attention decides)
        held_.kind = held_kind::rope_kv;
        held_.slots = slots;
        held_.k_cache = k_cache;
        held_.v_cache = v_cache;
        return;
      }
      const held_op h = held_;
      held_.kind = held_kind::none;
      sum_qkv_parts(h);
      launch_rope_kv(t_, h.a, n, h.shape, h.positions, h.inv_freq, h.scaling, slots, k_cache, v_cache, stream_, pdl_);
      return;
    }
    flush();
    launch_kv_write(t_, qkv, n, shape, slots, k_cache, v_cache, stream_);
  }
  void attention(const void* qkv, const attn_shape& shape, const attention_batch& batch, const kv_layout& layout,
                 const void* k_cache, const void* v_cache, void* out) override {
    set_device();
    // The ring decode kernel only where the step is small enough (ring_decode_max_seqs): there the
    // qkv GEMV before it releases it early; after cuBLAS's qkv GEMM it measured no faster.
    // After a qkv that releases it early (linear_into_attention), the ring kernel's pre-wait K/V
    // requests pay at larger batches too: wgmma_qkv_ring_decode's chunks a warp.
    const attention_tuning& tune = batch.num_seqs <= ring_decode_max_seqs_ ? tune_
                                   : qkv_early_                             ? tune_after_early_qkv_
                                                                            : tune_no_ring_;
    qkv_early_ = false;
    const held_op& h = held_;
    if (h.kind == held_kind::rope_kv && h.a == qkv && h.k_cache == k_cache && h.v_cache == v_cache &&
        h.shape.num_heads == shape.num_heads && h.shape.num_kv_heads == shape.num_kv_heads &&
        h.shape.head_dim == shape.head_dim) {
      attention_rope_kv rope{h.a, h.n, h.positions, h.inv_freq, h.scaling, h.slots, h.k_cache, h.v_cache};
      rope.parts = h.parts;  // a qkv still in K slices (wgmma_qkv_slices), else nullptr
      rope.splits = h.splits;
      rope.bias = h.bias;
      rope.split_done = split_done_;
      rope.split_done_count = split_done_count;
      held_.kind = held_kind::none;
      launch_attention(t_, qkv, shape, batch, layout, k_cache, v_cache, out, partials_, partial_floats_, num_sms_,
                       tune, stream_, &rope);
      return;
    }
    flush();
    launch_attention(t_, qkv, shape, batch, layout, k_cache, v_cache, out, partials_, partial_floats_, num_sms_,
                     tune, stream_);
  }
  void silu_mul(const void* gate_up, int n, int ffn, void* out) override {
    flush();
    set_device();
    if ((can_hold_for_gemv(n) || can_hold_for_prefetch()) && out != gate_up) {
      held_ = held_op{held_kind::silu, const_cast<void*>(gate_up), nullptr, nullptr, 0.0f, out, n, ffn};
      return;
    }
    launch_silu_mul(t_, gate_up, n, ffn, out, stream_, pdl_);
  }
  // linear_add_rmsnorm at cuBLAS batch sizes (≤ split_max_n_): the linear as S float32 K slices (lt_gemm::run_split),
  // summed by the add + rmsnorm kernel, where the tuning timed that faster than the plain GEMM
  // (whose own split-K, where cuBLAS picks one, adds a reduce kernel). False: nothing ran.
  bool split_linear_norm(const void* x, int n, const weight& w, const weight& bias, void* out, void* residual,
                         int width, const weight& norm_w, float eps, void* norm_out) {
    // wgmma_split: our kernel's K slices (a programmatic dependent that waits), at its token counts.
    const int max_n = w.cols <= w.rows ? wgmma_split_short_k_max_n_ : wgmma_split_max_n_;
    const bool ours = wgmma_split_ && n >= wgmma_qkv_min_n_ && n <= std::min(skinny_max_n_, max_n);
    const bool lt_split = split_linears_ && lt_ != nullptr && n <= split_max_n_;  // cuBLASLt's slices
    if (!ours && !lt_split) return false;
    if (t_ != dtype::bf16 || w.type != dtype::bf16 || n > gemm_tune_max_n) return false;
    if (small_gemm_ && n <= small_gemm_max_n_) return false;  // the GEMV, with the norm in the next one's prologue
    if (!ours && (skinny_gemm_ || skinny_wgmma_) && n >= skinny_min_n_ && n <= skinny_max_n_) return false;
    if (caps_.row_invariant_rows > 0) return false;  // batch_invariant keeps the op-by-op sums
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    if (width != rows || !norm_bf16x8_fits(width) || norm_w.type != dtype::f32) return false;
    if (!aligned(x) || !aligned(w.data) || !aligned(out) || !aligned(residual) || !aligned(norm_out) ||
        !aligned(norm_w.data)) {
      return false;
    }
    const std::size_t need = static_cast<std::size_t>(lt_gemm::max_split) * gemm_tune_max_n * rows;
    if (split_parts_ == nullptr) {
      // Once, for the first width seen (the hidden size); a wider linear later keeps the plain path.
      CONVEYOR_CUDA_CHECK(cudaMalloc(&split_parts_, need * sizeof(float)));
      split_parts_floats_ = need;
    }
    if (need > split_parts_floats_) return false;
    aim_prefetch(x, w, l2_prefetch_down);
    flush();
    set_device();
    int splits = 0;
    if (ours) {
      splits = launch_skinny_wgmma_slices(skinny_args(x, n, w, bias, out), split_parts_, lt_gemm::max_split, pdl_,
                                          num_sms_, stream_);
    }
    if (splits == 0) {
      if (!lt_split) return false;
      splits = lt_->split_for(w.data, x, split_parts_, rows, n, cols, stream_, capturing_, partials_,
                              partial_floats_ * sizeof(float), split_margin_us_, gemm_tune_);
      if (splits == 0) return false;
      lt_->run_split(w.data, x, split_parts_, rows, n, cols, splits, stream_);
    }
    held_op h{held_kind::split_norm, residual, nullptr, static_cast<const float*>(norm_w.data), eps, norm_out, n, width};
    h.parts = split_parts_;
    h.splits = splits;
    h.bias = bias.empty() ? nullptr : static_cast<const float*>(bias.data);
    h.delta = out;
    held_ = h;
    if (!can_hold_for_prefetch()) flush();
    return true;
  }
  bool decode_layers(const decode_layers_call& c) override {
    // bf16 only, and not under batch_invariant: a verification pass runs the op-by-op kernels, whose
    // sums are ordered differently from this kernel's.
    if (!fused_decode_ || fused_blocks_ == 0 || t_ != dtype::bf16 || caps_.row_invariant_rows > 0) return false;
    if (c.num_layers <= 0 || c.batch.num_seqs != 1 || c.batch.max_q_len != 1) return false;
    const attn_shape& sh = c.shape;
    if (!fused_decode_supported(c.hidden, c.ffn, sh.num_heads, sh.num_kv_heads, sh.head_dim)) return false;
    if (fused_decode_partial_floats(sh.num_heads, sh.num_kv_heads, sh.head_dim, fused_blocks_) > partial_floats_) {
      return false;
    }
    auto bf16_matrix = [](const weight& w) { return w.type == dtype::bf16 && aligned(w.data); };
    for (int i = 0; i < c.num_layers; ++i) {
      const layer_ref& l = c.layers[i];
      if (!bf16_matrix(l.qkv) || !bf16_matrix(l.o) || !bf16_matrix(l.gate_up) || !bf16_matrix(l.down)) return false;
    }
    if (!aligned(c.residual) || !aligned(c.delta) || !aligned(c.act) || !aligned(c.o) || !aligned(c.attn)) return false;
    flush();
    set_device();
    using bf = __nv_bfloat16;
    auto f32 = [](const weight& w) { return w.empty() ? nullptr : static_cast<const float*>(w.data); };
    auto mat = [](const weight& w) { return static_cast<const bf*>(w.data); };
    for (int first = 0; first < c.num_layers; first += fused_max_layers) {
      fused_decode_args a;
      a.num_layers = std::min(fused_max_layers, c.num_layers - first);
      for (int i = 0; i < a.num_layers; ++i) {
        const layer_ref& l = c.layers[first + i];
        a.layer[i] = fused_layer{f32(l.input_norm), mat(l.qkv), f32(l.qkv_bias), mat(l.o), f32(l.o_bias),
                                 f32(l.post_norm), mat(l.gate_up), f32(l.gate_up_bias), mat(l.down), f32(l.down_bias),
                                 static_cast<bf*>(l.k_cache), static_cast<bf*>(l.v_cache), l.sliding_window};
      }
      a.first_adds_delta = (first > 0 || c.first_adds_delta) ? 1 : 0;
      a.hidden = c.hidden;
      a.ffn = c.ffn;
      a.heads = sh.num_heads;
      a.kv_heads = sh.num_kv_heads;
      a.head_dim = sh.head_dim;
      a.scale = sh.scale;
      a.eps = c.eps;
      a.block_size = c.layout.block_size;
      a.positions = c.positions;
      a.slots = c.slots;
      a.ctx_len = c.batch.ctx_len;
      a.block_table = c.batch.block_table;
      a.inv_freq = c.inv_freq;
      a.rope_scaling = c.attention_scaling;
      a.residual = static_cast<bf*>(c.residual);
      a.delta = static_cast<bf*>(c.delta);
      a.qkv_out = static_cast<bf*>(c.qkv);
      a.o_out = static_cast<bf*>(c.o);
      a.act = static_cast<bf*>(c.act);
      a.attn_out = static_cast<bf*>(c.attn);
      a.partials = partials_;
      a.sync = counter_ + fused_sync_word;
      a.head_sync = counter_ + fused_head_sync_word;
      a.l2_ahead = fused_l2_ahead_;
      launch_fused_decode(a, fused_blocks_, stream_);
    }
    return true;
  }
  void gather_rows(const void* x, const std::int32_t* rows, int n, int width, void* out) override {
    flush();
    set_device();
    launch_gather_rows(t_, x, rows, n, width, out, stream_);
  }
  void sample(const void* logits, int n, int vocab, const sample_params* params, std::int32_t* tokens) override {
    if (n <= 0) return;
    draw_into(cuda_draws::sample_slot, logits, n, vocab, params);
    draws_->take(cuda_draws::sample_slot, tokens);
  }
  void draw(const void* logits, int n, int vocab, const sample_params* params, int slot) override {
    draw_into(cuda_draws::user_slot(slot), logits, n, vocab, params);
  }
  void copy_draw(int slot, int n, std::int32_t* dst) override {
    const cuda_draws::drawn_tokens d = draws_->drawn(cuda_draws::user_slot(slot));
    if (n > d.n) fail_cuda("copy_draw", "more tokens than the slot drew", __FILE__, __LINE__);
    if (n <= 0) return;
    const auto* to = reinterpret_cast<const std::uint32_t*>(dst);
    const auto* words = reinterpret_cast<const std::uint32_t*>(d.tokens_dev);
    pending_upload& p = pending_;
    if (p.words > 0 && p.ovl == nullptr && to >= p.dst && to + n <= p.dst + p.words) {
      // Into the held upload (the plan whose ids these are): one kernel between the graphs.
      p.ovl = words;
      p.ovl_at = static_cast<int>(to - p.dst);
      p.ovl_words = n;
      return;
    }
    flush();
    set_device();
    if (!kernel_copies_) {
      CONVEYOR_CUDA_CHECK(cudaMemcpyAsync(dst, d.tokens_dev, n * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    // A kernel rather than a device-to-device copy: no copy-engine hand-over (the host words are
    // never read, the overlay covers them all).
    launch_upload_words(reinterpret_cast<std::uint32_t*>(dst), nullptr, n, words, 0, n, stream_);
  }
  void take_draw(int slot, std::int32_t* tokens) override { draws_->take(cuda_draws::user_slot(slot), tokens); }

  // --- capture: CUDA graphs of the stream's work between begin and end ---
  bool can_capture() const override { return graphs_; }
  void begin_capture() override {
    flush();
    set_device();
    // Relaxed: a capture must not fail on calls that touch no stream (cuBLAS' queries, attributes).
    CONVEYOR_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
  }
  capture_id end_capture() override {
    flush();
    set_device();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess || graph == nullptr) {
      cudaGetLastError();
      return 0;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    const capture_id id = next_capture_id_++;
    graph_execs_.emplace(id, exec);
    return id;
  }
  void replay(capture_id id) override {
    flush();
    set_device();
    const auto it = graph_execs_.find(id);
    if (it == graph_execs_.end()) fail_cuda("replay", "unknown capture id", __FILE__, __LINE__);
    CONVEYOR_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  }
  void drop_capture(capture_id id) override {
    flush();
    set_device();
    const auto it = graph_execs_.find(id);
    if (it == graph_execs_.end()) return;
    CONVEYOR_CUDA_CHECK(cudaGraphExecDestroy(it->second));  // an in-flight replay finishes first
    graph_execs_.erase(it);
  }

 private:
  enum class held_kind { none, norm, silu, rope, rope_kv, split_norm, qkv_parts };
  /// An op held back for fusion with the next call. norm: out = rmsnorm(a (+= b when b is set)) * w;
  /// silu: out = silu_mul(a) with width = ffn; rope: rope of the qkv rows at a; rope_kv: that rope
  /// and the kv_write after it (slots, caches), for the decode attention to do; split_norm: the
  /// K-split add + rmsnorm (parts, splits, bias, delta; a = residual, w = norm weights), held only so
  /// that the next linear can name its weights for `prefetch` (l2_prefetch_kb); qkv_parts: the
  /// qkv linear's K slices not yet summed into `out` (n × width; parts, splits, bias), which rope and
  /// rope_kv carry on in the same fields until the attention prologue sums them (wgmma_qkv_slices).
  struct held_op {
    held_kind kind = held_kind::none;
    void* a = nullptr;
    const void* b = nullptr;
    const float* w = nullptr;
    float eps = 0.0f;
    void* out = nullptr;
    int n = 0;
    int width = 0;
    attn_shape shape{};
    const std::int32_t* positions = nullptr;
    const float* inv_freq = nullptr;
    float scaling = 1.0f;
    const std::int32_t* slots = nullptr;
    void* k_cache = nullptr;
    void* v_cache = nullptr;
    const float* parts = nullptr;
    int splits = 0;
    const float* bias = nullptr;
    void* delta = nullptr;
    l2_prefetch prefetch{};  ///< split_norm, silu: the next GEMM's weights (aim_prefetch)
    bool aimed = false;      ///< aim_prefetch has seen the GEMM that reads `out`
  };

  /// rope waits for kv_write; rmsnorm and silu_mul wait for a small linear only where one takes them.
  bool can_hold() const { return fuse_ && t_ == dtype::bf16; }
  norm_launch norm_how() const { return norm_launch{pdl_, norm_late_trigger_, norm_loads_ahead_}; }
  bool can_hold_for_gemv(int n) const { return can_hold() && small_gemm_ && n <= small_gemm_max_n_; }
  /// The K-split norm and silu_mul wait for the next call where it may name weights to prefetch.
  bool can_hold_for_prefetch() const { return l2_prefetch_bytes_ > 0 && pdl_ && t_ == dtype::bf16; }
  /// Where the held K-split norm or silu_mul computes x, the GEMM `bit` (l2_prefetch_mask) that
  /// reads it: the held kernel asks L2 for w's first l2_prefetch_kb before it waits. The first
  /// GEMM named decides (linear() after linear_into_attention's fallback names it again).
  void aim_prefetch(const void* x, const weight& w, int bit) {
    held_op& h = held_;
    if ((h.kind != held_kind::split_norm && h.kind != held_kind::silu) || h.out != x || h.aimed) return;
    h.aimed = true;
    if ((l2_prefetch_mask_ & bit) == 0 || w.type != dtype::bf16) return;
    h.prefetch = l2_prefetch_rows(w.data, static_cast<int>(w.rows), static_cast<std::size_t>(w.cols) * 2,
                                  l2_prefetch_bytes_);
  }
  static bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
  /// Whether the wgmma GEMM may take this bf16 product in place of the path linear() picks: not at
  /// token counts the GEMV takes, nor at those batch_invariant keeps row-invariant.
  bool wgmma_takes(const void* x, int n, const weight& w, const void* out) const {
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    const bool gemv_takes = small_gemm_ && n <= small_gemm_max_n_;
    return !gemv_takes && n > caps_.row_invariant_rows && t_ == dtype::bf16 && w.type == dtype::bf16 &&
           skinny_gemm_supported(n, rows, cols) && skinny_wgmma_supported(n, rows, cols) && aligned(x) &&
           aligned(w.data) && aligned(out);
  }

  /// Launches the held upload (with its overlay), then records its staging slot's event.
  void flush_upload() {
    if (pending_.words == 0) return;
    const pending_upload p = pending_;
    pending_ = pending_upload{};
    set_device();
    launch_upload_words(p.dst, p.host, p.words, p.ovl, p.ovl_at, p.ovl_words, stream_, pdl_ && upload_pdl_);
    CONVEYOR_CUDA_CHECK(cudaEventRecord(p.slot->done, stream_));
  }
  /// Runs the held upload and the held op on their own.
  void flush() {
    flush_upload();  // an upload is only held when nothing else is (upload() flushes first)
    if (held_.kind == held_kind::none) return;
    const held_op h = held_;
    held_.kind = held_kind::none;
    set_device();
    switch (h.kind) {
      case held_kind::norm:
        if (h.b != nullptr) {
          launch_rmsnorm(t_, h.a, h.b, h.n, h.width, h.w, h.eps, h.out, stream_, norm_how());
        } else {
          launch_rmsnorm(t_, nullptr, h.a, h.n, h.width, h.w, h.eps, h.out, stream_, norm_how());
        }
        break;
      case held_kind::silu: launch_silu_mul(t_, h.a, h.n, h.width, h.out, stream_, pdl_, h.prefetch); break;
      case held_kind::split_norm: {
        norm_launch how = norm_how();
        how.prefetch = h.prefetch;
        if (!launch_split_add_rmsnorm(h.parts, h.splits, h.bias, h.delta, h.a, h.n, h.width, h.w, h.eps, h.out,
                                      stream_, how)) {
          fail_cuda("linear_add_rmsnorm", "split add + rmsnorm refused a checked shape", __FILE__, __LINE__);
        }
        break;
      }
      case held_kind::qkv_parts: sum_qkv_parts(h); break;
      case held_kind::rope:
        sum_qkv_parts(h);
        launch_rope(t_, h.a, h.n, h.shape, h.positions, h.inv_freq, h.scaling, stream_);
        break;
      case held_kind::rope_kv:
        sum_qkv_parts(h);
        launch_rope_kv(t_, h.a, h.n, h.shape, h.positions, h.inv_freq, h.scaling, h.slots, h.k_cache, h.v_cache,
                       stream_, pdl_);
        break;
      case held_kind::none: break;
    }
  }

  /// A qkv held as K slices (qkv_parts, or a rope / rope_kv carrying them) summed into its rows.
  void sum_qkv_parts(const held_op& h) {
    if (h.parts == nullptr) return;
    const bool own = h.kind == held_kind::qkv_parts;
    const int width = own ? h.width : (h.shape.num_heads + 2 * h.shape.num_kv_heads) * h.shape.head_dim;
    launch_sum_parts(h.parts, h.splits, h.n, width, h.bias, own ? h.out : h.a, stream_, pdl_);
  }
  /// qkv_parts_ holds the K slices of an n × rows qkv: allocated once, at the first call, for the
  /// most tokens wgmma_qkv takes (a recording may allocate: its capture mode is relaxed, as for
  /// split_parts_); never regrown, since recorded graphs keep its address: a wider qkv later (another
  /// model's) keeps the cluster's sums. False where it does not fit or there is no memory.
  bool qkv_parts(int n, int rows) {
    const std::size_t need = static_cast<std::size_t>(attention_rope_kv::max_splits) * n * rows;
    if (qkv_parts_ == nullptr) {
      const std::size_t most =
          static_cast<std::size_t>(attention_rope_kv::max_splits) * std::max(n, wgmma_qkv_max_n_) * rows;
      if (cudaMalloc(&qkv_parts_, most * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        qkv_parts_ = nullptr;
        wgmma_qkv_slices_ = false;  // not asked again
        return false;
      }
      qkv_parts_floats_ = most;
    }
    return need <= qkv_parts_floats_;
  }

  /// bf16 linear with n ≤ 16 on the GEMV kernel, taking over a held norm or silu_mul that produces x.
  void small_linear(const void* x, int n, const weight& w, const weight& bias, void* out) {
    gemv_args a;
    a.w = static_cast<const __nv_bfloat16*>(w.data);
    a.bias = bias.empty() ? nullptr : static_cast<const float*>(bias.data);
    a.rows = static_cast<int>(w.rows);
    a.cols = static_cast<int>(w.cols);
    a.n = n;
    a.out = static_cast<__nv_bfloat16*>(out);
    gemv_prologue pro = gemv_prologue::none;
    const held_op& h = held_;
    const bool consumes = h.out == x && h.n == n && h.width == a.cols && out != h.a && out != h.b;
    a.cap_grid = gemv_cap_grid_ ? 1 : 0;
    a.stage_capped = gemv_stage_capped_ ? 1 : 0;
    // A grid between one and two waves of tiles (qkv_proj) can stay on the register kernel.
    const int tiles = gemv_tiles(a.rows);
    const bool partial_wave = tiles > num_sms_ && tiles < 2 * num_sms_;
    a.tma = gemv_tma_ && (gemv_tma_partial_wave_ || !partial_wave) ? 1 : 0;
    a.tma_ring_bytes = gemv_tma_ring_kb_ * 1024;
    if (h.kind == held_kind::norm && consumes && fuse_norm_ && gemv_one_wave(a, num_sms_) &&
        gemv_norm_smem_bytes(n, a.cols) <= gemv_max_norm_smem && aligned(h.a) && aligned(h.b) && aligned(h.w)) {
      pro = gemv_prologue::norm;
      a.residual = static_cast<__nv_bfloat16*>(h.a);
      a.delta = static_cast<const __nv_bfloat16*>(h.b);
      a.norm_w = h.w;
      a.eps = h.eps;
      a.x_out = static_cast<__nv_bfloat16*>(h.out);
      a.counter = counter_;
      held_.kind = held_kind::none;
    } else if (h.kind == held_kind::silu && consumes && aligned(h.a)) {
      pro = gemv_prologue::silu;
      a.x = static_cast<const __nv_bfloat16*>(h.a);
      a.x_out = static_cast<__nv_bfloat16*>(h.out);
      held_.kind = held_kind::none;
    } else {
      flush();
      a.x = static_cast<const __nv_bfloat16*>(x);
    }
    const int kind_bit = pro == gemv_prologue::silu   ? gemv_silu_prologue
                         : pro == gemv_prologue::norm ? gemv_norm_prologue
                                                      : gemv_no_prologue;
    a.norm_early = gemv_norm_early_ ? 1 : 0;
    a.late_trigger = (gemv_late_trigger_ & kind_bit) != 0 ? 1 : 0;
    if ((gemv_pre_wait_mask_ & kind_bit) != 0) a.pre_wait_stages = gemv_pre_wait_stages_;
    launch_gemv(a, pro, pdl_, num_sms_, stream_);
  }

  /// i8 / f8e4m3 weights. Decode (n ≤ 16, bf16): the fused kernel, weights cross HBM once as bytes.
  /// Otherwise row tiles are dequantized into quant_scratch_ and cuBLAS multiplies them: it reuses
  /// cuBLAS's tensor-core GEMM as is, and prefill is compute-bound, so the extra pass costs ~15%
  /// there (bench/NOTES.md). At batch 64 it costs 1.8x: the tile does not stay in L2 (the code
  /// stream evicts it), so a step moves ~5 bytes per weight. TODO(perf): dequantize inside the
  /// GEMM's tile loads (the fused kernel with more n-tiles for n ≤ 64, Marlin-style beyond).
  void quant_linear(const void* x, int n, const weight& w, const weight& bias, void* out) {
    flush();
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    const float* b = bias.empty() ? nullptr : static_cast<const float*>(bias.data);
    if (t_ == dtype::bf16 && quant_gemv_supported(n, rows, cols, x, w.data, out)) {
      return launch_quant_gemv(w.type, x, n, w.data, w.scales, b, rows, cols, out, stream_);
    }
    const std::size_t esize = dtype_size(t_);
    const int tile = static_cast<int>(std::max<std::size_t>(1, quant_scratch_bytes_ / (esize * cols)));
    const float one = 1.0f, zero = 0.0f;
    for (int r0 = 0; r0 < rows; r0 += tile) {
      const int m = std::min(tile, rows - r0);
      launch_dequantize_rows(t_, w.type, w.data, w.scales, r0, m, cols, quant_scratch_, stream_);
      CONVEYOR_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, cols, &one, quant_scratch_,
                                         cuda_type(t_), cols, x, cuda_type(t_), cols, &zero,
                                         static_cast<std::uint8_t*>(out) + r0 * esize, cuda_type(t_), rows,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (b != nullptr) launch_add_bias(t_, out, b, n, rows, stream_);
  }

  explicit cuda_backend(const cuda_backend_options& o)
      : device_(o.device), t_(o.compute_dtype), rows_per_pass_(o.sample_rows_per_pass), graphs_(o.graphs),
        small_gemm_(o.small_gemm), small_gemm_max_n_(o.small_gemm_max_n), fuse_(o.fuse), fuse_norm_(o.fuse_norm), pdl_(o.pdl),
        gemv_cap_grid_(o.gemv_cap_grid), gemv_stage_capped_(o.gemv_stage_capped), gemv_tma_(o.gemv_tma),
        gemv_tma_partial_wave_(o.gemv_tma_partial_wave), gemv_tma_ring_kb_(o.gemv_tma_ring_kb), gemv_norm_early_(o.gemv_norm_early), gemv_late_trigger_(o.gemv_late_trigger), gemv_pre_wait_mask_(o.gemv_pre_wait_mask), gemv_pre_wait_stages_(o.gemv_pre_wait_stages), gemm_tune_(o.gemm_tune), fuse_attention_(o.fuse && o.fuse_attention),
        skinny_gemm_(o.skinny_gemm), skinny_wgmma_(o.skinny_wgmma), skinny_min_n_(o.skinny_gemm_min_n),
        skinny_max_n_(o.skinny_gemm_max_n) {
    tune_.gqa_decode = o.gqa_decode;
    tune_.tc_prefill = o.tc_prefill;
    tune_.gqa_prefill = o.gqa_prefill;
    tune_.vec_decode = o.vec_decode;
    tune_.pdl = o.pdl;
    tune_.wide_decode = o.wide_decode;
    tune_.tc_decode = o.tc_decode;
    tune_.ring_decode = o.ring_decode;
    tune_.early_decode = o.early_decode;
    tune_.decode_carveout = o.decode_carveout;
    tune_.split_min_keys = o.decode_split_min_keys;
    tune_.one_split_max_keys = o.decode_one_split_max_keys;
    tune_.rope_once = o.rope_once;
    tune_.late_trigger = o.decode_late_trigger;
    tune_.fuse_splits = o.decode_fuse_splits;
    norm_late_trigger_ = o.norm_late_trigger;
    norm_loads_ahead_ = o.norm_loads_ahead;
    l2_prefetch_bytes_ = static_cast<std::size_t>(std::max(0, o.l2_prefetch_kb)) * 1024;
    l2_prefetch_mask_ = o.l2_prefetch_mask;
    upload_pdl_ = o.upload_pdl;
    if (o.batch_invariant && o.compute_dtype == dtype::bf16) {
      // The GEMV for every bf16 linear of ≤ 16 rows, and fixed key splits in decode attention.
      small_gemm_ = true;
      small_gemm_max_n_ = 16;
      tune_.split_len = batch_invariant_split_len;
      caps_.row_invariant_rows = 16;
    }
    tune_no_ring_ = tune_;
    tune_no_ring_.ring_decode = 0;
    tune_after_early_qkv_ = tune_;
    tune_after_early_qkv_.ring_decode = std::clamp(o.wgmma_qkv_ring_decode, 0, 2);
    wgmma_qkv_ = o.wgmma_qkv;
    wgmma_push_reduce_ = o.wgmma_push_reduce;
    wgmma_qkv_slices_ = o.wgmma_qkv_slices;
    wgmma_qkv_slices_min_n_ = o.wgmma_qkv_slices_min_n;
    wgmma_split_ = o.wgmma_split;
    wgmma_split_max_n_ = o.wgmma_split_max_n;
    wgmma_split_short_k_max_n_ = o.wgmma_split_short_k_max_n;
    wgmma_swiglu_ = o.wgmma_swiglu;
    wgmma_swiglu_min_n_ = o.wgmma_swiglu_min_n;
    wgmma_swiglu_max_n_ = o.wgmma_swiglu_max_n;
    wgmma_qkv_min_n_ = o.wgmma_qkv_min_n;
    wgmma_qkv_max_n_ = o.wgmma_qkv_max_n;
    ring_decode_max_seqs_ = o.ring_decode_max_seqs;
    fused_decode_ = o.fused_decode;
    fused_l2_ahead_ = std::max(0, o.fused_l2_ahead);
    split_linears_ = o.split_linears;
    split_margin_us_ = o.split_linear_margin_us;
    split_max_n_ = o.split_linear_max_n;
    gemm_tuning_cache_ = o.gemm_tuning_cache;
    kernel_copies_ = o.kernel_copies;
    caps_.name = "cuda";
    caps_.host_memory = false;
    caps_.act_dtype = caps_.weight_dtype = caps_.kv_dtype = o.compute_dtype;
    partial_floats_ = o.attention_workspace_bytes / sizeof(float);
    quant_scratch_bytes_ = o.quant_scratch_bytes;
  }

  // Everything an op could need, so ops never allocate (the sort workspace, which depends on the
  // vocabulary, is the exception: allocated at the first sample call).
  status init() {
    auto fail = [](const char* what, const char* why) {
      return make_error(errc::internal, std::string("CUDA backend: ") + what + ": " + why);
    };
    if (auto e = cudaSetDevice(device_); e != cudaSuccess) return fail("cudaSetDevice", cudaGetErrorString(e));
    if (auto e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return fail("cudaStreamCreate", cudaGetErrorString(e));
    }
    if (auto e = cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_); e != cudaSuccess) {
      return fail("cudaDeviceGetAttribute", cudaGetErrorString(e));
    }
    draws_.emplace(draw_context{device_, stream_, t_, rows_per_pass_, kernel_copies_, num_sms_,
                                [this](std::size_t bytes) { return alloc(bytes); }});
    if (auto st = cublasCreate(&cublas_); st != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return fail("cublasCreate", cublasGetStatusString(st));
    }
    CONVEYOR_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // A fixed cuBLAS workspace: no allocation inside a GEMM (CUDA-graph capture needs that).
    constexpr std::size_t cublas_ws_bytes = 32ull << 20;
    cublas_ws_ = alloc(cublas_ws_bytes);
    partials_ = static_cast<float*>(alloc(partial_floats_ * sizeof(float)));
    split_done_ = static_cast<unsigned*>(alloc(split_done_count * sizeof(unsigned)));
    if (cublas_ws_ == nullptr || partials_ == nullptr || split_done_ == nullptr) {
      return make_error(errc::out_of_memory, "CUDA backend: no device memory for its workspace");
    }
    CONVEYOR_CUDA_CHECK(cudaMemsetAsync(split_done_, 0, split_done_count * sizeof(unsigned), stream_));
    CONVEYOR_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, cublas_ws_bytes));
    // gemm_tune's choices, and linear_add_rmsnorm's K split (which times itself against the plain
    // GEMM, tuned or cublasGemmEx's own).
    if (gemm_tune_ || split_linears_) {
      lt_ = std::make_unique<lt_gemm>(cublas_ws_, cublas_ws_bytes);
      if (!gemm_tuning_cache_.empty()) lt_->use_cache(gemm_tuning_cache_, tuning_device_key());
    }
    counter_ = static_cast<unsigned*>(alloc(256));
    if (counter_ == nullptr) return make_error(errc::out_of_memory, "CUDA backend: no device memory for its workspace");
    CONVEYOR_CUDA_CHECK(cudaMemset(counter_, 0, 256));
    gemv_init();
    skinny_gemm_init();
    if (fused_decode_) fused_blocks_ = fused_decode_blocks(num_sms_);
    // The wgmma paths are off where the GPU or driver lacks the kernel (one init for all three).
    const bool have_wgmma = (skinny_wgmma_ || wgmma_qkv_ || wgmma_split_ || wgmma_swiglu_) && skinny_wgmma_init();
    skinny_wgmma_ = skinny_wgmma_ && have_wgmma;
    wgmma_qkv_ = wgmma_qkv_ && have_wgmma;
    wgmma_split_ = wgmma_split_ && have_wgmma;
    wgmma_swiglu_ = wgmma_swiglu_ && have_wgmma;
    quant_scratch_ = alloc(quant_scratch_bytes_);
    if (quant_scratch_ == nullptr) return make_error(errc::out_of_memory, "CUDA backend: no device memory for its workspace");
    {
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_);
      caps_.int8_weights = true;
      caps_.fp8_weights = major * 10 + minor >= 89;  // the E4M3 -> f16x2 cvt (sm_89+)
    }
    for (auto& slot : staging_) {
      if (cudaMallocHost(&slot.host, staging_bytes) != cudaSuccess ||
          cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return make_error(errc::out_of_memory, "CUDA backend: no pinned host memory for upload staging");
      }
    }
    return ok_status();
  }

  void set_device() { CONVEYOR_CUDA_CHECK(cudaSetDevice(device_)); }

  /// A draw in the stream's order: after the held ops, and never while recording (it waits for the
  /// slot's last draw and fills pinned host memory).
  void draw_into(int slot, const void* logits, int n, int vocab, const sample_params* params) {
    flush();
    set_device();
    if (capturing_) fail_cuda("draw", "called while capturing", __FILE__, __LINE__);
    draws_->draw(slot, logits, n, vocab, params);
  }
  // Weight staging can be gigabytes for an embedding table: give it back after each upload.
  void release_staging() {
    if (convert_buf_.capacity() > (1u << 24)) std::vector<float>().swap(convert_buf_);
    if (u16_buf_.capacity() > (1u << 24)) std::vector<std::uint16_t>().swap(u16_buf_);
  }

  struct staging_slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  static constexpr std::size_t staging_bytes = 4u << 20;
  /// Uploads up to this size go by a kernel reading the pinned slot (a decode plan of batch 256 is
  /// ~40 KB); larger ones by the copy engine, which streams them faster.
  static constexpr std::size_t kernel_upload_bytes = 64u << 10;
  /// An upload held for the next call: dst[0, words) from the slot's host words, with the overlay
  /// ovl[0, ovl_words) at ovl_at (copy_draw).
  struct pending_upload {
    std::uint32_t* dst = nullptr;
    const std::uint32_t* host = nullptr;
    int words = 0;
    staging_slot* slot = nullptr;
    const std::uint32_t* ovl = nullptr;
    int ovl_at = 0;
    int ovl_words = 0;
  };
  pending_upload pending_{};

  backend_caps caps_;
  int device_;
  dtype t_;
  int rows_per_pass_;
  bool graphs_, small_gemm_;
  int small_gemm_max_n_;
  bool fuse_, fuse_norm_, pdl_, gemv_cap_grid_, gemv_stage_capped_, gemv_tma_, gemv_tma_partial_wave_;
  int gemv_tma_ring_kb_;
  bool gemv_norm_early_;
  bool norm_late_trigger_ = false;  ///< cuda_backend_options::norm_late_trigger
  int norm_loads_ahead_ = 2;        ///< cuda_backend_options::norm_loads_ahead
  std::size_t l2_prefetch_bytes_ = 0;  ///< cuda_backend_options::l2_prefetch_kb, in bytes
  int l2_prefetch_mask_ = 0;           ///< cuda_backend_options::l2_prefetch_mask
  bool upload_pdl_ = true;          ///< cuda_backend_options::upload_pdl
  int gemv_late_trigger_, gemv_pre_wait_mask_, gemv_pre_wait_stages_;
  bool gemm_tune_, fuse_attention_;
  bool skinny_gemm_;
  bool skinny_wgmma_;
  int skinny_min_n_, skinny_max_n_;
  /// Token counts up to this go through lt_ (decode steps; the largest batch bucket measured).
  static constexpr int gemm_tune_max_n = 256;
  std::unique_ptr<lt_gemm> lt_;
  attention_tuning tune_;
  attention_tuning tune_no_ring_;  // tune_ with ring_decode 0 (steps over ring_decode_max_seqs)
  attention_tuning tune_after_early_qkv_;  // tune_ with wgmma_qkv_ring_decode (after an early-releasing qkv)
  bool wgmma_qkv_ = false;                 ///< cuda_backend_options::wgmma_qkv (and the GPU has the kernel)
  bool wgmma_push_reduce_ = false;         ///< cuda_backend_options::wgmma_push_reduce
  bool wgmma_qkv_slices_ = false;          ///< cuda_backend_options::wgmma_qkv_slices
  int wgmma_qkv_slices_min_n_ = 2;
  float* qkv_parts_ = nullptr;             ///< wgmma_qkv_slices' K slices (qkv_parts())
  std::size_t qkv_parts_floats_ = 0;
  int wgmma_qkv_min_n_ = 0, wgmma_qkv_max_n_ = 0;
  bool wgmma_split_ = false;  ///< cuda_backend_options::wgmma_split (and the GPU has the kernel)
  int wgmma_split_max_n_ = 128;  ///< cuda_backend_options::wgmma_split_max_n
  std::string gemm_tuning_cache_;  ///< cuda_backend_options::gemm_tuning_cache

  /// What a tuning cache entry was timed on: the GPU's name, its compute capability and cuBLASLt's
  /// version ("NVIDIA_H100_80GB_HBM3_sm90_lt130400"): another GPU or library times afresh.
  std::string tuning_device_key() const {
    cudaDeviceProp prop{};
    std::string name = cudaGetDeviceProperties(&prop, device_) == cudaSuccess ? prop.name : "unknown";
    for (char& c : name) {
      if (c == ' ' || c == '\t') c = '_';
    }
    return name + "_sm" + std::to_string(prop.major * 10 + prop.minor) + "_lt" + std::to_string(cublasLtGetVersion());
  }
  int wgmma_split_short_k_max_n_ = 128;  ///< cuda_backend_options::wgmma_split_short_k_max_n
  bool wgmma_swiglu_ = false;  ///< cuda_backend_options::wgmma_swiglu (and the GPU has the kernel)
  int wgmma_swiglu_min_n_ = 0, wgmma_swiglu_max_n_ = 0;  ///< set from the options, like wgmma_qkv's
  bool qkv_early_ = false;  ///< the last linear_into_attention released its dependents early
  int ring_decode_max_seqs_ = 0;
  held_op held_;
  bool capturing_ = false;
  bool kernel_copies_ = true;
  unsigned* counter_ = nullptr;
  /// counter_[fused_sync_word ..+1]: the fused decode kernel's barrier words (the GEMV uses word 0)
  static constexpr int fused_sync_word = 16;
  /// counter_[fused_head_sync_word ..+fused_max_kv_heads]: its per-KV-head arrival words
  static constexpr int fused_head_sync_word = 32;
  static_assert(fused_head_sync_word + fused_max_kv_heads <= 64, "counter_ holds 64 words");
  bool fused_decode_ = false;
  int fused_l2_ahead_ = 0;
  bool split_linears_ = true;  ///< cuda_backend_options::split_linears
  float split_margin_us_ = 0.5f;  ///< cuda_backend_options::split_linear_margin_us
  int split_max_n_ = 128;         ///< cuda_backend_options::split_linear_max_n
  float* split_parts_ = nullptr;  ///< the K slices, lt_gemm::max_split × gemm_tune_max_n × width floats
  std::size_t split_parts_floats_ = 0;
  int fused_blocks_ = 0;  ///< the fused decode kernel's grid (one block an SM); 0: it cannot run here
  std::array<staging_slot, 2> staging_{};
  std::size_t next_staging_ = 0;
  capture_id next_capture_id_ = 1;
  std::unordered_map<capture_id, cudaGraphExec_t> graph_execs_;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  void* quant_scratch_ = nullptr;
  std::size_t quant_scratch_bytes_ = 0;
  float* partials_ = nullptr;
  std::size_t partial_floats_ = 0;
  /// attention_rope_kv::split_done: enough for 256 sequences × 32 KV heads (a decode step past that
  /// runs the separate rope_kv and combine launches).
  static constexpr int split_done_count = 8192;
  unsigned* split_done_ = nullptr;
  std::optional<cuda_draws> draws_;  ///< made in init(), once the stream exists
  std::vector<float> convert_buf_;
  std::vector<std::uint16_t> u16_buf_;
};

}  // namespace

std::string default_gemm_tuning_cache() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  const std::string dir = env("CONVEYOR_CACHE_DIR");
  if (dir == "off") return {};
  if (!dir.empty()) return dir + "/gemm-tuning.txt";
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/conveyor/gemm-tuning.txt";
  if (const std::string home = env("HOME"); !home.empty()) return home + "/.cache/conveyor/gemm-tuning.txt";
  return {};
}

result<std::unique_ptr<backend>> make_cuda_backend(const cuda_backend_options& options) {
  return cuda_backend::create(options);
}

void* cuda_stream_of(backend& b) {
  auto* cb = dynamic_cast<cuda_backend*>(&b);
  return cb != nullptr ? static_cast<void*>(cb->stream()) : nullptr;
}

}  // namespace conveyor::kernels
