// Decode-batch linears (the 1B's shapes, n tokens) as cuBLASLt runs them now (the fastest of its
// heuristics' algorithms, bf16 out: cuBLAS's own split-K and its reduce kernel included where it
// picks them) against the same GEMM cut along K into S strided batches with float32 outputs, whose
// sum a following elementwise kernel (add + rmsnorm, silu_mul) could take instead of cuBLAS's reduce
// (bench/NOTES.md, session 10). Each configuration is timed as a CUDA graph of `reps` launches over
// enough weight copies (≥ 256 MB) that every launch reads HBM, as in a decode step's graph.
//   usage: time_splitk [N]   (default 64)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace {

#define CK(call)                                                                          \
  do {                                                                                    \
    const auto e_ = (call);                                                               \
    if (static_cast<int>(e_) != 0) {                                                      \
      std::printf("time_splitk: %s failed (%d) at line %d\n", #call, static_cast<int>(e_), __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

struct gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~gemm() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// out(rows × n) = op_T(W: cols × rows) · x(cols × n) in column-major terms, K = cols cut into S
// batches of cols / S (batch i: W and x offset by i · cols / S, ld cols), D float32 (S = 0: one
// GEMM with a bf16 D, as the backend runs it).
void make(gemm& g, int rows, int cols, int n, int S) {
  CK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
  const int k = S == 0 ? cols : cols / S;
  CK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, rows, cols));
  CK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, n, cols));
  CK(cublasLtMatrixLayoutCreate(&g.d, S == 0 ? CUDA_R_16BF : CUDA_R_32F, rows, n, rows));
  if (S > 0) {
    const int count = S;
    const long long ab = k, dd = static_cast<long long>(rows) * n;
    for (auto* l : {g.a, g.b}) {
      CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ab, sizeof(ab)));
    }
    CK(cublasLtMatrixLayoutSetAttribute(g.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    CK(cublasLtMatrixLayoutSetAttribute(g.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &dd, sizeof(dd)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 64;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("time_splitk: skipped: no CUDA device\n");
    return 0;
  }
  cublasLtHandle_t lt = nullptr;
  CK(cublasLtCreate(&lt));
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::size_t ws_bytes = 32u << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  const int hidden = 2048, ffn = 8192;
  for (auto [rows, cols, name] : {std::tuple{3 * hidden, hidden, "qkv"}, {hidden, hidden, "o_proj"},
                                  {2 * ffn, hidden, "gate_up"}, {hidden, ffn, "down"}}) {
    const std::size_t wbytes = static_cast<std::size_t>(rows) * cols * 2;
    const int copies = static_cast<int>(std::max<std::size_t>(1, (256u << 20) / wbytes + 1));
    std::vector<void*> w(copies);
    for (auto& p : w) {
      CK(cudaMalloc(&p, wbytes));
      CK(cudaMemset(p, 0x3c, wbytes));
    }
    void *x = nullptr, *out = nullptr;
    CK(cudaMalloc(&x, static_cast<std::size_t>(n) * cols * 2));
    CK(cudaMemset(x, 0x3c, static_cast<std::size_t>(n) * cols * 2));
    CK(cudaMalloc(&out, static_cast<std::size_t>(8) * rows * n * 4));
    for (int S : {0, 1, 2, 4, 8}) {
      gemm g;
      make(g, rows, cols, n, S);
      cublasLtMatmulPreference_t pref = nullptr;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t cand[16];
      int found = 0;
      cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.a, g.b, g.d, g.d, pref, 16, cand, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      float best = std::numeric_limits<float>::infinity();
      int best_i = -1;
      const float one = 1.0f, zero = 0.0f;
      const int reps = std::max(24, 2 * copies);
      for (int i = 0; i < found; ++i) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > ws_bytes) continue;
        if (cublasLtMatmul(lt, g.desc, &one, w[0], g.a, x, g.b, &zero, out, g.d, out, g.d, &cand[i].algo, ws,
                           ws_bytes, s) != CUBLAS_STATUS_SUCCESS) {
          cudaGetLastError();
          continue;
        }
        CK(cudaStreamSynchronize(s));
        cudaGraph_t graph = nullptr;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        for (int r = 0; r < reps; ++r) {
          cublasLtMatmul(lt, g.desc, &one, w[r % copies], g.a, x, g.b, &zero, out, g.d, out, g.d, &cand[i].algo, ws,
                         ws_bytes, s);
        }
        CK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec = nullptr;
        CK(cudaGraphInstantiate(&exec, graph, 0));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> t;
        for (int round = 0; round < 6; ++round) {
          CK(cudaEventRecord(e0, s));
          CK(cudaGraphLaunch(exec, s));
          CK(cudaEventRecord(e1, s));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (round > 0) t.push_back(ms * 1e3f / reps);
        }
        std::sort(t.begin(), t.end());
        if (t[t.size() / 2] < best) {
          best = t[t.size() / 2];
          best_i = i;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
      if (best_i < 0) {
        std::printf("[splitk] %-8s n=%d S=%d: no algorithm\n", name, n, S);
        continue;
      }
      int splitk = 0, tile = 0;
      std::size_t got = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&cand[best_i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                           &got);
      cublasLtMatmulAlgoConfigGetAttribute(&cand[best_i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
      std::printf("[splitk] %-8s n=%d %s: %7.2f us a GEMM in a graph (%.2f TB/s of weights), of %d candidates; "
                  "its own split-K %d, tile id %d\n",
                  name, n, S == 0 ? "bf16 out, one GEMM (as now)" : (std::string("S=") + std::to_string(S) + " f32 batches").c_str(),
                  best, wbytes / (best * 1e-6) / 1e12, found, splitk, tile);
    }
    for (auto* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(out);
  }
  cudaFree(ws);
  cudaStreamDestroy(s);
  cublasLtDestroy(lt);
  return 0;
}
