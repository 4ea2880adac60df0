// conveyor_bench: the engine on one GPU against its two ceilings, measured in the same run.
//   - copy bandwidth (device-to-device cudaMemcpy, bytes read + written) -> decode steps/s ceiling
//   - bf16 GEMM rate (cuBLAS, large square, random data) -> prefill ceiling
//   - decode throughput at several batch sizes (prompt P, N new tokens, greedy), time to first
//     token, prefill throughput, device memory used
// for one or more backend variants (each speed path on or off), as JSON lines that
// bench/report.py joins with the HF peers' numbers (bench/hf_peer_bench.py) into one table.
//
//   conveyor_bench --model DIR [--batches 1,8,64,256] [--prompt 128] [--new 128]
//                  [--prefill 512,2048] [--variants all,base,...] [--ablate 1,8] [--ceilings 0|1]
//                  [--json FILE] [--profile decode1|decode64|prefill2048] [--profile-variant NAME]
//                  [--timeline 1,64] [--timeline-variants all,...]
// --profile runs one step of that kind inside cudaProfilerStart/Stop (for ncu --profile-from-start off).
// --timeline records decode steps at those batch sizes with CUPTI (kernel_timeline.hpp): each kernel's
// start, length and share of the step's critical path inside the step's graph, as the GPU ran them.
// Variants "all" (every speed path, the default) and "base" (none) get the whole sweep; the
// ablations (one path off or on) only the --ablate batch sizes (0: none), a prefill ablation
// (variant::prefill, e.g. nogqapf) the prefill sizes too.
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cuda_backend.hpp"
#include "../kernels/cuda/skinny_wgmma.hpp"
#include "graph_timer.hpp"
#include "flag_values.hpp"
#include "kernel_timeline.hpp"

namespace {

using namespace conveyor;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "conveyor_bench: %s\n", why.c_str());
  std::exit(1);
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) die(std::string(what) + ": " + cublasGetStatusString(s));
}
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
std::vector<std::string> parse_words(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct json_line {
  std::ostringstream s;
  bool first = true;
  json_line() { s << "{"; }
  template <class T>
  json_line& add(const std::string& k, const T& v) {
    s << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
    return *this;
  }
  json_line& str(const std::string& k, const std::string& v) {
    s << (first ? "" : ", ") << "\"" << k << "\": \"" << v << "\"";
    first = false;
    return *this;
  }
  std::string done() { return s.str() + "}"; }
};

std::ofstream json_out;
void emit(const std::string& line) {
  std::printf("[bench] %s\n", line.c_str());
  std::fflush(stdout);
  if (json_out.is_open()) {
    json_out << line << "\n";
    json_out.flush();
  }
}

// --- ceilings ---

/// Device-to-device copy of a 2 GiB buffer: bytes read + written per second (median of 10).
double copy_bandwidth() {
  const std::size_t bytes = 2ull << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    cudaEventRecord(e1);
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) / median(t);
}

/// cuBLAS bf16 GEMM (f32 accumulate) at m = n = k = `size` on random data: FLOP/s (median of 10).
double gemm_rate(int size) {
  const std::size_t count = static_cast<std::size_t>(size) * size;
  std::vector<std::uint16_t> host(count);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<std::uint16_t> block(1 << 20);
  for (auto& x : block) x = kernels::f32_to_bf16(d(rng));
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, count * 2), "cudaMalloc");
  check(cudaMalloc(&b, count * 2), "cudaMalloc");
  check(cudaMalloc(&c, count * 2), "cudaMalloc");
  for (std::size_t i = 0; i < count; ++i) host[i] = block[(i * 2654435761u) % block.size()];
  check(cudaMemcpy(a, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
  for (std::size_t i = 0; i < count; ++i) host[i] = block[(i * 40503u + 17) % block.size()];
  check(cudaMemcpy(b, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
  cublasHandle_t h;
  check(cublasCreate(&h), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, size, size, size, &one, a, CUDA_R_16BF, size, b, CUDA_R_16BF, size,
                       &zero, c, CUDA_R_16BF, size, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    cudaEventRecord(e1);
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * size * static_cast<double>(size) * size / median(t);
}

// --- the engine ---

struct variant {
  std::string name;
  kernels::cuda_backend_options options;
  engine::weight_quant_options quant;  ///< int8 / fp8 weights (issue 12); default bf16
  bool prefill = false;                 ///< an ablation that also runs the prefill sizes
  /// decode steps queued one ahead (step n+1 chained on the device to step n's draw, queued before
  /// the host waits for step n); false: each step waits for its tokens before the next is planned
  bool queue_steps = true;
};

std::vector<variant> all_variants() {
  std::vector<variant> v;
  kernels::cuda_backend_options o;  // the defaults
  v.push_back({"all", o});
  kernels::cuda_backend_options base = o;
  base.graphs = base.small_gemm = base.fuse = base.pdl = base.gqa_decode = base.tc_prefill = base.gemm_tune = false;
  v.push_back({"base", base});
  kernels::cuda_backend_options graphs = base;
  graphs.graphs = true;
  v.push_back({"graphs", graphs});
  kernels::cuda_backend_options g2 = graphs;
  g2.small_gemm = true;
  g2.small_gemm_max_n = 16;
  g2.gqa_decode = true;
  v.push_back({"graphs+gemv", g2});
  kernels::cuda_backend_options gemv = o;  // the small-batch GEMV with its norm / silu fusions, n ≤ 16
  gemv.small_gemm = true;
  gemv.small_gemm_max_n = 16;
  v.push_back({"gemv", gemv});
  kernels::cuda_backend_options gemv_nofuse = gemv;
  gemv_nofuse.fuse = false;
  v.push_back({"gemv-nofuse", gemv_nofuse});
  kernels::cuda_backend_options nofusenorm = gemv;
  nofusenorm.fuse_norm = false;
  v.push_back({"gemv-nofusenorm", nofusenorm});
  kernels::cuda_backend_options nocap = gemv;
  nocap.gemv_cap_grid = false;
  v.push_back({"gemv-nocap", nocap});
  kernels::cuda_backend_options nopdl = gemv;
  nopdl.pdl = false;
  v.push_back({"gemv-nopdl", nopdl});
  // The defaults of the previous session: no programmatic launches outside the (opt-in) GEMV, the
  // scalar-V grouped decode kernel.
  kernels::cuda_backend_options prev = o;
  prev.pdl = prev.vec_decode = prev.small_gemm = false;
  v.push_back({"prev", prev});
  kernels::cuda_backend_options all_nopdl = o;
  all_nopdl.pdl = false;
  v.push_back({"nopdl", all_nopdl});
  kernels::cuda_backend_options tune = o;  // decode linears on the cuBLASLt algorithm timed fastest
  tune.gemm_tune = true;
  v.push_back({"tune", tune});
  kernels::cuda_backend_options nofuseattn = o;  // rope_kv as its own kernel again
  nofuseattn.fuse_attention = false;
  v.push_back({"nofuseattn", nofuseattn});
  kernels::cuda_backend_options norope1 = o;  // fused prologue: one sincos per (head, pair) again (session 3)
  norope1.rope_once = false;
  v.push_back({"norope1", norope1});
  kernels::cuda_backend_options wide = o;  // 16-warp vec decode blocks where the grid is under one wave
  wide.wide_decode = true;
  v.push_back({"wide", wide});
  kernels::cuda_backend_options notcdec = o;  // the vec decode kernel at batch 64 too
  notcdec.tc_decode = false;
  v.push_back({"notcdec", notcdec});
  for (int ring : {0, 1, 2}) {  // decode attention: the tc kernel (0), K/V staged in a ring of 1 or 2 chunks a warp
    kernels::cuda_backend_options r = o;
    r.ring_decode = ring;
    r.ring_decode_max_seqs = 1 << 30;  // at every batch (the default: batch 1 only)
    v.push_back({"ring" + std::to_string(ring), r});
    r.decode_carveout = 100;  // ... with the most shared memory an SM can have
    v.push_back({"ring" + std::to_string(ring) + "c", r});
    r.decode_carveout = o.decode_carveout;
    r.ring_decode_max_seqs = 1;  // ... at batch 1 only, as the default's ring
    v.push_back({"ring" + std::to_string(ring) + "-b1", r});
  }
  kernels::cuda_backend_options skinny_ring = o;  // ring1 after a qkv GEMM that triggers its dependents early
  skinny_ring.skinny_gemm = true;
  skinny_ring.ring_decode = 1;
  skinny_ring.ring_decode_max_seqs = 1 << 30;
  v.push_back({"skinny-ring1", skinny_ring});
  kernels::cuda_backend_options early = o;  // the tc decode, first chunk requested before the wait
  early.early_decode = true;
  v.push_back({"early", early});
  kernels::cuda_backend_options nogemv1 = o;  // cuBLAS at batch 1 too
  nogemv1.small_gemm = false;
  v.push_back({"nogemv1", nogemv1});
  kernels::cuda_backend_options s2 = o;  // session 2's defaults
  s2.fuse_attention = s2.gemm_tune = s2.wide_decode = s2.small_gemm = s2.tc_decode = false;
  v.push_back({"s2", s2});
  kernels::cuda_backend_options skinny = o;  // decode batches of 17..128 tokens on our skinny GEMM
  skinny.skinny_gemm = true;
  v.push_back({"skinny", skinny});
  kernels::cuda_backend_options noskinny = o;  // cuBLAS for every linear above the GEMV's range
  noskinny.skinny_gemm = false;
  v.push_back({"noskinny", noskinny});
  kernels::cuda_backend_options wgmma = o;  // decode batches of 17..128 tokens on the TMA + wgmma GEMM
  wgmma.skinny_wgmma = true;
  v.push_back({"wgmma", wgmma});
  kernels::cuda_backend_options nowgmmaqkv = o;  // qkv on cuBLAS at every batch, attention's tc kernel after it
  nowgmmaqkv.wgmma_qkv = false;
  v.push_back({"nowgmmaqkv", nowgmmaqkv});
  kernels::cuda_backend_options wgmmaqkv_tc = o;  // qkv on the wgmma GEMM, then the tc decode kernel
  wgmmaqkv_tc.wgmma_qkv_ring_decode = 0;
  v.push_back({"wgmmaqkv-tc", wgmmaqkv_tc});
  kernels::cuda_backend_options wgmmaqkv_wide = o;  // ... at 17-128 tokens
  wgmmaqkv_wide.wgmma_qkv_min_n = 17;
  wgmmaqkv_wide.wgmma_qkv_max_n = 128;
  v.push_back({"wgmmaqkv-wide", wgmmaqkv_wide});
  // o_proj and down as our GEMM's K slices at every batch (the default stops down at 32 tokens).
  auto split_every_batch = [](kernels::cuda_backend_options b) {
    b.wgmma_split = true;
    b.wgmma_split_max_n = 128;
    b.wgmma_split_short_k_max_n = 128;
    return b;
  };
  v.push_back({"wgmma-split", split_every_batch(o)});
  kernels::cuda_backend_options split_o32 = o;  // o_proj too only up to 32 tokens (session 22's call 2)
  split_o32.wgmma_split_short_k_max_n = 32;
  v.push_back({"split-o32", split_o32});
  kernels::cuda_backend_options no_wgmma_split = o;  // cuBLASLt's K slices at every batch (before session 22)
  no_wgmma_split.wgmma_split = false;
  v.push_back({"nowgmmasplit", no_wgmma_split});
  kernels::cuda_backend_options swiglu = o;  // gate_up + SwiGLU as cuBLAS's GEMM and silu_mul at every batch
  swiglu.wgmma_swiglu = false;
  v.push_back({"noswiglu", swiglu});
  kernels::cuda_backend_options swiglu_wide = o;  // the SwiGLU epilogue at 2-128 tokens (the default: 2-32)
  swiglu_wide.wgmma_swiglu_max_n = 128;
  v.push_back({"swiglu-wide", swiglu_wide});
  v.push_back({"split-swiglu", split_every_batch(swiglu_wide)});  // ... and o_proj / down as its K slices
  kernels::cuda_backend_options wgmma_small = o;  // every linear of 2-128 tokens on the wgmma GEMM (not yet run)
  wgmma_small.skinny_wgmma = true;
  wgmma_small.skinny_gemm_min_n = 2;
  v.push_back({"wgmma-small", wgmma_small});
  kernels::cuda_backend_options nowgmma = o;  // cuBLAS for every linear above the GEMV's range
  nowgmma.skinny_wgmma = false;
  v.push_back({"nowgmma", nowgmma});
  kernels::cuda_backend_options novec = o;
  novec.vec_decode = false;
  v.push_back({"novec", novec});
  kernels::cuda_backend_options fused = o;  // one-token steps: every layer in one persistent kernel (session 7)
  fused.fused_decode = true;
  v.push_back({"fused", fused});
  kernels::cuda_backend_options fused_l2 = fused;  // ... its producer asking L2 for 4 stages ahead while its ring is full
  fused_l2.fused_l2_ahead = 4;
  v.push_back({"fused-l2", fused_l2});
  kernels::cuda_backend_options nosplit = o;  // linear_add_rmsnorm as linear + add_rmsnorm (before session 10)
  nosplit.split_linears = false;
  nosplit.wgmma_split = false;
  v.push_back({"nosplit", nosplit});
  kernels::cuda_backend_options splitforce = o;  // the K split wherever it runs, whatever the tuning timed
  splitforce.split_linear_margin_us = -1e9f;
  v.push_back({"splitforce", splitforce});
  kernels::cuda_backend_options nofused = o;
  nofused.fused_decode = false;
  v.push_back({"nofused", nofused});
  kernels::cuda_backend_options copyeng = o;  // between graphs: plan, ids and tokens by cudaMemcpyAsync (before session 9)
  copyeng.kernel_copies = false;
  v.push_back({"copyeng", copyeng});
  v.push_back({"sync", o, {}, false, false});  // the host waits for each step before the next (session 5's loop)
  v.push_back({"gqapf", o, {}, true});  // the defaults, for a prefill-only ablation (--ablate 0)
  kernels::cuda_backend_options nogqapf = o;  // prefill attention: one block per query head (session 3)
  nogqapf.gqa_prefill = false;
  v.push_back({"nogqapf", nogqapf, {}, true});
  // Session 4 (GEMV at batch 1): TMA stages off, capped-grid staging off, both off (session 3's
  // GEMV), and other ring sizes.
  kernels::cuda_backend_options notma = o;
  notma.gemv_tma = false;
  v.push_back({"notma", notma});
  kernels::cuda_backend_options qkvreg = o;  // grids of one to two waves (qkv) on the register kernel
  qkvreg.gemv_tma_partial_wave = false;
  v.push_back({"qkvreg", qkvreg});
  kernels::cuda_backend_options nostage = o;  // gate_up / LM head: x not staged, rmsnorm its own kernel
  nostage.gemv_stage_capped = false;
  v.push_back({"nostage", nostage});
  kernels::cuda_backend_options s3 = o;  // session 3's defaults
  s3.gemv_tma = s3.gemv_stage_capped = false;
  v.push_back({"s3", s3});
  for (int kb : {48, 64, 80, 96, 128, 192, 224}) {  // 96: the default, by name
    kernels::cuda_backend_options r = o;
    r.gemv_tma_ring_kb = kb;
    v.push_back({"tma" + std::to_string(kb), r});
  }
  // Session 17 (batch-1 GEMV prologues): the norm prologue as before, late triggers (the default:
  // laten), fewer stages before the prologue (cuda_backend_options::gemv_* say which bit is which).
  for (int keys : {512, 1024, 2048}) {  // session 30: fewer decode attention splits at long contexts
    kernels::cuda_backend_options r = o;
    r.decode_split_min_keys = keys;
    v.push_back({"split" + std::to_string(keys), r});
  }
  kernels::cuda_backend_options onesplit1024 = o;  // session 30: one split up to 1024 keys (the default: 256)
  onesplit1024.decode_one_split_max_keys = 1024;
  v.push_back({"onesplit1024", onesplit1024});
  // Session 31: several splits with the rope prologue and the last split's merge (no rope_kv, no
  // combine launch), at today's split rule and with fewer splits.
  kernels::cuda_backend_options fusesplits = o;
  fusesplits.decode_fuse_splits = true;
  v.push_back({"fusesplits", fusesplits});
  for (int keys : {512, 1024}) {
    kernels::cuda_backend_options r = fusesplits;
    r.decode_split_min_keys = keys;
    v.push_back({"fusesplits" + std::to_string(keys), r});
  }
  kernels::cuda_backend_options fusesplits_ring8 = fusesplits;  // ... and the ring kernel up to batch 8
  fusesplits_ring8.ring_decode_max_seqs = 8;
  v.push_back({"fusesplits-ring8", fusesplits_ring8});
  kernels::cuda_backend_options normlate = o;
  normlate.gemv_norm_early = false;
  v.push_back({"normlate", normlate});
  using kernels::gemv_every_prologue, kernels::gemv_no_prologue, kernels::gemv_norm_prologue,
      kernels::gemv_silu_prologue;
  for (auto [name, mask] : {std::pair{"late0", 0}, std::pair{"lated", gemv_silu_prologue},
                            std::pair{"laten", gemv_norm_prologue},
                            std::pair{"latedn", gemv_silu_prologue | gemv_norm_prologue},
                            std::pair{"lateno", gemv_norm_prologue | gemv_no_prologue},
                            std::pair{"lateall", gemv_every_prologue}}) {
    kernels::cuda_backend_options l = o;
    l.gemv_late_trigger = mask;
    v.push_back({name, l});
  }
  kernels::cuda_backend_options attnlate = o;  // o_proj launched after the b=1 attention's prologue
  attnlate.decode_late_trigger = true;
  v.push_back({"attnlate", attnlate});
  kernels::cuda_backend_options normtrig = o;  // the qkv GEMM launched once the norm's loads are in
  normtrig.norm_late_trigger = true;
  v.push_back({"normtrig", normtrig});
  for (auto [name, ahead] : {std::pair{"normbehind", 0}, std::pair{"normahead1", 1}, std::pair{"normahead2", 2}}) {
    kernels::cuda_backend_options a = o;  // the norm kernels' loads (0: as before session 18)
    a.norm_loads_ahead = ahead;
    v.push_back({name, a});
  }
  kernels::cuda_backend_options uploadplain = o;  // the upload between steps launched after the sampling kernel
  uploadplain.upload_pdl = false;
  v.push_back({"uploadplain", uploadplain});
  kernels::cuda_backend_options bothlate = attnlate;
  bothlate.norm_late_trigger = true;
  v.push_back({"bothlate", bothlate});
  for (auto [name, mask, stages] :
       {std::tuple{"pre1n", gemv_norm_prologue, 1}, std::tuple{"pre2all", gemv_every_prologue, 2}}) {
    kernels::cuda_backend_options p = o;
    p.gemv_pre_wait_mask = mask;
    p.gemv_pre_wait_stages = stages;
    v.push_back({name, p});
  }
  // Session 19: the next GEMM's weights asked of L2 by the K-split norm / silu_mul kernels before
  // they wait (cuda_backend_options::l2_prefetch_kb): budgets in KB, then one GEMM at a time.
  for (int kb : {4096, 8192, 12288, 16384}) {
    kernels::cuda_backend_options p = o;
    p.l2_prefetch_kb = kb;
    v.push_back({"pf" + std::to_string(kb), p});
  }
  for (auto [name, mask] : {std::pair{"pfqkv", kernels::l2_prefetch_qkv}, std::pair{"pfgu", kernels::l2_prefetch_gate_up},
                            std::pair{"pfdown", kernels::l2_prefetch_down}}) {
    kernels::cuda_backend_options p = o;
    p.l2_prefetch_kb = 12288;
    p.l2_prefetch_mask = mask;
    v.push_back({name, p});
  }
  // Session 20: the wgmma K-split epilogue pushing partial sums to their owner (one cluster barrier).
  kernels::cuda_backend_options push = o;
  push.wgmma_push_reduce = true;
  v.push_back({"push", push});
  // Session 21: the qkv GEMM's K slices summed by the attention prologue (no cluster epilogue).
  kernels::cuda_backend_options qkvslices = o;
  qkvslices.wgmma_qkv_slices = true;
  v.push_back({"qkvslices", qkvslices});
  qkvslices.wgmma_qkv_slices_min_n = 33;  // only where the 1B's decode attention keeps one split
  v.push_back({"qkvslices33", qkvslices});
  qkvslices.wgmma_qkv_slices_min_n = 2;
  kernels::cuda_backend_options qkvslices_ring2 = qkvslices;  // two chunks a warp asked before the wait
  qkvslices_ring2.wgmma_qkv_ring_decode = 2;
  v.push_back({"qkvslices-ring2", qkvslices_ring2});
  v.push_back({"qkvslices-split", split_every_batch(qkvslices)});  // o_proj and down as wgmma K slices too
  // Quantized weights on the default paths (issue 12): the linear layers, then the LM head too.
  for (auto k : {kernels::weight_quant::int8, kernels::weight_quant::fp8}) {
    const std::string name(kernels::weight_quant_name(k));
    v.push_back({name, o, {k, false}});
    v.push_back({name + "-head", o, {k, true}});
  }
  return v;
}

struct bench_config {
  std::string model;
  std::vector<int> batches{1, 8, 64, 256};
  int prompt = 128;
  int new_tokens = 128;
  std::vector<int> prefill{512, 2048};
};

class engine_bench {
 public:
  engine_bench(const bench_config& c, const variant& v) : c_(c), v_(v) {}

  /// One step of `what` inside cudaProfilerStart/Stop, after warm-up steps of the same shape.
  void profile(const std::string& what) {
    load_pipeline();
    if (what == "decode1" || what == "decode64") {
      c_.new_tokens = 8;
      profile_step_ = 4;
      generate_once(what == "decode1" ? 1 : 64, 1);
    } else if (what == "prefill2048") {
      prefill_once(2048);
      prefill_once(2048);
      cudaProfilerStart();
      prefill_once(2048);
      cudaProfilerStop();
    } else {
      die("unknown --profile " + what);
    }
  }

  /// Decode at `batch` with steps 8-11 of 16 recorded by CUPTI: one launch's table and their summary,
  /// and the same steps' wall time untraced and traced (what the recording itself costs).
  void timeline(int batch) {
    constexpr int new_tokens = 16, first = 8, last = 12;  // last < new_tokens: a step follows the traced ones
    load_pipeline();
    c_.new_tokens = new_tokens;
    generate_once(batch, 1);  // records the step graphs
    const double plain = generate_once(batch, 1).decode_s;
    timeline_steps_ = {first, last};
    generate_once(batch, 1);
    const double traced = timed_decode_s_;
    timeline_steps_ = {-1, -1};
    const std::string label = v_.name + " b=" + std::to_string(batch);
    const auto launches = bench::graph_launches(spans_);
    if (launches.size() >= 2) bench::print_launch(stdout, label, spans_, launches[launches.size() / 2]);
    bench::print_summary(stdout, label, spans_, launches);
    std::printf("timeline %s: untraced step %.3f ms (mean of %d), traced steps %.3f ms (mean of %d)\n", label.c_str(),
                plain * 1e3 / (new_tokens - 1), new_tokens - 1, traced * 1e3 / (last - first), last - first);
    // SKINNY_WGMMA_STAMPS=1: the wgmma GEMM's block stamps of the last (untraced) step.
    kernels::cuda::skinny_wgmma_stamps_report(stdout);
    std::fflush(stdout);
    pipe_.reset();
    timer_.reset();
    backend_.reset();
  }

  void run(bool full, const std::vector<int>& ablate_batches, double bw, double gemm,
           std::map<std::string, std::vector<std::int32_t>>& first_tokens) {
    const std::size_t free0 = load_pipeline();
    std::size_t free1 = 0, total = 0;
    check(cudaMemGetInfo(&free1, &total), "cudaMemGetInfo");
    emit(json_line()
             .str("kind", "load")
             .str("variant", v_.name)
             .add("load_s", load_s_)
             .add("weight_bytes", weight_bytes_)
             .add("step_weight_bytes", step_weight_bytes_)
             .add("device_bytes_used", static_cast<double>(free0 - free1))
             .add("kv_bytes", kv_pool_bytes_)
             .done());

    const std::vector<int> batches = full ? c_.batches : ablate_batches;
    for (int batch : batches) {
      if (batch > 0) decode(batch, bw, first_tokens);  // --ablate 0: no decode batches
    }
    if (full) ttft();
    if (full || v_.prefill) {
      for (int t : c_.prefill) prefill(t, gemm);
    }
    std::size_t free2 = 0;
    check(cudaMemGetInfo(&free2, &total), "cudaMemGetInfo");
    emit(json_line()
             .str("kind", "memory")
             .str("variant", v_.name)
             .add("device_bytes_used_after_runs", static_cast<double>(free0 - free2))
             .done());
    pipe_.reset();
    timer_.reset();
    backend_.reset();
  }

 private:
  /// Creates the backend and the pipeline; returns the free device memory before.
  std::size_t load_pipeline() {
    std::size_t free0 = 0, total = 0;
    check(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo");
    auto b = kernels::make_cuda_backend(v_.options);
    if (!b) die("backend: " + b.err().message);
    backend_ = std::move(b).value();
    timer_ = std::make_unique<bench::graph_timer>(*backend_);
    engine::executor_options o;
    o.kv_block_size = 16;
    int max_batch = 1;
    for (int x : c_.batches) max_batch = std::max(max_batch, x);
    o.max_seqs = std::max(max_batch, 1);
    const int per_seq = c_.prompt + c_.new_tokens;
    o.kv_blocks = max_batch * ((per_seq + 15) / 16) + 8;
    int max_prefill = 0;
    for (int x : c_.prefill) max_prefill = std::max(max_prefill, x);
    o.kv_blocks = std::max(o.kv_blocks, (max_prefill + 15) / 16 + 8);
    o.max_step_tokens = std::max(2048, max_prefill);
    o.quant = v_.quant;
    const auto t_load = clock_type::now();
    auto p = engine::local_pipeline::create(*timer_, c_.model, 1, o);
    if (!p) die("pipeline: " + p.err().message);
    pipe_ = std::move(p).value();
    load_s_ = seconds_since(t_load);
    const auto& cfg = pipe_->config();
    vocab_ = cfg.vocab_size;
    weight_bytes_ = pipe_->stages()[0]->weight_bytes();
    kv_bytes_per_token_ = 2.0 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2.0;  // bf16 K and V
    kv_pool_bytes_ = kv_bytes_per_token_ * o.kv_blocks * o.kv_block_size;
    // Bytes a decode step must read: every weight once, except an embedding table that is not also
    // the LM head (the lookup reads one row per token): untied, or tied with a quantized head copy.
    const double embed = static_cast<double>(cfg.vocab_size) * cfg.hidden_size * 2.0;
    const bool head_copy = !cfg.tie_word_embeddings || (v_.quant.lm_head && v_.quant.kind != kernels::weight_quant::none);
    step_weight_bytes_ = static_cast<double>(weight_bytes_) - (head_copy ? embed : 0.0);
    linear_params_ = 0.0;
    {
      const double h = cfg.hidden_size, f = cfg.intermediate_size, d = cfg.head_dim;
      const double qkv = (cfg.num_heads + 2.0 * cfg.num_kv_heads) * d * h, o_p = cfg.num_heads * d * h;
      linear_params_ = cfg.num_layers * (qkv + o_p + 3.0 * f * h);
    }
    return free0;
  }

  std::vector<std::int32_t> random_prompt(std::mt19937_64& rng, int len) const {
    std::uniform_int_distribution<int> d(0, vocab_ - 1);
    std::vector<std::int32_t> v(len);
    for (auto& x : v) x = d(rng);
    return v;
  }

  engine::sequence_step seq_step(std::int64_t id, std::vector<std::int32_t> tokens, int start, bool sample) {
    engine::sequence_step s;
    s.seq_id = id;
    s.tokens = std::move(tokens);
    s.start_pos = start;
    s.block_table = pipe_->blocks().table(id);
    s.sample = sample;
    return s;
  }

  struct decode_result {
    double prefill_s = 0, decode_s = 0;
    std::vector<std::int32_t> seq0_tokens;
  };

  /// Prefills `batch` prompts (chunks of whole prompts up to the step budget), then decodes
  /// new_tokens - 1 steps; times both phases.
  decode_result generate_once(int batch, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<std::int64_t> ids;
    for (int i = 0; i < batch; ++i) {
      prompts.push_back(random_prompt(rng, c_.prompt));
      ids.push_back(next_id_++);
      if (auto st = pipe_->blocks().reserve(ids.back(), c_.prompt + c_.new_tokens); !st) die(st.err().message);
    }
    std::vector<std::int32_t> last(batch);
    decode_result r;
    const int per_step = std::max(1, std::min(batch, 2048 / c_.prompt));
    const auto t0 = clock_type::now();
    for (int i0 = 0; i0 < batch; i0 += per_step) {
      engine::step_plan plan;
      for (int i = i0; i < std::min(batch, i0 + per_step); ++i) plan.seqs.push_back(seq_step(ids[i], prompts[i], 0, true));
      auto out = pipe_->step(plan);
      if (!out) die("prefill step: " + out.err().message);
      for (std::size_t k = 0; k < plan.seqs.size(); ++k) last[i0 + k] = out->tokens[k];
    }
    r.prefill_s = seconds_since(t0);
    r.seq0_tokens.push_back(last[0]);
    const auto t1 = clock_type::now();
    // Queued: step k is queued chained to step k-1's draw (its ids in `last` are stale placeholders),
    // then step k-1 is waited for; the host plans a step while the one before runs.
    const bool queue = v_.queue_steps && pipe_->can_queue_steps();
    auto record = [&](const engine::step_output& out) {
      for (int i = 0; i < batch; ++i) {
        last[i] = out.tokens[i];
        if (last[i] < 0 || last[i] >= vocab_) die("decode step drew token " + std::to_string(last[i]));
      }
      r.seq0_tokens.push_back(last[0]);
    };
    auto end_one = [&] {  // waits for the oldest queued step
      auto out = pipe_->end_step();
      if (!out) die("decode step: " + out.err().message);
      record(*out);
    };
    clock_type::time_point traced_from{};
    for (int step = 1; step < c_.new_tokens; ++step) {
      if (step == profile_step_) cudaProfilerStart();
      if (step == timeline_steps_.first) {
        // The queued step before is still in flight: let it finish outside the recording.
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        if (std::string why = timeline_.start(); !why.empty()) die("timeline: " + why);
        traced_from = clock_type::now();
      }
      engine::step_plan plan;
      for (int i = 0; i < batch; ++i) plan.seqs.push_back(seq_step(ids[i], {last[i]}, c_.prompt + step - 1, true));
      if (queue) {
        if (auto st = pipe_->begin_step(plan, step > 1); !st) die("decode step: " + st.err().message);
        if (step > 1) end_one();
      } else {
        auto out = pipe_->step(plan);
        if (!out) die("decode step: " + out.err().message);
        record(*out);
      }
      if (step == profile_step_) cudaProfilerStop();
      if (step + 1 == timeline_steps_.second) {
        if (queue) end_one();  // the last traced step's tokens (end_one waits for it)
        timed_decode_s_ = seconds_since(traced_from);
        spans_ = timeline_.stop();
        if (queue) {  // the loop expects one step in flight: queue the next one, unchained
          ++step;
          engine::step_plan next;
          for (int i = 0; i < batch; ++i) next.seqs.push_back(seq_step(ids[i], {last[i]}, c_.prompt + step - 1, true));
          if (auto st = pipe_->begin_step(next, false); !st) die("decode step: " + st.err().message);
        }
      }
    }
    if (queue && c_.new_tokens > 1) end_one();
    r.decode_s = seconds_since(t1);
    for (auto id : ids) pipe_->blocks().release(id);
    return r;
  }

  void decode(int batch, double bw, std::map<std::string, std::vector<std::int32_t>>& first_tokens) {
    generate_once(batch, 1000 + batch);  // warm-up: records the step graphs, loads kernels
    const decode_result r = generate_once(batch, 1000 + batch);
    const int steps = c_.new_tokens - 1;
    const double step_s = r.decode_s / steps;
    // Once more with each step's graph timed on the GPU (two event records a step, so this run's
    // wall time is reported beside it, not as the step time): wall − graph is the host's turn.
    timer_->start();
    const decode_result timed = generate_once(batch, 1000 + batch);
    timer_->stop();
    const int timed_steps = timer_->replays();
    const double graph_s = timed_steps > 0 ? timer_->graph_seconds() / timed_steps : 0.0;
    const double avg_ctx = c_.prompt + c_.new_tokens / 2.0;
    const double kv_bytes = batch * avg_ctx * kv_bytes_per_token_;
    const double ceiling_steps = bw / step_weight_bytes_;
    emit(json_line()
             .str("kind", "decode")
             .str("variant", v_.name)
             .add("batch", batch)
             .add("step_ms", step_s * 1e3)
             .add("steps_per_s", 1.0 / step_s)
             .add("decode_tok_s", batch / step_s)
             .add("e2e_tok_s", batch * c_.new_tokens / (r.prefill_s + r.decode_s))
             .add("ttft_batch_ms", r.prefill_s * 1e3)
             .add("weight_roofline_frac", (1.0 / step_s) / ceiling_steps)
             .add("mbu", (step_weight_bytes_ + kv_bytes) / step_s / bw)
             .add("timed_step_ms", timed.decode_s / steps * 1e3)
             .add("graph_ms", graph_s * 1e3)
             .add("graphs_timed", timed_steps)
             .done());
    if (batch == 1) {
      first_tokens[v_.name] = r.seq0_tokens;
      std::string list = "[";
      for (std::size_t i = 0; i < r.seq0_tokens.size(); ++i) list += (i ? "," : "") + std::to_string(r.seq0_tokens[i]);
      emit(json_line().str("kind", "tokens").str("variant", v_.name).add("batch1_greedy", list + "]").done());
    }
  }

  void ttft() {
    std::mt19937_64 rng(5);
    std::vector<double> t;
    for (int i = 0; i < 11; ++i) {
      const std::int64_t id = next_id_++;
      if (auto st = pipe_->blocks().reserve(id, c_.prompt); !st) die(st.err().message);
      engine::step_plan plan;
      plan.seqs.push_back(seq_step(id, random_prompt(rng, c_.prompt), 0, true));
      const auto t0 = clock_type::now();
      auto out = pipe_->step(plan);
      if (!out) die("ttft step: " + out.err().message);
      if (i > 0) t.push_back(seconds_since(t0));
      pipe_->blocks().release(id);
    }
    emit(json_line().str("kind", "ttft").str("variant", v_.name).add("prompt", c_.prompt).add("ttft_ms", median(t) * 1e3).done());
  }

  /// One prefill step of `tokens` random tokens; its wall time.
  double prefill_once(int tokens) {
    const std::int64_t id = next_id_++;
    if (auto st = pipe_->blocks().reserve(id, tokens); !st) die(st.err().message);
    engine::step_plan plan;
    plan.seqs.push_back(seq_step(id, random_prompt(prefill_rng_, tokens), 0, true));
    const auto t0 = clock_type::now();
    auto out = pipe_->step(plan);
    if (!out) die("prefill step: " + out.err().message);
    const double s = seconds_since(t0);
    pipe_->blocks().release(id);
    return s;
  }

  void prefill(int tokens, double gemm) {
    const auto& cfg = pipe_->config();
    std::vector<double> t;
    for (int i = 0; i < 6; ++i) {
      const double s = prefill_once(tokens);
      if (i > 0) t.push_back(s);
    }
    const double s = median(t);
    // Useful FLOPs: every linear layer on every token, causal attention (QKᵀ and PV over the visible
    // half), the LM head on the one sampled row.
    const double attn = 2.0 * cfg.num_layers * static_cast<double>(tokens) * tokens * cfg.num_heads * cfg.head_dim;
    const double flops = 2.0 * tokens * linear_params_ + attn + 2.0 * cfg.vocab_size * cfg.hidden_size;
    emit(json_line()
             .str("kind", "prefill")
             .str("variant", v_.name)
             .add("tokens", tokens)
             .add("ms", s * 1e3)
             .add("tok_s", tokens / s)
             .add("tflops", flops / s * 1e-12)
             .add("mfu", flops / s / gemm)
             .done());
  }

  bench_config c_;
  variant v_;
  std::unique_ptr<kernels::backend> backend_;
  std::unique_ptr<bench::graph_timer> timer_;  // what the pipeline runs on: backend_, its graphs timed
  std::unique_ptr<engine::local_pipeline> pipe_;
  int vocab_ = 0;
  std::size_t weight_bytes_ = 0;
  double step_weight_bytes_ = 0, kv_bytes_per_token_ = 0, kv_pool_bytes_ = 0, linear_params_ = 0;
  std::int64_t next_id_ = 1;
  int profile_step_ = -1;
  std::pair<int, int> timeline_steps_{-1, -1};  // [first, last) decode steps CUPTI records
  bench::kernel_timeline timeline_;
  std::vector<bench::gpu_span> spans_;
  double timed_decode_s_ = 0;
  double load_s_ = 0;
  std::mt19937_64 prefill_rng_{9};
};

}  // namespace

int main(int argc, char** argv) {
  bench_config c;
  std::vector<std::string> variants{"all", "base"};
  std::vector<int> ablate{1, 8};
  std::string json_path;
  bool ceilings = true;
  std::string profile, profile_variant = "all";
  std::vector<int> timeline_batches;
  std::vector<std::string> timeline_variants{"all"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return bench::flag_value(argc, argv, i, die); };
    if (a == "--model") c.model = next();
    else if (a == "--batches") c.batches = bench::int_list_flag(a, next(), 1, 4096, die);
    else if (a == "--prompt") c.prompt = bench::int_flag(a, next(), 1, 1 << 20, die);
    else if (a == "--new") c.new_tokens = bench::int_flag(a, next(), 1, 1 << 20, die);
    else if (a == "--prefill") c.prefill = bench::int_list_flag(a, next(), 1, 1 << 20, die);
    else if (a == "--variants") variants = parse_words(next());
    else if (a == "--ablate") ablate = bench::int_list_flag(a, next(), 0, 4096, die);  // 0: no decode batches
    else if (a == "--json") json_path = next();
    else if (a == "--ceilings") ceilings = next() != "0";
    else if (a == "--profile") profile = next();
    else if (a == "--profile-variant") profile_variant = next();
    else if (a == "--timeline") timeline_batches = bench::int_list_flag(a, next(), 1, 4096, die);
    else if (a == "--timeline-variants") timeline_variants = parse_words(next());
    else die("unknown flag " + a + " (see the comment at the top of bench/conveyor_bench.cpp)");
  }
  if (c.model.empty()) die("--model DIR is required");
  if (!json_path.empty()) json_out.open(json_path, std::ios::app);

  if (!profile.empty()) {
    const auto known = all_variants();
    const auto it =
        std::find_if(known.begin(), known.end(), [&](const variant& v) { return v.name == profile_variant; });
    if (it == known.end()) die("unknown variant " + profile_variant);
    engine_bench(c, *it).profile(profile);
    return 0;
  }
  if (!timeline_batches.empty()) {
    const auto known = all_variants();
    for (const auto& name : timeline_variants) {
      const auto it = std::find_if(known.begin(), known.end(), [&](const variant& v) { return v.name == name; });
      if (it == known.end()) die("unknown variant " + name);
      for (int b : timeline_batches) engine_bench(c, *it).timeline(b);
    }
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  // Without --ceilings the shares use the H200's figures from DESIGN.md (a later run measures).
  const double bw = ceilings ? copy_bandwidth() : 4.23e12;
  const double gemm = ceilings ? gemm_rate(8192) : 790e12;
  if (ceilings) {
    emit(json_line()
             .str("kind", "ceilings")
             .str("device", prop.name)
             .add("sms", prop.multiProcessorCount)
             .add("copy_bytes_per_s", bw)
             .add("gemm_flops", gemm)
             .done());
  }

  std::map<std::string, std::vector<std::int32_t>> first_tokens;
  const auto known = all_variants();
  for (std::size_t vi = 0; vi < variants.size(); ++vi) {
    const auto it = std::find_if(known.begin(), known.end(), [&](const variant& v) { return v.name == variants[vi]; });
    if (it == known.end()) die("unknown variant " + variants[vi]);
    const bool full = it->name == "all" || it->name == "base" || it->quant.kind != kernels::weight_quant::none;
    engine_bench(c, *it).run(full, ablate, bw, gemm, first_tokens);
  }
  // Greedy tokens of the batch-1 run per variant: the speed paths should not change them much.
  if (first_tokens.count("all") && first_tokens.count("base")) {
    const auto& a = first_tokens["all"];
    const auto& b = first_tokens["base"];
    std::size_t same = 0;
    while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
    emit(json_line().str("kind", "agreement").add("same_prefix", same).add("tokens", a.size()).done());
  }
  return 0;
}
