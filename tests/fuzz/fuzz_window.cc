// Fuzz target: the byte layout of windowed keys (core/src/window.cc).
//
// Properties, from core/window.h:
// - decode(encode(key, start)) == (key, start), and encode(decode(bytes)) == bytes
//   whenever bytes decode (one encoding per pair);
// - byte order of encodings is the order of (key as bytes, start as signed number);
// - every window of a key starts with windowed_key_prefix(key), and key < to (as
//   bytes) exactly when encode(key, start) < windowed_key_prefix(to), so a key range
//   [from, to) is the encoded range [prefix(from), prefix(to)).
// And the window arithmetic, for any event time (records carry any int64): the starts
// of the windows containing a time are exactly the aligned ones, and closing, expiry
// and the first live start agree with the same sums done in 128 bits.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "core/window.h"
#include "fuzz_check.h"

namespace {

int sign(int v) { return (v > 0) - (v < 0); }

int compare_pairs(const std::string& k1, int64_t s1, const std::string& k2, int64_t s2) {
  if (int c = k1.compare(k2); c != 0) return sign(c);
  return (s1 > s2) - (s1 < s2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kstate::decode_windowed_key;
  using kstate::encode_windowed_key;
  using kstate::windowed_key_prefix;

  // The whole input as stored bytes.
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto d = decode_windowed_key(bytes)) FUZZ_CHECK(encode_windowed_key(d->key, d->start) == bytes);

  // The input as two (key, start) pairs.
  FuzzedDataProvider in(data, size);
  const std::string k1 = in.ConsumeRandomLengthString();
  const std::string k2 = in.ConsumeRandomLengthString();
  const auto s1 = in.ConsumeIntegral<int64_t>();
  const auto s2 = in.ConsumeIntegral<int64_t>();
  const std::string e1 = encode_windowed_key(k1, s1);
  const std::string e2 = encode_windowed_key(k2, s2);

  auto d1 = decode_windowed_key(e1);
  FUZZ_CHECK(d1 && d1->key == k1 && d1->start == s1);
  FUZZ_CHECK(sign(e1.compare(e2)) == compare_pairs(k1, s1, k2, s2));
  FUZZ_CHECK(e1.rfind(windowed_key_prefix(k1), 0) == 0);
  FUZZ_CHECK((k1 < k2) == (e1 < windowed_key_prefix(k2)));
  FUZZ_CHECK((k1 >= k2) == (e1 >= windowed_key_prefix(k2)));

  // A valid spec (at most 1000 windows per record, so the target stays fast) and times.
  kstate::window_spec spec;
  spec.type = in.ConsumeBool() ? kstate::window_type::hopping : kstate::window_type::tumbling;
  spec.size_ms = in.ConsumeIntegralInRange<int64_t>(1, 100LL * 365 * 86'400'000);
  if (spec.type == kstate::window_type::hopping)
    spec.advance_ms = in.ConsumeIntegralInRange<int64_t>(std::max<int64_t>(1, spec.size_ms / 1000), spec.size_ms);
  spec.grace_ms = in.ConsumeIntegralInRange<int64_t>(0, 100LL * 365 * 86'400'000);
  const int64_t min_retention = spec.size_ms + spec.grace_ms;
  spec.retention_ms = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(min_retention, 2 * min_retention);
  if (!kstate::normalize(spec).ok()) return 0;
  const auto ts = in.ConsumeIntegral<int64_t>();
  const auto stream_time = in.ConsumeIntegral<int64_t>();
  using wide = __int128;

  const auto starts = kstate::window_starts(spec, ts);
  FUZZ_CHECK(starts.empty() == (ts < 0));
  for (size_t i = 0; i < starts.size(); ++i) {
    const wide s = starts[i];
    FUZZ_CHECK(s >= 0 && s % spec.advance_ms == 0 && s <= ts && ts < s + spec.size_ms);
    if (i > 0) FUZZ_CHECK(s == wide{starts[i - 1]} + spec.advance_ms);
  }
  if (!starts.empty()) {
    // None missing before the first or after the last.
    const wide before = wide{starts.front()} - spec.advance_ms;
    FUZZ_CHECK(before < 0 || before + spec.size_ms <= ts);
    FUZZ_CHECK(wide{starts.back()} + spec.advance_ms > ts);
  }

  const wide start = ts;  // any int64 as a window start
  FUZZ_CHECK(kstate::window_closed(spec, ts, stream_time) == (start + spec.size_ms + spec.grace_ms <= stream_time));
  FUZZ_CHECK(kstate::window_expired(spec, ts, stream_time) ==
             (start + spec.size_ms + spec.retention_ms <= stream_time));
  // first_live_start is the smallest start that is not expired (INT64_MIN when every
  // start is live).
  const wide first = wide{stream_time} - spec.size_ms - spec.retention_ms + 1;
  const wide lowest = std::numeric_limits<int64_t>::min();
  FUZZ_CHECK(wide{kstate::first_live_start(spec, stream_time)} == (first < lowest ? lowest : first));
  return 0;
}
