// Fuzz target: the JSON validity check of the ingest path against nlohmann's parser.
//
// check() is the one line that names the function under test: keep it that way, so
// that pointing the target at another implementation of the check (one with a depth
// bound, say) changes only that line, plus the property below where the bound makes
// the two differ on purpose.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "fuzz_check.h"
#include "ingest/batch_builder.h"

namespace {
bool check(std::string_view s) { return kstate::ingest::valid_json(s); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  // What the check accepts is what the query side parses later (nlohmann): a record
  // it passes must parse, and one it refuses must not.
  FUZZ_CHECK(check(s) == nlohmann::json::accept(s));
  return 0;
}
