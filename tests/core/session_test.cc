// Session windows in core: the spec, and the boundaries of joining, closing and expiry,
// each checked against the definition written out in the test.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "core/window.h"

using namespace kstate;

namespace {

window_spec session(int64_t gap, int64_t grace = 0, int64_t retention = 0) {
  window_spec s;
  s.type = window_type::session;
  s.gap_ms = gap;
  s.grace_ms = grace;
  s.retention_ms = retention;
  REQUIRE(normalize(s).ok());
  return s;
}

}  // namespace

TEST_CASE("session specs need a positive gap, no size or advance, and retention of at least gap + grace") {
  struct row {
    int64_t size, advance, gap, grace, retention;
    const char* field;
  };
  const row rows[] = {
      {0, 0, 0, 0, 0, "inactivity_gap"},
      {0, 0, -5, 0, 0, "inactivity_gap"},
      {60'000, 0, 1'000, 0, 0, "size"},
      {0, 10'000, 1'000, 0, 0, "advance"},
      {0, 0, 1'000, -1, 0, "grace"},
      {0, 0, 60'000, 30'000, 89'999, "retention"},
      {0, 0, std::numeric_limits<int64_t>::max(), 0, 0, "inactivity_gap"},
  };
  for (const auto& r : rows) {
    window_spec s;
    s.type = window_type::session;
    s.size_ms = r.size;
    s.advance_ms = r.advance;
    s.gap_ms = r.gap;
    s.grace_ms = r.grace;
    s.retention_ms = r.retention;
    const status st = normalize(s);
    CAPTURE(r.field);
    REQUIRE_FALSE(st.ok());
    CHECK(st.message().rfind(r.field, 0) == 0);
  }
  // A gap on a tumbling window is refused too, naming it.
  window_spec t;
  t.size_ms = 60'000;
  t.gap_ms = 1'000;
  const status st = normalize(t);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().rfind("inactivity_gap", 0) == 0);

  const auto s = session(5 * 60'000, 30'000);
  CHECK(s.retention_ms == 24LL * 3600 * 1000);
  CHECK(session(2LL * 24 * 3600 * 1000, 1'000).retention_ms == 2LL * 24 * 3600 * 1000 + 1'000);
  CHECK(window_starts(s, 1'000).empty());  // sessions are not aligned windows
  window_type parsed = window_type::tumbling;
  REQUIRE(parse_window_type("session", parsed));
  CHECK(parsed == window_type::session);
  CHECK(std::string(to_string(window_type::session)) == "session");
}

TEST_CASE("a record joins a session when start - gap <= t <= last + gap, both ends inclusive") {
  const auto s = session(10);
  // Session [100, 150]: times 90..160 reach it, 89 and 161 do not.
  for (int64_t t = 80; t <= 170; ++t) {
    CAPTURE(t);
    CHECK(session_reaches(s, 100, 150, t) == (t >= 90 && t <= 160));
  }
  // No overflow at the ends of the range.
  constexpr int64_t max = std::numeric_limits<int64_t>::max();
  CHECK(session_reaches(s, max - 5, max - 1, max));
  CHECK(session_reaches(s, std::numeric_limits<int64_t>::min() + 3, 0, std::numeric_limits<int64_t>::min()));
}

TEST_CASE("a session closes once stream time passes last + gap + grace, and expires past last + retention") {
  const auto s = session(10, 5, 100);
  // last 1000: open while stream time <= 1015, closed from 1016 (Kafka Streams: late when
  // last + gap + grace < stream time).
  for (int64_t st = 990; st <= 1030; ++st) {
    CAPTURE(st);
    CHECK(session_closed(s, 1000, st) == (1000 + 10 + 5 < st));
  }
  // Kept while last + retention >= stream time: the half-open end (last + 1) plus
  // retention not reached, as the other windows.
  for (int64_t st = 1090; st <= 1110; ++st) {
    CAPTURE(st);
    CHECK(session_expired(s, 1000, st) == (1000 + 100 < st));
    const int64_t first = first_live_last(s, st);
    CHECK_FALSE(session_expired(s, first, st));
    CHECK(session_expired(s, first - 1, st));
  }
  constexpr int64_t max = std::numeric_limits<int64_t>::max();
  CHECK_FALSE(session_closed(s, max - 3, max));
  CHECK_FALSE(session_expired(s, max - 3, max));
  CHECK(first_live_last(s, std::numeric_limits<int64_t>::min() + 5) == std::numeric_limits<int64_t>::min());
}
