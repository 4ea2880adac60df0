#pragma once
// Helpers for the deployment-config tests.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "conveyor/config/deployment_loader.hpp"

namespace conveyor::config::testing {

/// Parses `text` as "deploy.toml" and returns the error message, or "" when it parsed.
inline std::string parse_error_of(std::string_view text) {
  auto d = parse_deployment(text, "deploy.toml");
  return d.ok() ? std::string() : d.err().message;
}

/// Parses `text` as "deploy.toml"; fails the test with the message when it does not parse.
inline deployment parse_ok(std::string_view text) {
  auto d = parse_deployment(text, "deploy.toml");
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.err().message);
  return d.ok() ? std::move(d).value() : deployment{};
}

inline bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace conveyor::config::testing
