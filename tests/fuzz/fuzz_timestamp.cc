// Fuzz target: event times and durations (core/src/window.cc): parse_timestamp_ms
// reads a field of every record of a view with window.time_field, and
// format_timestamp_ms writes window bounds into answers.
//
// Properties: parsing any text and formatting any int64 is defined behaviour;
// format then parse gives the same instant for every instant of years 0000-9999
// (what the format can spell); a parsed timestamp in that range formats to text
// that parses back to it; durations are non-negative and read back in ms.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/window.h"
#include "fuzz_check.h"

namespace {
// 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z in epoch ms.
constexpr int64_t k_first_ms = -62'167'219'200'000;
constexpr int64_t k_last_ms = 253'402'300'799'999;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto t = kstate::parse_timestamp_ms(text); t.ok() && *t >= k_first_ms && *t <= k_last_ms) {
    auto again = kstate::parse_timestamp_ms(kstate::format_timestamp_ms(*t));
    FUZZ_CHECK(again.ok() && *again == *t);
  }
  if (auto d = kstate::parse_duration_ms(text); d.ok()) {
    FUZZ_CHECK(*d >= 0);
    auto again = kstate::parse_duration_ms(std::to_string(*d) + "ms");
    FUZZ_CHECK(again.ok() && *again == *d);
  }

  FuzzedDataProvider in(data, size);
  const auto ms = in.ConsumeIntegral<int64_t>();
  const std::string formatted = kstate::format_timestamp_ms(ms);
  if (ms >= k_first_ms && ms <= k_last_ms) {
    auto back = kstate::parse_timestamp_ms(formatted);
    FUZZ_CHECK(back.ok() && *back == ms);
  }
  return 0;
}
