#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/guard.h"
#include "core/notifier.h"
#include "core/ownership.h"
#include "core/utf8.h"
#include "core/value_codec.h"
#include "core/window.h"

using namespace kstate;

namespace {

window_spec spec(window_type t, int64_t size, int64_t advance, int64_t grace = 0, int64_t retention = 0) {
  window_spec s;
  s.type = t;
  s.size_ms = size;
  s.advance_ms = advance;
  s.grace_ms = grace;
  s.retention_ms = retention;
  REQUIRE(normalize(s).ok());
  return s;
}

// Every epoch-aligned start, by enumeration: the independent model of window_starts.
std::vector<int64_t> starts_by_enumeration(const window_spec& s, int64_t ts) {
  std::vector<int64_t> out;
  for (int64_t start = 0; start <= ts; start += s.advance_ms)
    if (ts < start + s.size_ms) out.push_back(start);
  return out;
}

}  // namespace

TEST_CASE("window starts equal an enumeration of aligned windows containing the time") {
  std::mt19937_64 rng(7);
  const window_spec specs[] = {
      spec(window_type::tumbling, 60'000, 0),     spec(window_type::hopping, 60'000, 10'000),
      spec(window_type::hopping, 60'000, 60'000), spec(window_type::hopping, 7, 3),
      spec(window_type::hopping, 10, 1),
  };
  for (const auto& s : specs) {
    for (int i = 0; i < 2000; ++i) {
      const int64_t ts = static_cast<int64_t>(rng() % 1'000'000);
      CHECK(window_starts(s, ts) == starts_by_enumeration(s, ts));
    }
    CHECK(window_starts(s, 0) == starts_by_enumeration(s, 0));
    CHECK(window_starts(s, -5).empty());
  }
  // A tumbling window of a minute: one window, the minute the record falls in.
  CHECK(window_starts(specs[0], 1'796'205'659'999) == std::vector<int64_t>{1'796'205'600'000});
  // A 1-minute window advancing by 10 s: six windows.
  CHECK(window_starts(specs[1], 65'000).size() == 6);
}

TEST_CASE("windows close after end plus grace and expire after end plus retention") {
  const auto s = spec(window_type::tumbling, 60'000, 0, 30'000, 3'600'000);
  CHECK_FALSE(window_closed(s, 0, 89'999));
  CHECK(window_closed(s, 0, 90'000));
  CHECK_FALSE(window_expired(s, 0, 60'000 + 3'600'000 - 1));
  CHECK(window_expired(s, 0, 60'000 + 3'600'000));
  for (int64_t t : {0LL, 5'000'000LL, 123'456'789LL}) {
    const int64_t first = first_live_start(s, t);
    CHECK_FALSE(window_expired(s, first, t));
    CHECK(window_expired(s, first - 1, t));
  }
}

TEST_CASE("window arithmetic holds up to the largest event time") {
  // A record may carry any non-negative int64 as its event time. Stepping past the last
  // start used to overflow and loop without end (memory growing until the process died,
  // at every restart); ends past the int64 range wrapped into the past and closed.
  constexpr int64_t max = std::numeric_limits<int64_t>::max();
  const auto tumbling = spec(window_type::tumbling, 60'000, 0, 30'000, 3'600'000);
  CHECK(window_starts(tumbling, max - 10) == std::vector<int64_t>{9'223'372'036'854'720'000});
  CHECK(window_starts(tumbling, max) == std::vector<int64_t>{9'223'372'036'854'720'000});
  // Six 1-minute windows advancing by 10 s contain the largest time; the last starts at
  // the multiple of 10 s at or below it.
  const auto hopping = spec(window_type::hopping, 60'000, 10'000);
  const std::vector<int64_t> expected{9'223'372'036'854'720'000, 9'223'372'036'854'730'000, 9'223'372'036'854'740'000,
                                      9'223'372'036'854'750'000, 9'223'372'036'854'760'000, 9'223'372'036'854'770'000};
  CHECK(window_starts(hopping, max) == expected);

  // A window whose end + grace lies past the int64 range never closes.
  const int64_t late = 9'223'372'036'854'720'000;
  CHECK_FALSE(window_closed(tumbling, late, 0));
  CHECK_FALSE(window_closed(tumbling, late, max));
  CHECK_FALSE(window_expired(tumbling, late, max));
  CHECK_FALSE(window_closed(tumbling, max - 90'000, max - 1));
  CHECK(window_closed(tumbling, max - 90'000, max));
  CHECK(first_live_start(tumbling, std::numeric_limits<int64_t>::min() + 5) == std::numeric_limits<int64_t>::min());
}

TEST_CASE("window specs are validated with the offending field named") {
  struct row {
    window_type type;
    int64_t size, advance, grace, retention;
    const char* field;
  };
  const row rows[] = {
      {window_type::tumbling, 0, 0, 0, 0, "size"},
      {window_type::tumbling, 60'000, 10'000, 0, 0, "advance"},
      {window_type::hopping, 60'000, 0, 0, 0, "advance"},
      {window_type::hopping, 60'000, 70'000, 0, 0, "advance"},
      {window_type::tumbling, 60'000, 0, -1, 0, "grace"},
      {window_type::tumbling, 60'000, 0, 30'000, 80'000, "retention"},
      // At most 100 years each, so that size + grace + retention cannot overflow.
      {window_type::tumbling, std::numeric_limits<int64_t>::max(), 0, 1, 0, "size"},
      {window_type::hopping, 60'000, std::numeric_limits<int64_t>::max(), 0, 0, "advance"},
      {window_type::tumbling, 60'000, 0, std::numeric_limits<int64_t>::max(), 0, "grace"},
      {window_type::tumbling, 60'000, 0, 0, 3'155'760'000'001, "retention"},
  };
  for (const auto& r : rows) {
    window_spec s;
    s.type = r.type;
    s.size_ms = r.size;
    s.advance_ms = r.advance;
    s.grace_ms = r.grace;
    s.retention_ms = r.retention;
    const status st = normalize(s);
    CAPTURE(r.field);
    REQUIRE_FALSE(st.ok());
    CHECK(st.message().rfind(r.field, 0) == 0);
  }
  window_spec s;
  s.size_ms = 60'000;
  REQUIRE(normalize(s).ok());
  CHECK(s.advance_ms == 60'000);
  CHECK(s.retention_ms == 24LL * 3600 * 1000);
}

TEST_CASE("event times more than max_future ahead of the clock are refused, at the boundary and far out") {
  window_spec s;
  s.size_ms = 60'000;
  REQUIRE(normalize(s).ok());
  CHECK(s.max_future_ms == 86'400'000);   // the default: one day
  const int64_t now = 1'796'292'000'000;  // 2026-12-03T10:00:00Z
  CHECK_FALSE(beyond_max_future(s, now, now));
  CHECK_FALSE(beyond_max_future(s, now - 1'000'000'000, now));  // the past is never refused
  CHECK_FALSE(beyond_max_future(s, now + 86'400'000, now));     // exactly max_future ahead
  CHECK(beyond_max_future(s, now + 86'400'001, now));           // one ms more
  CHECK(beyond_max_future(s, 253'402'214'400'000, now));        // 9999-12-31T00:00:00Z
  CHECK(beyond_max_future(s, INT64_MAX, now));                  // no overflow at the extreme
  CHECK_FALSE(beyond_max_future(s, INT64_MIN, now));
  s.max_future_ms = 0;
  CHECK_FALSE(beyond_max_future(s, now, now));
  CHECK(beyond_max_future(s, now + 1, now));
  s.max_future_ms = INT64_MAX;
  CHECK_FALSE(beyond_max_future(s, INT64_MAX, 0));
  s.max_future_ms = -1;
  const status st = normalize(s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().rfind("max_future", 0) == 0);
}

TEST_CASE("durations parse with their units") {
  CHECK(parse_duration_ms("250ms").value() == 250);
  CHECK(parse_duration_ms("10s").value() == 10'000);
  CHECK(parse_duration_ms("1m").value() == 60'000);
  CHECK(parse_duration_ms("24h").value() == 86'400'000);
  CHECK(parse_duration_ms("7d").value() == 604'800'000);
  CHECK(parse_duration_ms("1500").value() == 1500);
  for (const char* bad : {"", "m", "1.5m", "-1s", "10 s", "1w", "99999999999999999999d"})
    CHECK_FALSE(parse_duration_ms(bad).ok());
}

TEST_CASE("timestamps parse from epoch ms and ISO-8601 and format back") {
  // Expected values computed with Python's datetime.fromisoformat(...).timestamp().
  CHECK(parse_timestamp_ms("2026-12-02T10:00:00Z").value() == 1'796'205'600'000);
  CHECK(parse_timestamp_ms("2026-12-02T11:00:00.250+01:00").value() == 1'796'205'600'250);
  CHECK(parse_timestamp_ms("1970-01-01T00:00:00Z").value() == 0);
  CHECK(parse_timestamp_ms("2024-02-29T23:59:59.999-05:30").value() == 1'709'270'999'999);
  CHECK(parse_timestamp_ms("1969-12-31T23:59:59.999Z").value() == -1);
  CHECK(parse_timestamp_ms("1796205600000").value() == 1'796'205'600'000);
  for (const char* bad : {"", "now", "2026-12-02", "2026-12-02T10:00:00", "2026-02-30T10:00:00Z",
                          "2026-12-02T25:00:00Z", "2026-12-02T10:00:00.Z", "2026-12-02T10:00:00+0100"})
    CHECK_FALSE(parse_timestamp_ms(bad).ok());

  CHECK(format_timestamp_ms(1'796'205'600'250) == "2026-12-02T10:00:00.250Z");
  CHECK(format_timestamp_ms(-1) == "1969-12-31T23:59:59.999Z");
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1000; ++i) {
    const int64_t ms = static_cast<int64_t>(rng() % 8'000'000'000'000ULL) - 1'000'000'000'000LL;
    CHECK(parse_timestamp_ms(format_timestamp_ms(ms)).value() == ms);
  }
}

TEST_CASE("timestamps outside years 0000-9999 format to their true date, expanded") {
  // Event times come from records, so any int64 reaches format_timestamp_ms (it wrapped
  // years past 32767 and overflowed near INT64_MIN). Expected dates computed with
  // Python's datetime, moved into its range by whole 400-year cycles of 146097 days;
  // the expanded form is JavaScript's toISOString().
  CHECK(format_timestamp_ms(253'402'300'799'999) == "9999-12-31T23:59:59.999Z");
  CHECK(format_timestamp_ms(253'402'300'800'000) == "+010000-01-01T00:00:00.000Z");
  CHECK(format_timestamp_ms(1'000'000'000'000'000) == "+033658-09-27T01:46:40.000Z");
  CHECK(format_timestamp_ms(8'640'000'000'000'000) == "+275760-09-13T00:00:00.000Z");
  CHECK(format_timestamp_ms(-62'167'219'200'000) == "0000-01-01T00:00:00.000Z");
  CHECK(format_timestamp_ms(-62'167'219'200'001) == "-000001-12-31T23:59:59.999Z");
  CHECK(format_timestamp_ms(std::numeric_limits<int64_t>::max()) == "+292278994-08-17T07:12:55.807Z");
  CHECK(format_timestamp_ms(std::numeric_limits<int64_t>::min()) == "-292275055-05-16T16:47:04.192Z");
}

TEST_CASE("windowed keys sort by key bytes, then start, and round-trip") {
  std::mt19937_64 rng(3);
  std::vector<std::pair<std::string, int64_t>> pairs;
  const char alphabet[] = {'\0', '\x01', '\xff', 'a', 'b'};
  for (int i = 0; i < 3000; ++i) {
    std::string k;
    const size_t len = rng() % 5;
    for (size_t j = 0; j < len; ++j) k.push_back(alphabet[rng() % sizeof alphabet]);
    const int64_t start = static_cast<int64_t>(rng() % 2000) - 1000;
    pairs.emplace_back(k, start);
  }
  std::vector<std::string> encoded;
  for (const auto& [k, s] : pairs) {
    encoded.push_back(encode_windowed_key(k, s));
    const auto back = decode_windowed_key(encoded.back());
    REQUIRE(back.has_value());
    CHECK(back->key == k);
    CHECK(back->start == s);
    CHECK(encoded.back().rfind(windowed_key_prefix(k), 0) == 0);
  }
  // The model order: key bytes as unsigned, then start.
  auto bytes_less = [](const std::string& a, const std::string& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return static_cast<unsigned char>(x) < static_cast<unsigned char>(y);
    });
  };
  std::vector<size_t> by_model(pairs.size()), by_encoding(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) by_model[i] = by_encoding[i] = i;
  std::stable_sort(by_model.begin(), by_model.end(), [&](size_t a, size_t b) {
    if (pairs[a].first != pairs[b].first) return bytes_less(pairs[a].first, pairs[b].first);
    return pairs[a].second < pairs[b].second;
  });
  std::stable_sort(by_encoding.begin(), by_encoding.end(),
                   [&](size_t a, size_t b) { return bytes_less(encoded[a], encoded[b]); });
  CHECK(by_model == by_encoding);

  // Keys in [from, to) are exactly the encoded keys in [prefix(from), prefix(to)).
  for (int i = 0; i < 200; ++i) {
    const auto& from = pairs[rng() % pairs.size()].first;
    const auto& to = pairs[rng() % pairs.size()].first;
    const std::string lo = windowed_key_prefix(from), hi = windowed_key_prefix(to);
    for (size_t j = 0; j < pairs.size(); ++j) {
      const bool in_model = !bytes_less(pairs[j].first, from) && bytes_less(pairs[j].first, to);
      const bool in_encoded = !bytes_less(encoded[j], lo) && bytes_less(encoded[j], hi);
      CHECK(in_model == in_encoded);
    }
  }
  for (const char* bad : {"", "a", "a\0", "a\0\x01"}) CHECK_FALSE(decode_windowed_key(bad).has_value());
  CHECK_FALSE(decode_windowed_key(std::string("a\0\0\1", 4)).has_value());
}

TEST_CASE("guarded() returns what a body threw, described, and nothing when it returned") {
  CHECK_FALSE(guarded([] {}));
  CHECK(guarded([] { throw std::runtime_error("disk on fire"); }) == std::optional<std::string>("disk on fire"));
  CHECK(guarded([] { throw 42; }) == std::optional<std::string>("an exception that is not a std::exception"));
  int ran = 0;
  CHECK_FALSE(guarded([&] { ++ran; }));
  CHECK(ran == 1);
}

TEST_CASE(
    "a change_notifier subscriber that throws does not keep the others from hearing; the first error is rethrown") {
  change_notifier n;
  int heard = 0;
  n.subscribe([] { throw std::runtime_error("first"); });
  n.subscribe([&] { ++heard; });
  n.subscribe([] { throw std::logic_error("second"); });
  n.subscribe([&] { ++heard; });
  auto why = guarded([&] { n.notify(); });
  CHECK(why == std::optional<std::string>("first"));
  CHECK(heard == 2);
}

TEST_CASE("catch-up progress: offsets left to the target, the rate since the assignment, and the time left at it") {
  using namespace std::chrono_literals;
  const auto now = std::chrono::steady_clock::now();
  partition_state p;
  p.assigned = true;
  p.catch_up_target = 10'000;
  p.assigned_from = 1'000;
  p.assigned_at = now - 4s;
  p.applied = 3'000;  // 2,000 offsets in 4 s: 500/s, 7,000 left: 14 s
  auto c = catch_up(p, now);
  REQUIRE(c);
  CHECK(c->position == 3'000);
  CHECK(c->target == 10'000);
  CHECK(c->left == 7'000);
  CHECK(c->records_per_second == doctest::Approx(500));
  REQUIRE(c->eta_seconds);
  CHECK(*c->eta_seconds == doctest::Approx(14));

  // Nothing applied yet: no rate, no estimate.
  p.applied = 1'000;
  c = catch_up(p, now);
  REQUIRE(c);
  CHECK(c->left == 9'000);
  CHECK_FALSE(c->eta_seconds);

  // Ready, not assigned, or with an unknown target or position: not catching up.
  for (auto change :
       {+[](partition_state& s) { s.ready = true; }, +[](partition_state& s) { s.assigned = false; },
        +[](partition_state& s) { s.catch_up_target = -1; }, +[](partition_state& s) { s.applied = -1; }}) {
    partition_state q = p;
    change(q);
    CHECK_FALSE(catch_up(q, now));
  }

  // The registry stamps the assignment: where the partition resumed, and when.
  ownership_registry reg;
  reg.assign({{"t", 0, 500, false, 100}});
  auto s = reg.partition("t", 0);
  REQUIRE(s);
  CHECK(s->assigned_from == 100);
  CHECK(s->assigned_at <= std::chrono::steady_clock::now());
  reg.update_progress("t", 0, 300, 600);
  c = catch_up(*reg.partition("t", 0), std::chrono::steady_clock::now() + 1s);
  REQUIRE(c);
  CHECK(c->left == 200);
  REQUIRE(c->eta_seconds);
  CHECK(*c->eta_seconds > 0);
}

TEST_CASE("plain frames read as before; timed frames carry offset and time; short frames are refused") {
  // A plain frame is exactly the 8 big-endian offset bytes, as state written before
  // timed frames existed holds it.
  const std::string plain = std::string("\x00\x00\x00\x00\x00\x00\x01\x02", 8) + "v";
  REQUIRE(frame_value(258, "v") == plain);
  auto p = unframe_value(plain);
  REQUIRE(p);
  CHECK(p->offset == 258);
  CHECK(!p->time);
  CHECK(p->value == "v");

  for (int64_t offset : {int64_t{0}, int64_t{7}, std::numeric_limits<int64_t>::max()})
    for (int64_t time : {int64_t{-1}, int64_t{0}, int64_t{1'700'000'000'000}, std::numeric_limits<int64_t>::min()}) {
      auto framed = frame_value(offset, time, "value bytes");
      CHECK(framed.size() == 16 + 11);
      auto head = frame_header(offset, time);
      CHECK(framed.substr(0, 16) == std::string(head.data(), head.size()));
      auto f = unframe_value(framed);
      REQUIRE(f);
      CHECK(f->offset == offset);
      CHECK(f->time == time);
      CHECK(f->value == "value bytes");
    }
  CHECK(unframe_value(frame_value(3, 4, "")).value().value.empty());
  CHECK(!unframe_value("short"));
  // A timed frame cut short is not taken for a plain one.
  CHECK(!unframe_value(frame_value(3, 4, "").substr(0, 12)));
}

TEST_CASE("a value is served while now is before its time plus the ttl, and never overflows") {
  CHECK(!ttl_expired(1000, 500, 1499));
  CHECK(ttl_expired(1000, 500, 1500));
  CHECK(ttl_expired(1000, 500, 99'999));
  CHECK(!ttl_expired(1000, 500, -5));
  constexpr auto max = std::numeric_limits<int64_t>::max();
  CHECK(!ttl_expired(max - 10, 500, max));  // time + ttl is past the largest time
  CHECK(ttl_expired(std::numeric_limits<int64_t>::min(), 1, 0));
}

namespace {
// nlohmann's dump() refuses a string that is not valid UTF-8: the model.
bool utf8_model(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}
}  // namespace

TEST_CASE("valid_utf8 agrees with nlohmann on ASCII runs with sequences anywhere in them") {
  // Pieces: valid sequences of every length, and the invalid forms (overlong,
  // surrogate, past U+10FFFF, lone continuation, truncated), each at every offset of
  // an ASCII run longer than the eight-byte stride.
  const std::vector<std::string> pieces = {"\xc3\xa9",
                                           "\xe2\x82\xac",
                                           "\xf0\x9f\x98\x80",
                                           "\xf4\x8f\xbf\xbf",
                                           "\xc0\xaf",
                                           "\xe0\x80\xaf",
                                           "\xed\xa0\x80",
                                           "\xf4\x90\x80\x80",
                                           "\x80",
                                           "\xc3",
                                           "\xe2\x82",
                                           "\xff",
                                           std::string(1, '\0'),
                                           "\x7f"};
  std::size_t checked = 0;
  for (const auto& piece : pieces) {
    for (std::size_t at = 0; at <= 20; ++at) {
      for (std::size_t len : {std::size_t{0}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{24}}) {
        std::string s(at, 'a');
        s += piece;
        s += std::string(len, 'b');
        CAPTURE(s);
        CHECK(valid_utf8(s) == utf8_model(s));
        ++checked;
      }
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int j = 0; j < n; ++j) {
      if (rng() % 8 == 0) s += pieces[rng() % pieces.size()];
      else s += static_cast<char>('a' + rng() % 26);
    }
    CAPTURE(s);
    CHECK(valid_utf8(s) == utf8_model(s));
    ++checked;
  }
  CHECK(checked > 20000);
}
