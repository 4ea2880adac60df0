#include "conveyor/config/endpoint.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace conveyor::config {
namespace {

constexpr std::string_view endpoint_form =
    "\"HOST:PORT\" with a port from 0 to 65535, e.g. \"127.0.0.1:7600\"";

error endpoint_error(std::string_view why) {
  return make_error(errc::invalid_argument,
                    "must be " + std::string(endpoint_form) + " (" + std::string(why) + ")");
}

}  // namespace

std::string check_host(std::string_view host) {
  if (host.empty()) return "the host is empty";
  const std::string bad = "\"" + std::string(host) + "\" is not a hostname or IP address";
  const auto colons = std::count(host.begin(), host.end(), ':');
  if (colons == 1) return bad + " (a port does not belong here)";
  if (colons >= 2) {  // an IPv6 literal: hex groups, maybe an embedded IPv4 tail and a %zone
    const auto zone = host.find('%');
    for (char c : host.substr(0, zone)) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return bad;
    }
    return {};
  }
  for (char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '.' && c != '-' && c != '_') return bad;
  }
  return {};
}

result<endpoint> parse_endpoint(std::string_view text) {
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {  // [v6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return endpoint_error("an IPv6 address is written \"[::1]:7600\"");
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return endpoint_error("no port");
    host = text.substr(0, colon);
    if (host.find(':') != std::string_view::npos) {
      return endpoint_error("an IPv6 address needs brackets: \"[::1]:7600\"");
    }
    port_text = text.substr(colon + 1);
  }
  if (std::string why = check_host(host); !why.empty()) return endpoint_error(why);
  int port = -1;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 ||
      port > 65535) {
    return endpoint_error("bad port \"" + std::string(port_text) + "\"");
  }
  return endpoint{std::string(host), port};
}

std::string to_string(const endpoint& e) {
  const bool ipv6 = e.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

bool is_loopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.substr(0, 4) == "127.";
}

}  // namespace conveyor::config
