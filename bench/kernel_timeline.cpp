// CUPTI activity records -> spans (kernel_timeline.hpp); timeline_report.cpp makes the tables.
#include "kernel_timeline.hpp"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace conveyor::bench {
namespace {

// CUPTI's buffer callbacks are plain functions, so what they collect has to live at namespace scope.
std::mutex records_mutex;
std::vector<gpu_span> records;

constexpr std::size_t buffer_bytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, buffer_bytes));
  *size = buffer_bytes;
  *max_records = 0;  // as many as fit
}

// "void ns::(anonymous namespace)::gemv_kernel<8, true>(args...)" -> "gemv_kernel<8, true>".
std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : mangled;
  std::free(d);
  for (std::size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  int depth = 0;
  std::size_t cut = s.size(), word = 0, scope = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth != 0) continue;
    if (c == '(') {
      cut = i;
      break;
    }
    if (c == ' ') word = i + 1;
    if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') scope = i + 2;
  }
  s = s.substr(std::max(word, scope), cut - std::max(word, scope));
  if (s.size() > 56) s = s.substr(0, 53) + "...";
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<gpu_span> got;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    gpu_span s;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      s.kind = gpu_span::span_kind::kernel;
      s.name = short_name(k->name);
      s.start = k->start;
      s.end = k->end;
      s.correlation = k->correlationId;
      s.grid = k->gridX * k->gridY * k->gridZ;
      s.block = k->blockX * k->blockY * k->blockZ;
      s.registers = k->registersPerThread;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      s.kind = gpu_span::span_kind::memcpy;
      static const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      s.name = std::string("memcpy ") + (m->copyKind < 11 ? kinds[m->copyKind] : "?");
      s.start = m->start;
      s.end = m->end;
      s.correlation = m->correlationId;
      s.bytes = m->bytes;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      s.kind = gpu_span::span_kind::memset;
      s.name = "memset";
      s.start = m->start;
      s.end = m->end;
      s.correlation = m->correlationId;
      s.bytes = m->bytes;
    } else {
      continue;
    }
    got.push_back(std::move(s));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

std::string cupti_error(CUptiResult r, const char* what) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  return std::string(what) + ": " + (text != nullptr ? text : "unknown CUPTI error");
}

const CUpti_ActivityKind traced[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

std::string kernel_timeline::start() {
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
  }
  if (CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    return cupti_error(r, "cuptiActivityRegisterCallbacks");
  }
  for (CUpti_ActivityKind k : traced) {
    if (CUptiResult r = cuptiActivityEnable(k); r != CUPTI_SUCCESS) return cupti_error(r, "cuptiActivityEnable");
  }
  return {};
}

std::vector<gpu_span> kernel_timeline::stop() {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind k : traced) cuptiActivityDisable(k);
  std::lock_guard<std::mutex> lock(records_mutex);
  std::vector<gpu_span> out = std::move(records);
  records.clear();
  std::sort(out.begin(), out.end(), [](const gpu_span& a, const gpu_span& b) { return a.start < b.start; });
  return out;
}

}  // namespace conveyor::bench
