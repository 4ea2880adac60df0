// `time_cuda_ops gemv-stamps`: where a batch-1 layer's GEMVs spend their time, block by block.
// The four GEMVs of a layer (qkv with the norm prologue, o_proj, gate_up with the norm prologue,
// down with the silu prologue) of 16 layers of the 1B's shapes run as a decode step chains them: one
// CUDA graph, every launch a programmatic dependent of the one before, each layer's own weights (2 GB
// in all, so every weight comes from HBM). Attention is left out (o_proj reads a fixed input), so the
// chain is the step's GEMV boundaries and nothing else. Every block stamps %globaltimer at its entry,
// past griddepcontrol.wait, after its prologue, at each stage its warp 0 finds full, at each stage
// its producer issues, and at its exit (gemv.cu, gemv_args::stamps); the table says, per launch of a
// middle layer, when those happened relative to the previous launch's last exit, and how many bytes
// of weights had landed by each microsecond after it. Diagnostics for bench/NOTES.md, not a test.
#include "gemv_stamps.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../kernels/cuda/check.hpp"
#include "../../kernels/cuda/launch.hpp"

namespace conveyor::testing {

namespace {

namespace kc = conveyor::kernels::cuda;
using bf16 = __nv_bfloat16;

template <class T>
T* dev_alloc(std::size_t count) {
  void* p = nullptr;
  CONVEYOR_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  return static_cast<T*>(p);
}

/// Random bf16 values in [-scale, scale) (a fixed LCG: the weights' values do not change the time,
/// but zeros could, METHOD.md) uploaded to `count` elements.
void fill_random(bf16* d, std::size_t count, float scale, unsigned seed) {
  std::vector<bf16> h(std::min<std::size_t>(count, 1u << 22));
  unsigned s = seed;
  for (auto& v : h) {
    s = s * 1664525u + 1013904223u;
    v = __float2bfloat16((static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale);
  }
  for (std::size_t off = 0; off < count; off += h.size()) {
    const std::size_t c = std::min(h.size(), count - off);
    CONVEYOR_CUDA_CHECK(cudaMemcpy(d + off, h.data(), c * sizeof(bf16), cudaMemcpyHostToDevice));
  }
}

struct launch_rec {
  const char* name;
  int rows, cols, grid;
  unsigned long long* stamps;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// `text` cut at every `sep` (empty pieces kept: a variant's fields are positional).
std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  for (std::size_t p0 = 0;;) {
    const std::size_t p1 = text.find(sep, p0);
    out.push_back(text.substr(p0, p1 == std::string::npos ? std::string::npos : p1 - p0));
    if (p1 == std::string::npos) return out;
    p0 = p1 + 1;
  }
}

}  // namespace

std::vector<gemv_stamps_options> parse_gemv_stamps_variants(const std::string& spec) {
  std::vector<gemv_stamps_options> out;
  for (const std::string& v : split(spec, ',')) {
    if (v.empty()) continue;
    const std::vector<std::string> f = split(v, ':');
    gemv_stamps_options o;
    o.label = f[0];
    if (f.size() > 1) o.ring_kb = std::atoi(f[1].c_str());
    if (f.size() > 2) o.down_ring_kb = std::atoi(f[2].c_str());
    if (f.size() > 3) o.pre_wait_stages = std::atoi(f[3].c_str());
    if (f.size() > 4) o.pre_mask = f[4];
    if (f.size() > 5) o.late_mask = f[5];
    if (f.size() > 6) o.norm_early = std::atoi(f[6].c_str());
    out.push_back(o);
  }
  return out;
}

void gemv_stamps_table(const gemv_stamps_options& opt) {
  constexpr int layers = 16, hidden = 2048, ffn = 8192, qkv_rows = 3072;
  cudaDeviceProp prop{};
  CONVEYOR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  kc::gemv_init();
  struct layer_w {
    bf16 *qkv, *o, *gu, *down;
  };
  std::vector<layer_w> w(layers);
  for (int l = 0; l < layers; ++l) {
    w[l].qkv = dev_alloc<bf16>(static_cast<std::size_t>(qkv_rows) * hidden);
    w[l].o = dev_alloc<bf16>(static_cast<std::size_t>(hidden) * hidden);
    w[l].gu = dev_alloc<bf16>(static_cast<std::size_t>(2 * ffn) * hidden);
    w[l].down = dev_alloc<bf16>(static_cast<std::size_t>(hidden) * ffn);
    fill_random(w[l].qkv, static_cast<std::size_t>(qkv_rows) * hidden, 0.03f, 1 + 4 * l);
    fill_random(w[l].o, static_cast<std::size_t>(hidden) * hidden, 0.03f, 2 + 4 * l);
    fill_random(w[l].gu, static_cast<std::size_t>(2 * ffn) * hidden, 0.03f, 3 + 4 * l);
    fill_random(w[l].down, static_cast<std::size_t>(hidden) * ffn, 0.02f, 4 + 4 * l);
  }
  bf16* residual = dev_alloc<bf16>(hidden);
  bf16* normed = dev_alloc<bf16>(hidden);
  bf16* qkv_out = dev_alloc<bf16>(qkv_rows);
  bf16* attn_out = dev_alloc<bf16>(hidden);
  bf16* o_out = dev_alloc<bf16>(hidden);
  bf16* gu_out = dev_alloc<bf16>(2 * ffn);
  bf16* act = dev_alloc<bf16>(ffn);
  bf16* down_out = dev_alloc<bf16>(hidden);
  fill_random(residual, hidden, 1.0f, 91);
  fill_random(attn_out, hidden, 1.0f, 92);
  fill_random(down_out, hidden, 0.1f, 93);
  float* norm_w = dev_alloc<float>(hidden);
  {
    std::vector<float> ones(hidden, 1.0f);
    CONVEYOR_CUDA_CHECK(cudaMemcpy(norm_w, ones.data(), hidden * sizeof(float), cudaMemcpyHostToDevice));
  }
  unsigned* counter = dev_alloc<unsigned>(1);
  CONVEYOR_CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
  const int max_grid = 4 * sms;
  const std::size_t per_launch = static_cast<std::size_t>(max_grid) * kc::gemv_stamp_slots;
  unsigned long long* stamps = dev_alloc<unsigned long long>(per_launch * 4 * layers);

  cudaStream_t s;
  CONVEYOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<launch_rec> recs;
  auto base_args = [&](const bf16* wp, int rows, int cols, int ring_kb) {
    kc::gemv_args a;
    a.w = wp;
    a.rows = rows;
    a.cols = cols;
    a.n = 1;
    a.cap_grid = 1;
    a.stage_capped = 1;
    a.tma = 1;
    a.tma_ring_bytes = ring_kb * 1024;
    a.stamps = stamps + recs.size() * per_launch;
    return a;
  };
  auto launch = [&](const char* name, kc::gemv_args a, kc::gemv_prologue pro) {
    const char key = name[0] == 'q' ? 'q' : name[0] == 'o' ? 'o' : name[0] == 'g' ? 'g' : 'd';
    if (opt.pre_mask.find(key) != std::string::npos) a.pre_wait_stages = opt.pre_wait_stages;
    if (opt.late_mask.find(key) != std::string::npos) a.late_trigger = 1;
    a.norm_early = opt.norm_early;
    kc::launch_gemv(a, pro, true, sms, s);
    CONVEYOR_CUDA_CHECK(cudaGetLastError());
    // The grid launch_gemv chose: the blocks that stamped their entry (read back after the replay).
    recs.push_back({name, a.rows, a.cols, 0, a.stamps});
  };
  // A GEMV of x = rmsnorm(residual += delta) (qkv, gate_up), as the step chains them.
  auto norm_args = [&](const bf16* wp, int rows, const bf16* delta, bf16* out) {
    kc::gemv_args a = base_args(wp, rows, hidden, opt.ring_kb);
    a.residual = residual;
    a.delta = delta;
    a.norm_w = norm_w;
    a.eps = 1e-5f;
    a.x_out = normed;
    a.counter = counter;
    a.out = out;
    return a;
  };
  // Capture: the layer's four GEMVs, as the step issues them (nothing else in the graph: a memset
  // node between two launches would cut the programmatic edge).
  CONVEYOR_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < layers; ++l) {
    launch("qkv", norm_args(w[l].qkv, qkv_rows, down_out, qkv_out), kc::gemv_prologue::norm);
    kc::gemv_args o = base_args(w[l].o, hidden, hidden, opt.ring_kb);
    o.x = attn_out;
    o.out = o_out;
    launch("o_proj", o, kc::gemv_prologue::none);
    launch("gate_up", norm_args(w[l].gu, 2 * ffn, o_out, gu_out), kc::gemv_prologue::norm);
    kc::gemv_args d = base_args(w[l].down, hidden, ffn, opt.down_ring_kb > 0 ? opt.down_ring_kb : opt.ring_kb);
    d.x = gu_out;
    d.x_out = act;
    d.out = down_out;
    launch("down", d, kc::gemv_prologue::silu);
  }
  cudaGraph_t graph;
  CONVEYOR_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CONVEYOR_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CONVEYOR_CUDA_CHECK(cudaGraphLaunch(exec, s));
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&e0));
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&e1));
  CONVEYOR_CUDA_CHECK(cudaEventRecord(e0, s));
  const int reps = 10;
  for (int i = 0; i < reps; ++i) CONVEYOR_CUDA_CHECK(cudaGraphLaunch(exec, s));
  CONVEYOR_CUDA_CHECK(cudaEventRecord(e1, s));
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(s));
  float ms = 0.0f;
  CONVEYOR_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  // One more replay on cleared stamps: a block that never ran (beyond the grid) reads 0.
  CONVEYOR_CUDA_CHECK(cudaMemset(stamps, 0, per_launch * 4 * layers * sizeof(unsigned long long)));
  CONVEYOR_CUDA_CHECK(cudaGraphLaunch(exec, s));
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned long long> h(per_launch * recs.size());
  CONVEYOR_CUDA_CHECK(cudaMemcpy(h.data(), stamps, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));

  std::printf("[gemv-stamps] %s (pre-wait stages %d on '%s', late trigger on '%s', norm_early %d):\n",
              opt.label.c_str(), opt.pre_wait_stages, opt.pre_mask.c_str(), opt.late_mask.c_str(), opt.norm_early);
  std::printf("[gemv-stamps] %s: ring %d KB, down ring %d KB: graph of %d layers %.1f us (%.2f us a layer)\n",
              opt.label.c_str(), opt.ring_kb, opt.down_ring_kb > 0 ? opt.down_ring_kb : opt.ring_kb, layers,
              ms * 1e3 / reps, ms * 1e3 / reps / layers);
  // Per launch: the grid (blocks that stamped), and its stage size from the first block's stamps.
  auto at = [&](std::size_t li, int blk, int slot) { return h[li * per_launch + blk * kc::gemv_stamp_slots + slot]; };
  std::vector<unsigned long long> last_exit(recs.size(), 0), first_entry(recs.size(), ~0ull);
  for (std::size_t li = 0; li < recs.size(); ++li) {
    int grid = 0;
    while (grid < max_grid && at(li, grid, 0) != 0) ++grid;
    recs[li].grid = grid;
    for (int b = 0; b < grid; ++b) {
      last_exit[li] = std::max(last_exit[li], at(li, b, 4));
      first_entry[li] = std::min(first_entry[li], at(li, b, 0));
    }
  }
  const int from = 4 * opt.first_layer, to = 4 * (opt.first_layer + opt.layers_shown);
  std::printf("[gemv-stamps] times in us after the previous launch's last block exit (T0); blocks: "
              "entry / past the wait / prologue done / first stage seen / exit as min med max\n");
  for (int li = from; li < to && li < static_cast<int>(recs.size()); ++li) {
    const launch_rec& r = recs[li];
    const double t0 = static_cast<double>(last_exit[li - 1 >= 0 ? li - 1 : 0]);
    auto rel = [&](unsigned long long t) { return (static_cast<double>(t) - t0) * 1e-3; };
    std::vector<double> entry, wait, pro, first, exit_t;
    int early = 0, stages = 0;
    for (int b = 0; b < r.grid; ++b) {
      entry.push_back(rel(at(li, b, 0)));
      if (at(li, b, 0) < static_cast<unsigned long long>(t0)) ++early;
      wait.push_back(rel(at(li, b, 2)));
      pro.push_back(rel(at(li, b, 3)));
      first.push_back(rel(at(li, b, 8)));
      exit_t.push_back(rel(at(li, b, 4)));
      int u = 0;
      while (u < 56 && at(li, b, 8 + u) != 0) ++u;
      stages += u;
    }
    auto mmm = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      char buf[64];
      std::snprintf(buf, sizeof buf, "%6.2f %6.2f %6.2f", v.front(), v[v.size() / 2], v.back());
      return std::string(buf);
    };
    const double wbytes = 2.0 * r.rows * r.cols;
    std::printf("  L%d %-7s %5dx%-5d grid %3d (%3d entered before T0), %4.1f stages a block of %5.1f KB\n",
                li / 4, r.name, r.rows, r.cols, r.grid, early, static_cast<double>(stages) / r.grid,
                wbytes / std::max(1, stages) / 1024.0);
    std::printf("      entry %s | wait %s | prologue %s | first stage %s | exit %s\n", mmm(entry).c_str(),
                mmm(wait).c_str(), mmm(pro).c_str(), mmm(first).c_str(), mmm(exit_t).c_str());
    // Weight bytes whose stage warp 0 had found full by each microsecond after T0 (stages seen
    // full = landed; a stage seen late because the warps were busy counts late).
    const double stage_kb = wbytes / std::max(1, stages);
    const double span = median(exit_t) + 2.0;
    std::string curve;
    for (int us = static_cast<int>(std::floor(std::min(0.0, median(entry)))); us <= span && us < 40; ++us) {
      int landed = 0;
      for (int b = 0; b < r.grid; ++b) {
        for (int u = 0; u < 56 && at(li, b, 8 + u) != 0; ++u) {
          if (rel(at(li, b, 8 + u)) <= us) ++landed;
        }
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, " %d:%.0f%%", us, 100.0 * landed * stage_kb / wbytes);
      curve += buf;
    }
    std::printf("      landed by us:%s\n", curve.c_str());
    // Issue-to-seen latency of stages, and the producer's issue cadence, for this launch.
    std::vector<double> lat, gap;
    for (int b = 0; b < r.grid; ++b) {
      for (int u = 0; u < 56 && at(li, b, 8 + u) != 0 && at(li, b, 64 + u) != 0; ++u) {
        lat.push_back((static_cast<double>(at(li, b, 8 + u)) - static_cast<double>(at(li, b, 64 + u))) * 1e-3);
        if (u > 0 && at(li, b, 64 + u - 1) != 0) {
          gap.push_back((static_cast<double>(at(li, b, 64 + u)) - static_cast<double>(at(li, b, 64 + u - 1))) * 1e-3);
        }
      }
    }
    if (!lat.empty()) {
      std::printf("      stage issued -> seen full: %s us; issue after the previous issue: %s us\n", mmm(lat).c_str(),
                  gap.empty() ? "-" : mmm(gap).c_str());
    }
  }
  CONVEYOR_CUDA_CHECK(cudaGraphExecDestroy(exec));
  CONVEYOR_CUDA_CHECK(cudaGraphDestroy(graph));
  for (auto& lw : w) {
    cudaFree(lw.qkv);
    cudaFree(lw.o);
    cudaFree(lw.gu);
    cudaFree(lw.down);
  }
  for (void* p : {static_cast<void*>(residual), static_cast<void*>(normed), static_cast<void*>(qkv_out),
                  static_cast<void*>(attn_out), static_cast<void*>(o_out), static_cast<void*>(gu_out),
                  static_cast<void*>(act), static_cast<void*>(down_out), static_cast<void*>(norm_w),
                  static_cast<void*>(counter), static_cast<void*>(stamps)}) {
    cudaFree(p);
  }
  CONVEYOR_CUDA_CHECK(cudaEventDestroy(e0));
  CONVEYOR_CUDA_CHECK(cudaEventDestroy(e1));
  CONVEYOR_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace conveyor::testing
