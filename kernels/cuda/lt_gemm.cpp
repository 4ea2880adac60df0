#include "lt_gemm.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <limits>
#include <mutex>
#include <vector>

#include "check.hpp"

namespace conveyor::kernels::cuda {

namespace {

#define CONVEYOR_LT_CHECK(call) CONVEYOR_CUBLAS_CHECK(call)

/// The algorithm chosen for (rows, cols, token bucket), shared by every backend of the process.
struct choice {
  bool use_lt = false;
  cublasLtMatmulAlgo_t algo{};
  float ms = 0.0f;          ///< the tuned time of the choice (at the tuning's n)
  float ms_default = 0.0f;  ///< cublasGemmEx's own choice's time there
};
/// The K split chosen for (rows, cols, token bucket, margin in ns): splits 0 = none.
struct split_choice {
  int splits = 0;
  cublasLtMatmulAlgo_t algo{};
};
std::map<std::array<int, 4>, split_choice>& split_choices() {
  static std::map<std::array<int, 4>, split_choice> m;
  return m;
}
std::mutex choices_mu;
std::map<std::array<int, 3>, choice>& choices() {
  static std::map<std::array<int, 3>, choice> m;
  return m;
}

int bucket(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return b;
}

/// An algorithm replaces cublasGemmEx's own choice only when this much faster (timing noise).
constexpr float min_gain = 0.97f;

}  // namespace

lt_gemm::lt_gemm(void* workspace, std::size_t workspace_bytes) : ws_(workspace), ws_bytes_(workspace_bytes) {
  CONVEYOR_LT_CHECK(cublasLtCreate(&lt_));
  // Made here, not at the first tuning: that may run while the backend's stream is captured.
  CONVEYOR_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  // Own cuBLAS handle on the side stream for timing the default (cublasSetStream on the backend's
  // handle would reset its fixed workspace); same workspace, used by one GEMM at a time.
  CONVEYOR_CUBLAS_CHECK(cublasCreate(&blas_));
  CONVEYOR_CUBLAS_CHECK(cublasSetStream(blas_, side_));
  CONVEYOR_CUBLAS_CHECK(cublasSetWorkspace(blas_, ws_, ws_bytes_));
  for (auto& e : ev_) CONVEYOR_CUDA_CHECK(cudaEventCreate(&e));
}

lt_gemm::~lt_gemm() {
  for (auto& [k, p] : split_plans_) {
    for (auto* l : {p.a, p.b, p.d}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  }
  for (auto& [k, p] : plans_) {
    if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  }
  for (auto& e : ev_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (side_ != nullptr) {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
  }
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(tuned_gemm::algo), "cuBLASLt's algorithm is 8 words");

void lt_gemm::use_cache(const std::string& path, const std::string& device_key) {
  cache_path_ = path;
  device_key_ = device_key;
  if (path.empty()) return;
  auto got = read_tuning_cache(path, device_key);
  if (!got) {
    std::fprintf(stderr, "conveyor: %s; GEMM shapes are timed afresh\n", got.err().message.c_str());
    cache_warned_ = true;
    return;
  }
  for (const auto& w : got->warnings) std::fprintf(stderr, "conveyor: GEMM tuning cache %s\n", w.c_str());
  std::lock_guard<std::mutex> lock(choices_mu);
  for (const auto& e : got->entries) {
    cublasLtMatmulAlgo_t algo{};
    std::memcpy(&algo, e.algo.data(), sizeof algo);
    if (e.kind == tuned_gemm::kind_t::plain) {
      choices().emplace(std::array<int, 3>{e.shape[0], e.shape[1], e.shape[2]}, choice{e.use_lt, algo, e.ms, e.ms_default});
    } else {
      split_choices().emplace(e.shape, split_choice{e.splits, algo});
    }
  }
}

void lt_gemm::remember(const tuned_gemm& e) {
  if (cache_path_.empty()) return;
  if (status st = merge_tuning_cache(cache_path_, device_key_, {e}); !st.ok() && !cache_warned_) {
    std::fprintf(stderr, "conveyor: GEMM tuning cache not kept: %s\n", st.err().message.c_str());
    cache_warned_ = true;
  }
}

bool lt_gemm::run( const void* w, const void* x, void* out, int rows, int n, int cols,
                  cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes) {
  plan& p = plan_for(w, x, out, rows, n, cols, stream, capturing, flush, flush_bytes);
  if (!p.use_lt) return false;
  const float one = 1.0f, zero = 0.0f;
  CONVEYOR_LT_CHECK(
      cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, out, p.c, out, p.c, &p.algo, ws_, ws_bytes_, stream));
  return true;
}

lt_gemm::plan& lt_gemm::plan_for(const void* w, const void* x, void* out, int rows, int n,
                                 int cols, cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes) {
  const key k{rows, cols, n};
  if (auto it = plans_.find(k); it != plans_.end()) return it->second;
  plan& p = plans_[k];
  CONVEYOR_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CONVEYOR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  CONVEYOR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  // Column-major views of the row-major tensors: W is cols × rows (op T), x cols × n, out rows × n.
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, cols, rows, cols));
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, cols, n, cols));
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, rows, n, rows));

  const std::array<int, 3> ck{rows, cols, bucket(n)};
  std::lock_guard<std::mutex> lock(choices_mu);
  auto it = choices().find(ck);
  if (it == choices().end()) {
    float ms_default = 0.0f;
    const float ms = tune(p, w, x, out, rows, n, cols, stream, capturing, flush, flush_bytes, ms_default);
    choices()[ck] = choice{p.use_lt, p.algo, ms, ms_default};
    tuned_gemm e;
    e.shape = {ck[0], ck[1], ck[2], 0};
    e.use_lt = p.use_lt;
    e.ms = ms;
    e.ms_default = ms_default;
    std::memcpy(e.algo.data(), &p.algo, sizeof e.algo);
    remember(e);
    return p;
  }
  p.use_lt = false;
  if (it->second.use_lt) {  // tuned at another n of the bucket: is the algorithm valid here?
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt_, p.desc, p.a, p.b, p.c, p.c, &it->second.algo, &r) == CUBLAS_STATUS_SUCCESS &&
        r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes_) {
      p.use_lt = true;
      p.algo = it->second.algo;
    }
  }
  return p;
}

template <class Launch>
float lt_gemm::time_on_side(Launch&& launch, void* flush, std::size_t flush_bytes) {
  if (!launch()) return std::numeric_limits<float>::infinity();
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    if (flush != nullptr && flush_bytes > 0) CONVEYOR_CUDA_CHECK(cudaMemsetAsync(flush, r, flush_bytes, side_));
    CONVEYOR_CUDA_CHECK(cudaEventRecord(ev_[2 * r], side_));
    launch();
    CONVEYOR_CUDA_CHECK(cudaEventRecord(ev_[2 * r + 1], side_));
  }
  CONVEYOR_CUDA_CHECK(cudaEventSynchronize(ev_[2 * reps - 1]));
  for (int r = 0; r < reps; ++r) {
    float ms = 0.0f;
    CONVEYOR_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[2 * r], ev_[2 * r + 1]));
    t.push_back(ms);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

int lt_gemm::candidates(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t d, std::array<cublasLtMatmulHeuristicResult_t, max_candidates>& out) {
  cublasLtMatmulPreference_t pref = nullptr;
  CONVEYOR_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CONVEYOR_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_,
                                                         sizeof(ws_bytes_)));
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, b, d, d, pref, max_candidates, out.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  return hs == CUBLAS_STATUS_SUCCESS ? found : 0;
}

void lt_gemm::side_after(cudaStream_t stream, bool capturing) {
  if (capturing) return;  // x is written by work still queued on the stream
  CONVEYOR_CUDA_CHECK(cudaEventRecord(ev_[2 * reps], stream));
  CONVEYOR_CUDA_CHECK(cudaStreamWaitEvent(side_, ev_[2 * reps], 0));
}

float lt_gemm::tune(plan& p, const void* w, const void* x, void* out, int rows, int n, int cols,
                    cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes, float& ms_default) {
  ms_default = std::numeric_limits<float>::infinity();
  p.use_lt = false;
  std::array<cublasLtMatmulHeuristicResult_t, max_candidates> cand{};
  const int found = candidates(p.desc, p.a, p.b, p.c, cand);
  if (found <= 0) return std::numeric_limits<float>::infinity();

  cublasHandle_t h = blas_;
  side_after(stream, capturing);
  const float one = 1.0f, zero = 0.0f;
  // Median of `reps` runs, each after L2 was overwritten; +inf where the launch is refused.
  const float t_default = time_on_side(
      [&] {
        return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, CUDA_R_16BF, cols, x, CUDA_R_16BF,
                            cols, &zero, out, CUDA_R_16BF, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
               CUBLAS_STATUS_SUCCESS;
      },
      flush, flush_bytes);
  ms_default = t_default;
  float best = t_default * min_gain;
  for (int i = 0; i < found; ++i) {
    if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > ws_bytes_) continue;
    const float t = time_on_side(
        [&] {
          return cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, out, p.c, out, p.c, &cand[i].algo, ws_,
                                ws_bytes_, side_) == CUBLAS_STATUS_SUCCESS;
        },
        flush, flush_bytes);
    if (t < best) {
      best = t;
      p.use_lt = true;
      p.algo = cand[i].algo;
    }
  }
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(side_));
  cudaGetLastError();  // a refused candidate launch leaves no error behind
  return p.use_lt ? best : t_default;
}

lt_gemm::split_plan& lt_gemm::split_plan_for(int rows, int n, int cols, int splits) {
  const std::array<int, 4> k{rows, cols, n, splits};
  if (auto it = split_plans_.find(k); it != split_plans_.end()) return it->second;
  split_plan& p = split_plans_[k];
  CONVEYOR_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CONVEYOR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  CONVEYOR_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  // Batch s: W's and x's columns s·k .. (k = cols / splits) with the full row pitch, D float32.
  const int k_slice = cols / splits;
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k_slice, rows, cols));
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k_slice, n, cols));
  CONVEYOR_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, rows, n, rows));
  const long long in_stride = k_slice, out_stride = static_cast<long long>(rows) * n;
  for (auto* l : {p.a, p.b, p.d}) {
    const long long stride = l == p.d ? out_stride : in_stride;
    CONVEYOR_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &splits, sizeof(splits)));
    CONVEYOR_LT_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return p;
}

int lt_gemm::split_for(const void* w, const void* x, float* parts, int rows, int n, int cols, cudaStream_t stream,
                       bool capturing, void* flush, std::size_t flush_bytes, float margin_us, bool plain_tuned) {
  // The plain GEMM's choice (and its time) first: the split must beat what run() would do.
  plan& plain = plan_for(w, x, parts, rows, n, cols, stream, capturing, flush, flush_bytes);
  (void)plain;
  const std::array<int, 4> ck{rows, cols, bucket(n), static_cast<int>(margin_us * 1000.0f) * 2 + (plain_tuned ? 1 : 0)};
  std::lock_guard<std::mutex> lock(choices_mu);
  if (auto it = split_choices().find(ck); it != split_choices().end()) {
    const split_choice c = it->second;
    if (c.splits == 0) return 0;
    split_plan& p = split_plan_for(rows, n, cols, c.splits);
    if (!p.ok) {
      cublasLtMatmulHeuristicResult_t r{};
      p.ok = cublasLtMatmulAlgoCheck(lt_, p.desc, p.a, p.b, p.d, p.d, &c.algo, &r) == CUBLAS_STATUS_SUCCESS &&
             r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes_;
      p.algo = c.algo;
    }
    return p.ok ? c.splits : 0;
  }
  const auto plain_it = choices().find({rows, cols, bucket(n)});
  const float t_plain = plain_it == choices().end()  ? std::numeric_limits<float>::infinity()
                        : plain_tuned                ? plain_it->second.ms
                                                     : plain_it->second.ms_default;
  split_choice best{};
  float t_best = t_plain - margin_us * 1e-3f;
  side_after(stream, capturing);
  const float one = 1.0f, zero = 0.0f;
  for (int splits = 2; splits <= max_split; splits *= 2) {
    if (cols % (splits * 8) != 0) continue;  // every slice 16-byte aligned
    split_plan& p = split_plan_for(rows, n, cols, splits);
    std::array<cublasLtMatmulHeuristicResult_t, max_candidates> cand{};
    const int found = candidates(p.desc, p.a, p.b, p.d, cand);
    for (int i = 0; i < found; ++i) {
      if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > ws_bytes_) continue;
      const float t = time_on_side(
          [&] {
            return cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, parts, p.d, parts, p.d, &cand[i].algo,
                                  ws_, ws_bytes_, side_) == CUBLAS_STATUS_SUCCESS;
          },
          flush, flush_bytes);
      if (t < t_best) {
        t_best = t;
        best = split_choice{splits, cand[i].algo};
      }
    }
  }
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(side_));
  cudaGetLastError();
  if (std::getenv("CONVEYOR_SPLIT_LOG") != nullptr) {  // bench: what the tuning decided and why
    std::fprintf(stderr, "[split] %d x %d n=%d: plain %.2f us, split %s %.2f us (margin %.2f)\n", rows, cols, n,
                 t_plain * 1e3f, best.splits == 0 ? "none" : std::to_string(best.splits).c_str(),
                 best.splits == 0 ? 0.0f : t_best * 1e3f, margin_us);
  }
  split_choices()[ck] = best;
  {
    tuned_gemm e;
    e.kind = tuned_gemm::kind_t::split;
    e.shape = ck;
    e.splits = best.splits;
    std::memcpy(e.algo.data(), &best.algo, sizeof e.algo);
    remember(e);
  }
  if (best.splits == 0) return 0;
  split_plan& p = split_plan_for(rows, n, cols, best.splits);
  p.ok = true;
  p.algo = best.algo;
  return best.splits;
}

void lt_gemm::run_split(const void* w, const void* x, float* parts, int rows, int n, int cols, int splits,
                        cudaStream_t stream) {
  split_plan& p = split_plan_for(rows, n, cols, splits);
  const float one = 1.0f, zero = 0.0f;
  CONVEYOR_LT_CHECK(cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, parts, p.d, parts, p.d, &p.algo, ws_,
                                   ws_bytes_, stream));
}

}  // namespace conveyor::kernels::cuda
