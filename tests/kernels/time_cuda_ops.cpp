// A small timing table of the CUDA ops at Llama-3.2-1B shapes (bf16), for scripts/gpu-suite. Not a
// test: it prints median times and the bandwidth or FLOP rate they imply, to compare with the
// H200's measured ceilings (~4.2 TB/s copy, ~790 TFLOP/s bf16 GEMM).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <cstdlib>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../../kernels/cuda/fused_decode.hpp"
#include "cuda_test_util.hpp"
#include "gemv_stamps.hpp"

namespace {

using namespace conveyor;
namespace ct = conveyor::testing;
using kernels::dtype;

/// Median wall time of `fn` in microseconds (each run synchronised; after warm-up).
double time_us(kernels::backend& b, const std::function<void()>& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) fn();
  b.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    b.synchronize();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Random bf16-representable values, a 1M-value random block repeated: filling gigabytes with fresh
/// normal draws would cost more host time than the timings themselves.
std::vector<float> fill(std::mt19937_64& rng, std::size_t n, float scale = 1.0f) {
  static std::vector<float> block;
  if (block.empty()) block = conveyor::testing::random_values(rng, 1u << 20, conveyor::kernels::dtype::bf16);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = block[i % block.size()] * scale;
  return v;
}

void row(const char* what, double us, double bytes, double flops) {
  std::printf("[timing] %-44s %10.1f us  %8.1f GB/s  %8.1f TFLOP/s\n", what, us, bytes / us * 1e-3, flops / us * 1e-6);
}

/// Median time in microseconds of one call of `fn(i)` (i = 0 .. reps - 1), `reps` calls back to
/// back on the backend's stream between two events, over `rounds` rounds of which the first warms up.
double stream_us(kernels::backend& b, int reps, int rounds, const std::function<void(int)>& fn) {
  auto s = static_cast<cudaStream_t>(kernels::cuda_stream_of(b));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int rep = 0; rep < rounds; ++rep) {
    b.synchronize();
    cudaEventRecord(e0, s);
    for (int i = 0; i < reps; ++i) fn(i);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) t.push_back(ms * 1e3 / reps);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// gate_up + SwiGLU of the 1B (2 ffn × hidden) at decode batches: cuBLAS's GEMM + silu_mul, the
/// wgmma GEMM + silu_mul, and the wgmma GEMM with the SwiGLU in its epilogue (wgmma_swiglu), each
/// `reps` times back to back over ≥ 256 MB of weight copies (from HBM, as in a step), with PDL.
/// The kernel on its own, apart from a step's neighbours (bench/NOTES.md, session 16).
void time_swiglu(std::mt19937_64& rng, const std::vector<int>& ns) {
  std::string why;
  kernels::cuda_backend_options plain;
  plain.compute_dtype = dtype::bf16;
  plain.wgmma_swiglu = false;  // on by default (at ≤ 32 tokens): the first two columns are without it
  kernels::cuda_backend_options wgmma = plain;
  wgmma.skinny_wgmma = true;
  kernels::cuda_backend_options fused = plain;
  fused.wgmma_swiglu = true;
  fused.wgmma_swiglu_min_n = 1;
  fused.wgmma_swiglu_max_n = 128;  // every token tile, not only the default's
  auto bc = ct::try_cuda_backend(plain, why);
  auto bw = ct::try_cuda_backend(wgmma, why);
  auto bf = ct::try_cuda_backend(fused, why);
  if (!bc || !bw || !bf) {
    std::printf("time_cuda_ops: swiglu skipped: %s\n", why.c_str());
    return;
  }
  const int hidden = 2048, ffn = 8192;
  const double wbytes = 2.0 * 2 * ffn * hidden;
  const int copies = static_cast<int>(std::ceil(256e6 / wbytes));
  auto wh = fill(rng, static_cast<std::size_t>(2) * ffn * hidden, 0.02f);
  std::vector<kernels::weight> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(bc->upload_weight(wh.data(), dtype::f32, 2 * ffn, hidden, false));
  for (int n : ns) {
    ct::dev_acts x(*bc, fill(rng, static_cast<std::size_t>(n) * hidden));
    ct::dev_acts gate_up(*bc, static_cast<std::size_t>(n) * 2 * ffn);
    ct::dev_acts act(*bc, static_cast<std::size_t>(n) * ffn);
    double us[3];
    kernels::backend* bs[3] = {bc.get(), bw.get(), bf.get()};
    for (int which = 0; which < 3; ++which) {
      kernels::backend& b = *bs[which];
      us[which] = stream_us(b, std::max(20, copies * 2), 6, [&](int i) {
        b.linear_silu_mul(x.get_ptr(), n, ws[i % copies], kernels::weight{}, gate_up.get_ptr(), ffn, act.get_ptr());
      });
    }
    std::printf("[swiglu] gate_up+silu n=%-3d cuBLAS+silu %7.2f us (%4.2f TB/s)  wgmma+silu %7.2f us  fused %7.2f us "
                "(%4.2f TB/s)  fused/cuBLAS %.3f\n",
                n, us[0], wbytes / us[0] * 1e-6, us[1], us[2], wbytes / us[2] * 1e-6, us[2] / us[0]);
  }
  for (auto& w : ws) bc->release(const_cast<void*>(w.data));
}

/// Decode-batch linears (the 1B's shapes) on cuBLAS, the skinny GEMM and the wgmma one (x: cuBLAS's
/// time over the wgmma kernel's), each timed in the same
/// process: `reps` launches back to back on the backend's stream between two events, cycling over
/// enough weight copies (≥ 256 MB) that every launch reads its weights from HBM as a decode step does.
/// The skinny kernels are launched with PDL (as in a step), so consecutive launches overlap a little.
/// `only` (a shape name) with one n: that shape alone, two launches each, no weight copies (for ncu).
void time_decode_linears(std::mt19937_64& rng, const std::vector<int>& ns, const std::string& only = "") {
  std::string why;
  kernels::cuda_backend_options plain;
  plain.compute_dtype = dtype::bf16;
  kernels::cuda_backend_options skinny = plain;
  skinny.skinny_gemm = true;
  skinny.skinny_gemm_min_n = 1;
  kernels::cuda_backend_options wgmma = skinny;  // the Hopper kernel (skinny_wgmma.cu)
  wgmma.skinny_gemm = false;
  wgmma.skinny_wgmma = true;
  auto bc = ct::try_cuda_backend(plain, why);
  auto bs = ct::try_cuda_backend(skinny, why);
  auto bw = ct::try_cuda_backend(wgmma, why);
  if (!bc || !bs || !bw) return;
  const int hidden = 2048, ffn = 8192, vocab = 128256;
  for (auto [rows, cols, name] : {std::tuple{3 * hidden, hidden, "qkv"}, {hidden, hidden, "o_proj"},
                                  {2 * ffn, hidden, "gate_up"}, {hidden, ffn, "down"}, {vocab, hidden, "lm_head"},
                                  {2048, 1536, "qwen2 q 2048x1536+bias"}}) {
    if (!only.empty() && only != name) continue;
    const double wbytes = 2.0 * rows * cols;
    const int copies = only.empty() ? static_cast<int>(std::max(1.0, std::ceil(256e6 / wbytes))) : 1;
    auto wh = fill(rng, static_cast<std::size_t>(rows) * cols, 0.02f);
    std::vector<kernels::weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(bc->upload_weight(wh.data(), dtype::f32, rows, cols, false));
    std::vector<float> bias_h(rows, 0.5f);
    const bool with_bias = name[0] == 'q' && name[1] == 'w';
    kernels::weight bias = with_bias ? bc->upload_weight(bias_h.data(), dtype::f32, 1, rows, true) : kernels::weight{};
    for (int n : ns) {
      ct::dev_acts x(*bc, fill(rng, static_cast<std::size_t>(n) * cols));
      ct::dev_acts out(*bc, static_cast<std::size_t>(n) * rows);
      double us[3];
      for (int which = 0; which < 3; ++which) {
        kernels::backend& b = which == 0 ? *bc : which == 1 ? *bs : *bw;
        us[which] = stream_us(b, only.empty() ? std::max(20, copies * 2) : 1, only.empty() ? 6 : 2, [&](int i) {
          b.linear(x.get_ptr(), n, ws[i % copies], bias, out.get_ptr());
        });
      }
      std::printf(
          "[linear] %-24s n=%-3d cuBLAS %7.2f us (%4.2f TB/s)  skinny %7.2f us (%4.2f TB/s)  wgmma %7.2f us (%4.2f "
          "TB/s)  x%.2f\n",
          name, n, us[0], wbytes / us[0] * 1e-6, us[1], wbytes / us[1] * 1e-6, us[2], wbytes / us[2] * 1e-6,
          us[0] / us[2]);
    }
    for (auto& w : ws) bc->release(const_cast<void*>(w.data));
    if (with_bias) bc->release(const_cast<void*>(bias.data));
  }
}

/// Decode linears (n = 1) of the 1B's layer shapes, back to back as a step runs them: a CUDA graph
/// of `calls` linears over enough copies of the weight that they cannot stay in L2 (~256 MB), so
/// the time per call is what the weight stream costs in a step (launch gaps and PDL overlap
/// included, host launches not). One backend per GEMV configuration, the same weights.
void gemv_chain_table(int hidden, int ffn, int vocab) {
  struct config {
    const char* name;
    kernels::cuda_backend_options o;
  };
  std::vector<config> configs;
  kernels::cuda_backend_options d;
  d.compute_dtype = dtype::bf16;
  configs.push_back({"default", d});
  kernels::cuda_backend_options s3 = d;  // register loads (session 3's kernel)
  s3.gemv_tma = s3.gemv_stage_capped = false;
  configs.push_back({"s3", s3});
  for (int kb : {128, 192, 224}) {  // the default ring is 96 KB
    kernels::cuda_backend_options r = d;
    r.gemv_tma_ring_kb = kb;
    configs.push_back({kb == 128 ? "tma128" : kb == 192 ? "tma192" : "tma224", r});
  }
  kernels::cuda_backend_options cublas = d;
  cublas.small_gemm = false;
  configs.push_back({"cublas", cublas});
  std::vector<std::unique_ptr<kernels::backend>> backends;
  for (const auto& c : configs) {
    std::string why;
    backends.push_back(ct::try_cuda_backend(c.o, why));
    if (!backends.back()) {
      std::printf("time_cuda_ops: gemv chain skipped: %s\n", why.c_str());
      return;
    }
  }
  kernels::backend& b0 = *backends[0];
  struct shape {
    const char* name;
    int rows, cols;
  };
  const shape shapes[] = {{"qkv", 3072, hidden},  {"o_proj", hidden, hidden}, {"gate_up", 2 * ffn, hidden},
                          {"down", hidden, ffn},   {"lm_head", vocab, hidden}};
  const std::size_t target = 256ull << 20;
  std::mt19937_64 rng(2);
  for (const auto& sh : shapes) {
    const std::size_t bytes = static_cast<std::size_t>(sh.rows) * sh.cols * 2;
    const int copies = static_cast<int>(std::max<std::size_t>(1, (target + bytes - 1) / bytes));
    // Weight values do not change a memory-bound kernel's time: a byte pattern (0x3c3c ~ 0.0115).
    void* w = b0.alloc(bytes * copies);
    b0.fill_bytes(w, 0x3c, bytes * copies);
    ct::dev_acts x(b0, fill(rng, static_cast<std::size_t>(sh.cols)));
    ct::dev_acts out(b0, static_cast<std::size_t>(sh.rows));
    const int calls = std::max(copies, 10) * (copies < 4 ? 3 : 1);
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      kernels::backend& b = *backends[ci];
      b.begin_capture();
      for (int i = 0; i < calls; ++i) {
        const kernels::weight wi{static_cast<const std::uint8_t*>(w) + (i % copies) * bytes, dtype::bf16, sh.rows,
                                 sh.cols};
        b.linear(x.get_ptr(), 1, wi, {}, out.get_ptr());
      }
      const kernels::capture_id id = b.end_capture();
      if (id == 0) {
        std::printf("[timing] gemv chain %s %s: capture failed\n", sh.name, configs[ci].name);
        continue;
      }
      const double us = time_us(b, [&] { b.replay(id); }, 7) / calls;
      b.drop_capture(id);
      char label[80];
      std::snprintf(label, sizeof label, "chain n=1 %s %dx%d %s", sh.name, sh.rows, sh.cols, configs[ci].name);
      row(label, us, static_cast<double>(bytes), 2.0 * sh.rows * sh.cols);
    }
    b0.release(w);
  }
}

/// The decode step's attention (rope + kv_write + attention, which the backend fuses into one kernel)
/// at short contexts, back to back in a CUDA graph as a step runs it (PDL overlap included, host
/// launches not), over enough copies of the paged cache (≥ 256 MB) that every call reads its K/V from
/// HBM. One backend per decode configuration: the tc kernel (plain, early_decode, carveout 100 %) and
/// the ring (ring_decode 1, 2, 1 with carveout 100 %).
/// Bytes: the K and V rows of every context (the cache pages' tails are not read).
void decode_attention_chain_table() {
  const int heads = 32, kv_heads = 8, hd = 64, bs = 16;
  struct config {
    const char* name;
    int ring, carveout;
    bool early;
  };
  const config configs[] = {{"tc", 0, -1, false},   {"early", 0, -1, true}, {"ring1", 1, -1, false},
                            {"ring2", 2, -1, false}, {"tc-c100", 0, 100, false}, {"ring1-c100", 1, 100, false}};
  constexpr int nc = sizeof(configs) / sizeof(configs[0]);
  std::vector<std::unique_ptr<kernels::backend>> backends;
  for (const config& cf : configs) {
    kernels::cuda_backend_options o;
    o.compute_dtype = dtype::bf16;
    o.ring_decode = cf.ring;
    o.ring_decode_max_seqs = 1 << 30;  // the kernel named at every batch
    o.early_decode = cf.early;
    o.decode_carveout = cf.carveout;
    std::string why;
    backends.push_back(ct::try_cuda_backend(o, why));
    if (!backends.back()) {
      std::printf("time_cuda_ops: decode attention chain skipped: %s\n", why.c_str());
      return;
    }
  }
  kernels::backend& b0 = *backends[0];
  std::mt19937_64 rng(3);
  for (auto [seqs, ctx] : {std::pair{64, 192}, {256, 192}, {64, 128}, {64, 256}, {64, 512}, {256, 512}, {64, 2048}}) {
    const int blocks_per = (ctx + bs - 1) / bs, num_blocks = seqs * blocks_per;
    const std::size_t cache_bytes = static_cast<std::size_t>(num_blocks) * bs * kv_heads * hd * 2;
    const int copies = static_cast<int>(std::max<std::size_t>(1, ((256ull << 20) + 2 * cache_bytes - 1) / (2 * cache_bytes)));
    void* k = b0.alloc(cache_bytes * copies);
    void* v = b0.alloc(cache_bytes * copies);
    b0.fill_bytes(k, 0x3c, cache_bytes * copies);
    b0.fill_bytes(v, 0x3c, cache_bytes * copies);
    // Copy c: its own shuffled pages, its own block table and new-token slots.
    std::vector<std::int32_t> tables, slots, q_start, ctx_len(seqs, ctx), pos(seqs, ctx - 1);
    for (int c = 0; c < copies; ++c) {
      std::vector<std::int32_t> t(num_blocks);
      std::iota(t.begin(), t.end(), 0);
      std::shuffle(t.begin(), t.end(), rng);
      tables.insert(tables.end(), t.begin(), t.end());
      for (int s = 0; s < seqs; ++s) slots.push_back(t[s * blocks_per + (ctx - 1) / bs] * bs + (ctx - 1) % bs);
    }
    for (int s = 0; s <= seqs; ++s) q_start.push_back(s);
    std::vector<float> inv_freq(hd / 2);
    for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(5e5f, -2.0f * i / hd);
    ct::dev_bytes table_d(b0, tables), slot_d(b0, slots), qs_d(b0, q_start), ctx_d(b0, ctx_len), pos_d(b0, pos),
        freq_d(b0, inv_freq);
    ct::dev_acts qkv(b0, ct::random_values(rng, static_cast<std::size_t>(seqs) * (heads + 2 * kv_heads) * hd, dtype::bf16));
    ct::dev_acts out(b0, static_cast<std::size_t>(seqs) * heads * hd);
    const kernels::attn_shape sh{heads, kv_heads, hd, 0.125f, 0};
    const kernels::kv_layout layout{num_blocks, bs};
    int max_ctx = 256;  // as the executor's recordings pass it
    while (max_ctx < ctx) max_ctx *= 2;
    const int calls = std::max(copies, 8) * (copies < 4 ? 2 : 1);
    double us[nc] = {};
    for (int ring = 0; ring < nc; ++ring) {
      kernels::backend& b = *backends[ring];
      b.begin_capture();
      for (int i = 0; i < calls; ++i) {
        const int c = i % copies;
        auto* kc = static_cast<std::uint8_t*>(k) + c * cache_bytes;
        auto* vc = static_cast<std::uint8_t*>(v) + c * cache_bytes;
        const kernels::attention_batch batch{seqs, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(),
                                             table_d.as<std::int32_t>() + static_cast<std::size_t>(c) * num_blocks,
                                             blocks_per, max_ctx, 1};
        b.rope(qkv.get_ptr(), seqs, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
        b.kv_write(qkv.get_ptr(), seqs, sh, slot_d.as<std::int32_t>() + static_cast<std::size_t>(c) * seqs, layout,
                   kc, vc);
        b.attention(qkv.get_ptr(), sh, batch, layout, kc, vc, out.get_ptr());
      }
      const kernels::capture_id id = b.end_capture();
      if (id == 0) {
        std::printf("[decode-attn] seqs=%d ctx=%d %s: capture failed\n", seqs, ctx, configs[ring].name);
        continue;
      }
      us[ring] = time_us(b, [&] { b.replay(id); }, 7) / calls;
      b.drop_capture(id);
    }
    const double bytes = 4.0 * seqs * ctx * kv_heads * hd;  // K and V, bf16
    std::printf("[decode-attn] seqs=%-3d ctx=%-4d %6.1f MB", seqs, ctx, bytes * 1e-6);
    for (int i = 0; i < nc; ++i) std::printf("  %s %.2f us (%.2f TB/s)", configs[i].name, us[i], bytes / us[i] * 1e-6);
    std::printf("\n");
    b0.release(k);
    b0.release(v);
  }
}

}  // namespace


/// The fused decode kernel (kernels/cuda/fused_decode.cu) on the 1B's 16 layers at one context: its
/// time a launch, the bandwidth that implies, and where a layer's time goes (%globaltimer stamps of
/// each block's computing warps at the end of each phase, averaged over layers and blocks).
/// Weights are constant bytes: the timing does not depend on their values.

/// Launches `a` `launches` times back to back (as graph replays run it), each with its own host-mapped
/// progress words (fused_decode_args::progress), then waits up to 5 s. On a failure or a launch still
/// running, prints where every block of each unfinished launch stands: the histogram of the computing
/// warps' last stamps (layer, phase) and the range of stages the producers have issued.
bool watch_fused(kernels::cuda::fused_decode_args a, int blocks, cudaStream_t s, int launches, bool pdl,
                 bool coop) {
  static const char* points[] = {"start", "norm", "qkv", "barrier1", "attention", "barrier2", "attn load", "o_proj",
                                 "barrier3", "norm2", "gate_up", "barrier4", "act load", "down", "barrier5"};
  const int P = kernels::cuda::fused_trace_points;
  const std::size_t per = 2 * static_cast<std::size_t>(blocks);
  unsigned* host = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&host), per * launches * sizeof(unsigned), cudaHostAllocMapped) != cudaSuccess) {
    std::printf("fused watch: no mapped host memory\n");
    return false;
  }
  std::memset(host, 0, per * launches * sizeof(unsigned));
  unsigned* dev = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0);
  for (int i = 0; i < launches; ++i) {
    a.progress = dev + per * i;
    kernels::cuda::launch_fused_decode(a, blocks, s, pdl, coop);
  }
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t st = cudaErrorNotReady;
  while ((st = cudaStreamQuery(s)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (st == cudaSuccess) {
    std::printf("fused watch: %d back-to-back launches finished\n", launches);
    cudaFreeHost(host);
    return true;
  }
  std::printf("fused watch: %s after %d back-to-back launches\n",
              st == cudaErrorNotReady ? "still running 5 s" : cudaGetErrorString(st), launches);
  const unsigned done = static_cast<unsigned>((a.num_layers - 1) * P + P);
  for (int i = 0; i < launches; ++i) {
    const volatile unsigned* w = host + per * i;
    std::map<unsigned, int> hist;
    unsigned pmin = ~0u, pmax = 0;
    for (int bl = 0; bl < blocks; ++bl) {
      ++hist[static_cast<unsigned>(w[bl])];
      pmin = std::min(pmin, static_cast<unsigned>(w[blocks + bl]));
      pmax = std::max(pmax, static_cast<unsigned>(w[blocks + bl]));
    }
    if (hist.size() == 1 && hist.begin()->first == done) continue;  // this launch finished
    std::printf("  launch %d: producers issued stages %u..%u; computing warps' last stamp:\n", i, pmin, pmax);
    for (const auto& [code, n] : hist) {
      if (code == 0) {
        std::printf("    %3d blocks: no stamp (not started, or before the first layer)\n", n);
      } else {
        std::printf("    %3d blocks: layer %u, after %s\n", n, (code - 1) / P, points[(code - 1) % P]);
      }
    }
  }
  std::fflush(stdout);
  return false;
}

void time_fused_decode(kernels::backend& b, int ctx, int barrier_mode, int reps = 25, int watch = 0) {
  const int hidden = 2048, ffn = 8192, heads = 32, kv_heads = 8, hd = 64, layers = 16, block_size = 16;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int blocks = kernels::cuda::fused_decode_blocks(sms);
  if (blocks == 0 || !kernels::cuda::fused_decode_supported(hidden, ffn, heads, kv_heads, hd)) {
    std::printf("fused decode: not supported here\n");
    return;
  }
  std::vector<void*> owned;
  auto dev_alloc = [&](std::size_t bytes, int byte) {
    void* p = b.alloc(bytes);
    if (p == nullptr) {
      std::printf("fused decode: out of device memory\n");
      std::exit(1);
    }
    b.fill_bytes(p, static_cast<std::uint8_t>(byte), bytes);
    owned.push_back(p);
    return p;
  };
  using bf = __nv_bfloat16;
  const int qkv_rows = (heads + 2 * kv_heads) * hd;
  const int kv_blocks = (ctx + block_size - 1) / block_size + 1;
  kernels::cuda::fused_decode_args a;
  a.num_layers = layers;
  a.barrier_mode = barrier_mode;
  if (const char* e = std::getenv("FUSED_PREFETCH")) a.prefetch = std::atoi(e);
  if (const char* e = std::getenv("FUSED_COPY_SPLIT")) a.copy_split = std::atoi(e);
  if (const char* e = std::getenv("FUSED_STREAM_ONLY")) a.stream_only = std::atoi(e);
  if (const char* e = std::getenv("FUSED_INTERLEAVE")) a.interleave = std::atoi(e);
  if (const char* e = std::getenv("FUSED_UNIT_KEYS")) a.attn_unit_keys = std::atoi(e);
  if (const char* e = std::getenv("FUSED_L2_AHEAD")) a.l2_ahead = std::atoi(e);
  const bool pdl = std::getenv("FUSED_PDL") == nullptr || std::atoi(std::getenv("FUSED_PDL")) != 0;
  const bool coop = std::getenv("FUSED_COOP") != nullptr && std::atoi(std::getenv("FUSED_COOP")) != 0;
  for (int l = 0; l < layers; ++l) {
    auto& L = a.layer[l];
    L.input_norm = static_cast<const float*>(dev_alloc(hidden * 4, 0x3c));
    L.post_norm = static_cast<const float*>(dev_alloc(hidden * 4, 0x3c));
    L.qkv = static_cast<const bf*>(dev_alloc(std::size_t(qkv_rows) * hidden * 2, 0x3c));
    L.o = static_cast<const bf*>(dev_alloc(std::size_t(hidden) * heads * hd * 2, 0x3c));
    L.gate_up = static_cast<const bf*>(dev_alloc(std::size_t(2 * ffn) * hidden * 2, 0x3c));
    L.down = static_cast<const bf*>(dev_alloc(std::size_t(hidden) * ffn * 2, 0x3c));
    L.k_cache = static_cast<bf*>(dev_alloc(std::size_t(kv_blocks) * block_size * kv_heads * hd * 2, 0x3c));
    L.v_cache = static_cast<bf*>(dev_alloc(std::size_t(kv_blocks) * block_size * kv_heads * hd * 2, 0x3c));
  }
  a.hidden = hidden;
  a.ffn = ffn;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = hd;
  a.scale = 0.125f;
  a.eps = 1e-5f;
  a.block_size = block_size;
  std::vector<std::int32_t> table(kv_blocks);
  std::iota(table.begin(), table.end(), 0);
  auto ints = [&](const std::vector<std::int32_t>& v) {
    void* p = dev_alloc(v.size() * 4, 0);
    b.upload(p, v.data(), v.size() * 4);
    return static_cast<const std::int32_t*>(p);
  };
  a.positions = ints({ctx - 1});
  a.slots = ints({ctx - 1});
  a.ctx_len = ints({ctx});
  a.block_table = ints(table);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(500000.0f, -2.0f * i / hd);
  void* inv_d = dev_alloc(inv.size() * 4, 0);
  b.upload(inv_d, inv.data(), inv.size() * 4);
  a.inv_freq = static_cast<const float*>(inv_d);
  a.residual = static_cast<bf*>(dev_alloc(hidden * 2, 0x3c));
  a.delta = static_cast<bf*>(dev_alloc(hidden * 2, 0));
  a.qkv_out = static_cast<bf*>(dev_alloc(qkv_rows * 2, 0));
  a.o_out = static_cast<bf*>(dev_alloc(hidden * 2, 0));
  a.act = static_cast<bf*>(dev_alloc(ffn * 2, 0));
  a.attn_out = static_cast<bf*>(dev_alloc(heads * hd * 2, 0));
  a.partials = static_cast<float*>(dev_alloc(kernels::cuda::fused_decode_partial_floats(heads, kv_heads, hd, blocks) * 4, 0));
  a.sync = static_cast<unsigned*>(dev_alloc(256, 0));
  a.head_sync = a.sync + 32;
  b.synchronize();
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (watch > 0) {
    // A hung launch cannot be cancelled: report and leave without cleaning up.
    if (!watch_fused(a, blocks, s, watch, pdl, coop)) std::_Exit(3);
    cudaStreamDestroy(s);
    for (void* p : owned) b.release(p);
    return;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(e0, s);
    kernels::cuda::launch_fused_decode(a, blocks, s, pdl, coop);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float t = 0.0f;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 5 || reps <= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double us = ms[ms.size() / 2] * 1e3;
  const double bytes = double(layers) * 2.0 * (double(qkv_rows) * hidden + double(hidden) * heads * hd +
                                               2.0 * ffn * hidden + double(hidden) * ffn);
  std::printf("fused decode, 16 layers of the 1B, ctx %d, %d blocks, barrier mode %d, copy split %d, interleave %d, unit keys %d%s: %.1f us a launch (%.1f a layer), %.2f TB/s of weights\n",
              ctx, blocks, barrier_mode, a.copy_split, a.interleave, a.attn_unit_keys, a.stream_only ? ", stream only" : "", us, us / layers, bytes / (us * 1e-6) / 1e12);
  if (!a.stream_only) {  // the stream-only run stamps nothing
    const std::size_t n = std::size_t(blocks) * layers * kernels::cuda::fused_trace_points;
    void* tr = dev_alloc(n * 8, 0);
    a.trace = static_cast<unsigned long long*>(tr);
    kernels::cuda::launch_fused_decode(a, blocks, s, pdl, coop);
    cudaStreamSynchronize(s);
    std::vector<unsigned long long> t(n);
    b.download(t.data(), tr, n * 8);
    static const char* names[] = {"norm", "qkv", "barrier1", "attention", "barrier2", "attn load", "o_proj", "barrier3",
                                  "norm2", "gate_up", "barrier4", "act load", "down", "barrier5"};
    const int P = kernels::cuda::fused_trace_points;
    std::printf("  phase       mean us (all blocks)  block 0   max over blocks\n");
    for (int k = 1; k < P; ++k) {
      double sum = 0.0, b0 = 0.0, mx = 0.0;
      for (int l = 0; l < layers; ++l) {
        double lmax = 0.0;
        for (int blk = 0; blk < blocks; ++blk) {
          const unsigned long long* r = t.data() + (std::size_t(blk) * layers + l) * P;
          const double d = double(r[k] - r[k - 1]) * 1e-3;
          sum += d;
          lmax = std::max(lmax, d);
          if (blk == 0) b0 += d;
        }
        mx += lmax;
      }
      std::printf("  %-12s %8.2f %18.2f %12.2f\n", names[k - 1], sum / (double(blocks) * layers), b0 / layers, mx / layers);
    }
    unsigned long long first = ~0ull, last = 0;
    for (int blk = 0; blk < blocks; ++blk) {
      first = std::min(first, t[std::size_t(blk) * layers * P]);
      last = std::max(last, t[(std::size_t(blk) * layers + layers - 1) * P + P - 1]);
    }
    std::printf("  traced launch: %.1f us from the first block's start to the last block's end\n", double(last - first) * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  for (void* p : owned) b.release(p);
}

int main(int argc, char** argv) {
  // `time_cuda_ops attention`: the attention rows only.
  const bool attention_only = argc > 1 && std::string(argv[1]) == "attention";
  // --linears [SHAPE N]: instead of the table, the decode-batch linear comparison (cuBLAS vs the
  // skinny GEMM at n = 32, 64, 128); with a shape name and n, that one case, two launches each (ncu).
  const bool linears_only = argc > 1 && std::string(argv[1]) == "--linears";
  const std::string only = linears_only && argc > 3 ? argv[2] : "";
  const int only_n = linears_only && argc > 3 ? std::atoi(argv[3]) : 0;
  std::string why;
  auto bp = ct::try_cuda_backend(dtype::bf16, why);
  if (!bp) {
    std::printf("time_cuda_ops: skipped: %s\n", why.c_str());
    return 0;
  }
  kernels::backend& b = *bp;
  std::mt19937_64 rng(1);
  if (!only.empty()) {
    time_decode_linears(rng, {only_n}, only);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "gemv-stamps") {  // the batch-1 GEMV chain, block by block
    // Variants (gemv_stamps.hpp); the default: the engine's 96 KB rings.
    for (ct::gemv_stamps_options o : ct::parse_gemv_stamps_variants(argc > 2 ? argv[2] : "default:96:96")) {
      if (const char* l = std::getenv("STAMPS_LAYERS")) o.layers_shown = std::atoi(l);
      ct::gemv_stamps_table(o);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--swiglu") {  // gate_up + SwiGLU: cuBLAS, wgmma, fused
    time_swiglu(rng, {2, 8, 16, 32, 64, 96, 128});
    return 0;
  }
  if (linears_only) {  // opt-in: the skinny GEMM is off by default, and this adds ~10 s
    time_decode_linears(rng, {32, 64, 128});
    return 0;
  }
  if (argc > 3 && std::string(argv[1]) == "fused-watch") {  // argv[3] back-to-back launches at ctx argv[2]
    time_fused_decode(b, std::atoi(argv[2]), kernels::cuda::fused_decode_args{}.barrier_mode, 0, std::atoi(argv[3]));
    return 0;
  }
  if (argc > 2 && std::string(argv[1]) == "fused-once") {  // one launch at ctx argv[2] (compute-sanitizer)
    time_fused_decode(b, std::atoi(argv[2]), kernels::cuda::fused_decode_args{}.barrier_mode, 1);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "fused-one") {  // one configuration (FUSED_* variables) at ctx 200
    const char* mode = std::getenv("FUSED_BARRIER");
    time_fused_decode(b, 200, mode != nullptr ? std::atoi(mode) : kernels::cuda::fused_decode_args{}.barrier_mode);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "fused") {  // the fused decode kernel only
    for (int mode : {0, 1, 2}) time_fused_decode(b, 200, mode);
    time_fused_decode(b, 1000, kernels::cuda::fused_decode_args{}.barrier_mode);
    return 0;
  }
  const int hidden = 2048, ffn = 8192, heads = 32, kv_heads = 8, hd = 64, vocab = 128256;
  const double e = 2.0;  // bytes per bf16 element
  if (!attention_only) gemv_chain_table(hidden, ffn, vocab);  // `attention`: not these
  if (std::getenv("TIME_GEMV_ONLY") != nullptr) return 0;

  // GEMMs: decode (n = 1, 64) and prefill (n = 2048) through the 1B's largest layer shapes.
  std::vector<std::tuple<int, int, int, const char*>> gemms{{1, 2 * ffn, hidden, "gate_up"},
                                                           {64, 2 * ffn, hidden, "gate_up"},
                                                           {2048, 2 * ffn, hidden, "gate_up"},
                                                           {1, vocab, hidden, "lm_head"},
                                                           {64, vocab, hidden, "lm_head"}};
  if (attention_only) {
    gemms.clear();
    decode_attention_chain_table();
  }
  for (auto [n, rows, cols, name] : gemms) {
    auto wh = fill(rng, static_cast<std::size_t>(rows) * cols, 0.02f);
    kernels::weight w = b.upload_weight(wh.data(), dtype::f32, rows, cols, false);
    ct::dev_acts x(b, fill(rng, static_cast<std::size_t>(n) * cols));
    ct::dev_acts out(b, static_cast<std::size_t>(n) * rows);
    const double us = time_us(b, [&] { b.linear(x.get_ptr(), n, w, {}, out.get_ptr()); });
    char label[64];
    std::snprintf(label, sizeof label, "linear %s n=%d (%dx%d)", name, n, rows, cols);
    row(label, us, e * (static_cast<double>(rows) * cols + static_cast<double>(n) * (rows + cols)),
        2.0 * n * rows * cols);
    b.release(const_cast<void*>(w.data));
  }

  // Attention on the paged cache: decode of 64 sequences × 2048 keys, and one 2048-token prefill
  // (also through a backend with gqa_prefill off, on the same device buffers).
  kernels::cuda_backend_options per_head_o;
  per_head_o.compute_dtype = dtype::bf16;
  per_head_o.gqa_prefill = false;
  auto per_head = ct::try_cuda_backend(per_head_o, why);
  for (auto [seqs, q_len, ctx] :
       {std::tuple{1, 1, 2048}, {64, 1, 192}, {256, 1, 192}, {64, 1, 2048}, {64, 1, 8192}, {1, 2048, 2048}}) {
    const int bs = 16, blocks_per = (ctx + bs - 1) / bs, num_blocks = seqs * blocks_per;
    const std::size_t cache = static_cast<std::size_t>(num_blocks) * bs * kv_heads * hd;
    ct::dev_acts k(b, cache), v(b, cache);
    k.set(fill(rng, cache));
    v.set(fill(rng, cache));
    const int total_q = seqs * q_len;
    ct::dev_acts qkv(b, ct::random_values(rng, static_cast<std::size_t>(total_q) * (heads + 2 * kv_heads) * hd,
                                                    dtype::bf16));
    ct::dev_acts out(b, static_cast<std::size_t>(total_q) * heads * hd);
    std::vector<std::int32_t> table(num_blocks), q_start, ctx_len(seqs, ctx);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int s = 0; s <= seqs; ++s) q_start.push_back(s * q_len);
    ct::dev_bytes table_d(b, table), qs_d(b, q_start), ctx_d(b, ctx_len);
    kernels::attn_shape sh{heads, kv_heads, hd, 0.125f, 0};
    kernels::attention_batch batch{seqs, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(), table_d.as<std::int32_t>(),
                                   blocks_per, ctx, q_len};
    const double causal = q_len > 1 ? 0.5 : 1.0;
    const double flops = 4.0 * seqs * q_len * static_cast<double>(ctx) * causal * heads * hd;
    char label[64];
    if (q_len > 1 && per_head) {  // the prefill kernel before gqa_prefill, same inputs, same process
      const double us1 = time_us(*per_head, [&] {
        per_head->attention(qkv.get_ptr(), sh, batch, {num_blocks, bs}, k.get_ptr(), v.get_ptr(), out.get_ptr());
      });
      std::snprintf(label, sizeof label, "attention seqs=%d q=%d ctx=%d per-head", seqs, q_len, ctx);
      row(label, us1, e * 2.0 * cache, flops);
    }
    const double us = time_us(b, [&] {
      b.attention(qkv.get_ptr(), sh, batch, {num_blocks, bs}, k.get_ptr(), v.get_ptr(), out.get_ptr());
    });
    std::snprintf(label, sizeof label, "attention seqs=%d q=%d ctx=%d", seqs, q_len, ctx);
    row(label, us, e * 2.0 * cache, flops);
  }

  if (attention_only) return 0;
  // Memory-bound ops at prefill size.
  {
    const int n = 2048;
    ct::dev_acts x(b, fill(rng, static_cast<std::size_t>(n) * hidden));
    ct::dev_acts res(b, fill(rng, static_cast<std::size_t>(n) * hidden));
    ct::dev_acts out(b, static_cast<std::size_t>(n) * hidden);
    std::vector<float> wv(hidden, 1.0f);
    kernels::weight w = b.upload_weight(wv.data(), dtype::f32, 1, hidden, true);
    double us = time_us(b, [&] { b.add_rmsnorm(res.get_ptr(), x.get_ptr(), n, hidden, w, 1e-5f, out.get_ptr()); });
    row("add_rmsnorm 2048x2048", us, e * 4.0 * n * hidden, 0);
    ct::dev_acts gu(b, fill(rng, static_cast<std::size_t>(n) * 2 * ffn));
    ct::dev_acts act(b, static_cast<std::size_t>(n) * ffn);
    us = time_us(b, [&] { b.silu_mul(gu.get_ptr(), n, ffn, act.get_ptr()); });
    row("silu_mul 2048x8192", us, e * 3.0 * n * ffn, 0);
  }

  // Sampling 64 rows of the 1B's vocabulary: greedy, and top-p (the sort path).
  {
    const int n = 64;
    ct::dev_acts logits(b, fill(rng, static_cast<std::size_t>(n) * vocab, 3.0f));
    std::vector<kernels::sample_params> greedy(n), top_p(n);
    for (int i = 0; i < n; ++i) top_p[i] = {0.8f, 0, 0.9f, 7, static_cast<std::uint64_t>(i)};
    std::vector<std::int32_t> tokens(n);
    double us = time_us(b, [&] { b.sample(logits.get_ptr(), n, vocab, greedy.data(), tokens.data()); });
    row("sample greedy 64x128256", us, e * n * vocab, 0);
    us = time_us(b, [&] { b.sample(logits.get_ptr(), n, vocab, top_p.data(), tokens.data()); }, 5);
    row("sample top-p 0.9 64x128256", us, e * n * vocab, 0);
  }
  return 0;
}
