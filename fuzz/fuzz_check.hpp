#pragma once
// An invariant of a fuzz target: when an input that the code accepted breaks a promise of its API, stop
// the way a crash does, so libFuzzer keeps the input and the replay test fails on it.
#include <cstdio>
#include <cstdlib>

#define CONVEYOR_FUZZ_CHECK(cond)                                                               \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond);   \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
