// Fuzz target: check_json() (core/json_check.h), the validity and depth check run on
// every JSON a record or a client brings, against nlohmann's parser and a bracket count.

#include <climits>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/json_check.h"
#include "fuzz_check.h"

using kstate::check_json;
using kstate::json_verdict;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  // Without a binding bound, what the check accepts is what the query side parses
  // later (nlohmann): a record it passes must parse, and one it refuses must not.
  const bool accepted = nlohmann::json::accept(s);
  FUZZ_CHECK((check_json(s, INT_MAX) == json_verdict::ok) == accepted);
  if (accepted) {
    // Bounded: exactly the documents nested deeper than the bound are too deep.
    const int depth = fuzz_json_depth(s);
    FUZZ_CHECK(check_json(s, depth > 0 ? depth : 1) == json_verdict::ok);
    if (depth > 1) FUZZ_CHECK(check_json(s, depth - 1) == json_verdict::too_deep);
  }
  return 0;
}
