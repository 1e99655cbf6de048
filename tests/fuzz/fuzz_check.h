#pragma once
// FUZZ_CHECK(cond): a property of the code under test. When it does not hold, the
// target names it and aborts, which libFuzzer reports as a crash and keeps the input.

#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: property does not hold: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

// How deep `text` nests arrays and objects (a scalar: 0), for text nlohmann accepts:
// brackets outside strings, counted. The reference for the depth bounds.
inline int fuzz_json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '\0') {
      break;  // what follows a NUL after a document is not looked at
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}
