#pragma once
// Error values for bad external input (DESIGN.md: "errors from input are values").
// A bug asserts; a bad checkpoint, config, request or frame returns an `error` that says what was wrong.
#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace conveyor {

/// Broad class of a failure, so callers can react (retry, reject, report) without parsing text.
enum class errc {
  invalid_argument,  ///< a request, flag or value outside what is allowed
  not_found,         ///< a file, tensor or key that should exist does not
  bad_format,        ///< malformed bytes: JSON, safetensors header, frame
  unsupported,       ///< well-formed but not something we implement (model_type, dtype, rope type)
  out_of_memory,     ///< a planned allocation does not fit
  io,                ///< the operating system refused (open, mmap, read)
  internal,          ///< a device or library call failed
  overloaded,        ///< the server has no room for the request now (queue caps, job tickets); retry later
  deadline_exceeded, ///< the request passed its deadline and was cancelled
};

/// What went wrong, in words a user can act on.
struct error {
  errc code = errc::internal;
  std::string message;
};

inline error make_error(errc code, std::string message) { return error{code, std::move(message)}; }

/// Either a value or an error; `[[nodiscard]]` so an ignored failure is a compile warning.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : v_(std::move(value)) {}       // NOLINT: implicit by design
  result(error err) : v_(std::move(err)) {}       // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const error& err() const { assert(!ok()); return std::get<1>(v_); }

 private:
  std::variant<T, error> v_;
};

/// result<void>: success or an error.
class [[nodiscard]] status {
 public:
  status() = default;
  status(error err) : err_(std::move(err)) {}  // NOLINT
  bool ok() const { return !err_.has_value(); }
  explicit operator bool() const { return ok(); }
  const error& err() const { assert(!ok()); return *err_; }

 private:
  // An optional, so an OK status (the usual one, on every send and receive of a small frame) is
  // one flag to set, move and destroy; an error held inline cost its empty string's
  // construction and destruction each time.
  std::optional<error> err_;
};

inline status ok_status() { return {}; }

}  // namespace conveyor

/// Propagate an error from an expression returning result<T> or status; binds the value to `var`.
#define CONVEYOR_TRY_ASSIGN(var, expr)                     \
  auto var##_result_ = (expr);                            \
  if (!var##_result_.ok()) return var##_result_.err();    \
  auto var = std::move(var##_result_).value()

#define CONVEYOR_TRY(expr)                                \
  do {                                                    \
    auto try_status_ = (expr);                            \
    if (!try_status_.ok()) return try_status_.err();      \
  } while (0)
