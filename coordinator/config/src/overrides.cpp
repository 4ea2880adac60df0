// Command-line flags over a loaded deployment: same rules as the file, then the same cross-key checks,
// so `--tp 2` against `type = "pp"` is caught and names both the flag and the file's line.
#include "conveyor/config/deployment_loader.hpp"
#include "diagnostics.hpp"
#include "resolve.hpp"
#include "rules.hpp"

namespace conveyor::config {
namespace {

using detail::diagnostics;

void set_int(deployment& d, diagnostics& out, std::string_view flag, const std::optional<int>& value,
             std::string_view key, const detail::int_rule& rule, int& field) {
  if (!value) return;
  if (!detail::accepts(rule, *value)) {
    out.add(std::string(flag) + ": " + std::string(key) + " = " + std::to_string(*value) + ": " +
            detail::allowed(rule));
    return;
  }
  field = *value;
  d.origins[std::string(key)] = source_position{std::string(flag), 0, 0};
}

}  // namespace

status apply_overrides(deployment& d, const overrides& o) {
  deployment next = d;  // all or nothing: a bad flag leaves the caller's deployment as it was
  diagnostics out;
  if (o.model) {
    if (o.model->empty()) {
      out.add("--model: model.dir = \"\": must not be empty");
    } else {
      next.model.dir = *o.model;
      next.origins["model.dir"] = {"--model", 0, 0};
    }
  }
  set_int(next, out, "--stages", o.stages, "parallel.stages", detail::rules::stages, next.parallel.stages);
  set_int(next, out, "--chunks", o.chunks, "parallel.chunks", detail::rules::chunks, next.parallel.chunks);
  set_int(next, out, "--tp", o.tp, "parallel.tp", detail::rules::tp, next.parallel.tp);
  if (o.listen) {
    auto e = parse_endpoint(*o.listen);
    if (!e.ok()) {
      out.add("--listen: frontend.rpc_listen = " + detail::quoted(*o.listen) + ": " + e.err().message);
    } else {
      next.frontend.rpc_listen = std::move(e).value();
      next.origins["frontend.rpc_listen"] = {"--listen", 0, 0};
    }
  }
  if (!out.empty()) return out.to_error(errc::invalid_argument);
  detail::resolve_defaults(next);
  CONVEYOR_TRY(check_deployment(next));
  d = std::move(next);
  return ok_status();
}

}  // namespace conveyor::config
