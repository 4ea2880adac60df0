#pragma once
// HOST:PORT addresses as the config and the CLI flags spell them. Plain C++ so that the frontend, the
// coordinator and the launcher can parse and print addresses without reading TOML.
#include <string>
#include <string_view>

#include "conveyor/base/result.hpp"

namespace conveyor::config {

/// An address to listen on or connect to. `port` 0 asks the OS for a free port.
struct endpoint {
  std::string host = "127.0.0.1";  ///< hostname, IPv4 literal, or IPv6 literal without brackets
  int port = 0;                    ///< 0..65535

  friend bool operator==(const endpoint&, const endpoint&) = default;
};

/// Parses "HOST:PORT" (IPv6 as "[::1]:7600"). The error message says what was wrong and shows the
/// accepted form; callers prefix it with the key or flag it came from.
result<endpoint> parse_endpoint(std::string_view text);

/// "HOST:PORT", with brackets around an IPv6 host.
std::string to_string(const endpoint& e);

/// Why `host` is not a usable hostname or IP literal, or an empty string when it is one.
std::string check_host(std::string_view host);

/// True for "localhost", 127.0.0.0/8 and ::1: addresses that other machines cannot reach.
bool is_loopback(std::string_view host);

}  // namespace conveyor::config
