// The checks that need the model's shape, run once its config.json is read.
#include <algorithm>
#include <numeric>

#include "conveyor/config/deployment_loader.hpp"
#include "diagnostics.hpp"
#include "rules.hpp"

namespace conveyor::config {
namespace {

using detail::diagnostics;
using detail::where;

std::string str(int v) { return std::to_string(v); }

std::string divisors_up_to(int n, int limit) {
  std::string s;
  for (int k = 1; k <= std::min(n, limit); ++k) {
    if (n % k == 0) s += (s.empty() ? "" : ", ") + std::to_string(k);
  }
  return s;
}

}  // namespace

status validate_against_model(const deployment& d, int num_layers, int num_heads, int num_kv_heads,
                              int max_position_embeddings) {
  if (num_layers < 1 || num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    return make_error(errc::invalid_argument, "the model's shape is not usable: " + str(num_layers) +
                                                  " layers, " + str(num_heads) + " attention heads, " +
                                                  str(num_kv_heads) + " KV heads");
  }
  diagnostics out;
  const auto& p = d.parallel;
  if (p.stages > num_layers) {
    out.add(where(d, "parallel.stages") + ": parallel.stages = " + str(p.stages) + ": the model has " +
            str(num_layers) + " layers, so at most " + str(num_layers) + " stages");
  }
  if (!p.layers.empty()) {
    const int sum = std::accumulate(p.layers.begin(), p.layers.end(), 0);
    if (sum != num_layers) {
      out.add(where(d, "parallel.layers") + ": parallel.layers = " + detail::format_ints(p.layers) +
              " adds up to " + str(sum) + " layers, but the model has " + str(num_layers) +
              ": the split must cover every layer once");
    }
  }
  const int heads_gcd = std::gcd(num_heads, num_kv_heads);
  if (heads_gcd % p.tp != 0) {
    out.add(where(d, "parallel.tp") + ": parallel.tp = " + str(p.tp) + ": must divide the model's " +
            str(num_heads) + " attention heads and " + str(num_kv_heads) + " KV heads (allowed: " +
            divisors_up_to(heads_gcd, static_cast<int>(detail::rules::tp.max)) + ")");
  }
  if (max_position_embeddings > 0 && d.serving.max_context > max_position_embeddings) {
    out.add(where(d, "serving.max_context") + ": serving.max_context = " + str(d.serving.max_context) +
            ": the model has " + str(max_position_embeddings) + " positions, so at most " +
            str(max_position_embeddings));
  }
  if (out.empty()) return ok_status();
  return out.to_error(errc::invalid_argument);
}

}  // namespace conveyor::config
