// LATHE_CHECK: broken invariants (programming errors) abort with file:line. Not for bad input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define LATHE_CHECK(cond)                                                              \
  do {                                                                                 \
    if (__builtin_expect(!(cond), 0)) {                                                \
      std::fprintf(stderr, "%s:%d: LATHE_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#define LATHE_CHECK_MSG(cond, ...)                                                      \
  do {                                                                                  \
    if (__builtin_expect(!(cond), 0)) {                                                 \
      std::fprintf(stderr, "%s:%d: LATHE_CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                \
      std::fputc('\n', stderr);                                                         \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
