#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>

#include "core/value_codec.h"
#include "core/window.h"
#include "query/cursor.h"
#include "query/engine.h"
#include "query/freshness.h"
#include "query/key_format.h"

using namespace kstate;
using namespace kstate::query;

TEST_CASE("key formats decode to the bytes producers write") {
  CHECK(decode_key(key_format::string, "h\xc3\xa9", 128).value() == "h\xc3\xa9");
  CHECK_FALSE(decode_key(key_format::string, "\xc0\xaf", 128).ok());  // overlong '/'
  // LongSerializer: 8 bytes big-endian, two's complement.
  CHECK(decode_key(key_format::long_be, "1", 128).value() == std::string("\0\0\0\0\0\0\0\x01", 8));
  CHECK(decode_key(key_format::long_be, "-1", 128).value() == std::string(8, '\xff'));
  CHECK(decode_key(key_format::long_be, "258", 128).value() == std::string("\0\0\0\0\0\0\x01\x02", 8));
  for (const char* bad : {"", "1.5", "x", "99999999999999999999", " 1"})
    CHECK_FALSE(decode_key(key_format::long_be, bad, 128).ok());
  // JSON: compact, member order kept.
  CHECK(decode_key(key_format::json, R"({ "b": 1, "a": [1, 2] })", 128).value() == R"({"b":1,"a":[1,2]})");
  CHECK_FALSE(decode_key(key_format::json, "{", 128).ok());
}

TEST_CASE("json keys deeper than max_json_depth are invalid_argument, exactly past the limit") {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  CHECK(decode_key(key_format::json, nested(128), 128).value() == nested(128));
  auto deeper = decode_key(key_format::json, nested(129), 128);
  REQUIRE_FALSE(deeper.ok());
  CHECK(deeper.error().code() == status_code::invalid_argument);
  CHECK(deeper.error().message() == "key is nested deeper than max_json_depth (128) (key_format=json)");
  CHECK(decode_key(key_format::json, R"({"a":{"b":1}})", 2).value() == R"({"a":{"b":1}})");
  CHECK(decode_key(key_format::json, R"({"a":{"b":[]}})", 2).error().code() == status_code::invalid_argument);
  // Nested 100,000 deep: refused before it is parsed and printed again.
  auto deep = decode_key(key_format::json, nested(100'000), 128);
  REQUIRE_FALSE(deep.ok());
  CHECK(deep.error().code() == status_code::invalid_argument);
  // Other formats take such text as it is.
  CHECK(decode_key(key_format::string, nested(100'000), 128).value() == nested(100'000));
}

TEST_CASE("base64url: RFC 4648 test vectors, with and without padding; one spelling per key") {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},           {"f", "Zg"},          {"fo", "Zm8"},         {"foo", "Zm9v"},
      {"foob", "Zm9vYg"}, {"fooba", "Zm9vYmE"}, {"foobar", "Zm9vYmFy"}};
  for (auto [plain, enc] : vectors) {
    CHECK(base64url_encode(plain) == enc);
    CHECK(base64url_decode(enc).value() == plain);
  }
  CHECK(base64url_decode("Zg==").value() == "f");
  CHECK(base64url_encode("\xfb\xff") == "-_8");
  CHECK(base64url_decode("-_8").value() == "\xfb\xff");
  CHECK(base64_encode("\xfb\xff") == "+/8=");
  for (const char* bad : {"Z", "Zg=", "Z=g", "+/8", "Zh", "a b", "Zg==="}) {
    CAPTURE(bad);
    CHECK_FALSE(base64url_decode(bad).ok());
  }
}

TEST_CASE("cursors round-trip, and refuse damage or another query") {
  std::string key("k\0/\xff", 4);
  auto token = encode_cursor({key}, "query-1");
  auto back = decode_cursor(token, "query-1");
  REQUIRE(back.ok());
  CHECK(back->last_key == key);
  CHECK_FALSE(decode_cursor(token, "query-2").ok());
  for (size_t i = 0; i < token.size(); ++i) {
    std::string t = token;
    t[i] = t[i] == 'A' ? 'B' : 'A';
    CHECK_FALSE(decode_cursor(t, "query-1").ok());
  }
  CHECK_FALSE(decode_cursor(token.substr(0, token.size() - 2), "query-1").ok());
  CHECK_FALSE(decode_cursor("", "query-1").ok());
}

namespace {
// A store with keys spread over partitions as a partitioner would, all partitions
// assigned and ready, and a sorted model of it.
struct fixture {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kstate-query-" + std::to_string(std::random_device{}()));
  std::vector<view_def> views{view_def{.name = "s", .topic = "t", .key_format = data_format::bytes}};
  std::unique_ptr<storage::db> db;
  ownership_registry owner;
  std::map<std::string, std::string> model;
  std::unique_ptr<engine> q;
  static constexpr int partitions = 5;
  static int32_t part(std::string_view k, int32_t n) {
    return static_cast<int32_t>(std::hash<std::string_view>{}(k) % n);
  }

  fixture() {
    db = std::move(storage::db::open({.path = dir.string()}, {"s"}).value());
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> len(0, 6), byte(0, 255);
    auto b = db->new_batch();
    for (int i = 0; i < 2000; ++i) {
      std::string k;
      for (int j = len(rng); j > 0; --j) k.push_back(static_cast<char>(byte(rng) % 4 == 0 ? 0 : byte(rng)));
      std::string v = "v" + std::to_string(i);
      model[k] = v;
      b.put(0, part(k, partitions), k, frame_value(i, v));
    }
    for (int p = 0; p < partitions; ++p) b.set_position(0, p, 100 + p);
    REQUIRE(db->write(b).ok());
    owner.set_partition_count("t", partitions);
    std::vector<ownership_registry::assignment> all;
    for (int p = 0; p < partitions; ++p) all.push_back({"t", p, 0, true});
    owner.assign(all);
    q = std::make_unique<engine>(views, *db, owner, std::map<std::string, partitioner_fn>{{"s", &fixture::part}});
  }
  ~fixture() {
    q.reset();
    db.reset();
    std::filesystem::remove_all(dir);
  }
};
}  // namespace

TEST_CASE("ranges merge all partitions into one byte order, equal to a sorted model") {
  fixture f;
  std::vector<std::string> keys;
  for (auto& [k, v] : f.model) keys.push_back(k);
  std::mt19937 rng(2);
  std::uniform_int_distribution<size_t> any(0, keys.size() - 1);
  for (int t = 0; t < 200; ++t) {
    range_query rq{.store = "s"};
    if (t % 3) rq.from = keys[any(rng)];
    if (t % 5) rq.to = keys[any(rng)];
    if (t % 7 == 0) rq.prefix = keys[any(rng)].substr(0, 1);
    rq.descending = t % 2;
    std::vector<std::pair<std::string, std::string>> want;
    for (auto& [k, v] : f.model) {
      if (rq.from && k < *rq.from) continue;
      if (rq.to && !(k < *rq.to)) continue;
      if (rq.prefix && k.compare(0, rq.prefix->size(), *rq.prefix) != 0) continue;
      want.emplace_back(k, v);
    }
    if (rq.descending) std::reverse(want.begin(), want.end());
    // Pages of a limit from one key to more than all, resuming after the last key each
    // time; the stream of the same query gives the same entries.
    const size_t limit = std::array<size_t, 4>{1, 3, 50, 5000}[t % 4];
    std::vector<std::pair<std::string, std::string>> got, streamed;
    auto stream = f.q->open_range(rq, storage::scan_use::page);
    REQUIRE(stream.ok());
    std::vector<range_entry> batch;
    while (stream.answer()->next(batch, 64) || !batch.empty()) {
      for (auto& e : batch) streamed.emplace_back(e.key, e.value);
      batch.clear();
    }
    CHECK(streamed == want);
    for (;;) {
      auto page = f.q->range(rq, limit);
      REQUIRE(page.ok());
      CHECK(page.answer().entries.size() <= limit);
      for (auto& e : page.answer().entries) {
        got.emplace_back(e.key, e.value);
        CHECK(e.partition == fixture::part(e.key, fixture::partitions));
      }
      REQUIRE(page.answer().pos.size() == static_cast<size_t>(fixture::partitions));
      for (int32_t p = 0; p < fixture::partitions; ++p) CHECK(page.answer().pos.at(p) == 100 + p);
      if (!page.answer().more) break;
      rq.after = page.answer().entries.back().key;
    }
    CHECK(got == want);
  }
}

TEST_CASE("count, batch get and positions") {
  fixture f;
  auto c = f.q->count("s", 1'000'000);
  REQUIRE(c.ok());
  CHECK(c.answer().exact);
  CHECK(c.answer().count == f.model.size());
  auto approx = f.q->count("s", 0);
  REQUIRE(approx.ok());
  CHECK_FALSE(approx.answer().exact);

  std::vector<std::pair<int32_t, std::string>> keys;
  for (std::string k : {f.model.begin()->first, std::string("\xff\xff\xff\xff\xff\xff\xff-absent")})
    keys.emplace_back(f.q->locate("s", k)->second, k);
  auto b = f.q->get_many("s", keys);
  REQUIRE(b.ok());
  REQUIRE(b.answer().entries.size() == 2);
  CHECK(b.answer().entries[0].value == f.model.begin()->second);
  CHECK_FALSE(b.answer().entries[1].value);
  // The position of each partition asked, and of no other.
  for (const auto& [p, k] : keys) CHECK(b.answer().pos.at(p) == 100 + p);
  CHECK(b.answer().pos.size() == (keys[0].first == keys[1].first ? 1u : 2u));

  CHECK(f.q->reached("s", {{2, 101}}).answer() == true);  // position 102: offset 101 applied
  CHECK(f.q->reached("s", {{2, 102}}).answer() == false);
  CHECK(f.q->range({.store = "nope"}, 1).failure() == failure_reason::unknown_query_store);
}

TEST_CASE("a range over partitions not held here fails instead of answering partially") {
  fixture f;
  f.owner.revoke("t", 3);
  auto r = f.q->range({.store = "s"}, 10);
  CHECK(r.failure() == failure_reason::not_active);
  CHECK(f.q->count("s", 1'000'000).failure() == failure_reason::not_active);
}

TEST_CASE("from_copies: partitions not held current are read from the copy here, the page marked stale") {
  fixture f;
  auto all = [&](range_query rq) {
    std::map<std::string, std::string> got;
    bool stale = false;
    for (;;) {
      auto page = f.q->range(rq, 97);
      REQUIRE(page.ok());
      stale = stale || page.answer().stale;
      for (auto& e : page.answer().entries) got[e.key] = e.value;
      for (int32_t p = 0; p < fixture::partitions; ++p) CHECK(page.answer().pos.at(p) == 100 + p);
      if (!page.answer().more) break;
      rq.after = page.answer().entries.back().key;
    }
    return std::make_pair(got, stale);
  };
  // Held current everywhere: the same page as without copies, not stale.
  auto [fresh, fresh_stale] = all({.store = "s", .from_copies = true});
  CHECK(fresh == f.model);
  CHECK_FALSE(fresh_stale);
  // Partition 3 given up (its data and position stay: a copy), partition 1 catching up.
  f.owner.revoke("t", 3);
  f.owner.assign({{"t", 1, 0, false}});
  CHECK_FALSE(f.q->range({.store = "s"}, 10).ok());
  CHECK(f.q->has_copy("s", 3));
  auto [copied, copied_stale] = all({.store = "s", .from_copies = true});
  CHECK(copied == f.model);
  CHECK(copied_stale);
  // A peer's part of partitions 3 and 4: only 3 is from a copy.
  auto part = f.q->range({.store = "s", .partitions = std::vector<int32_t>{3, 4}, .from_copies = true}, 5000);
  REQUIRE(part.ok());
  CHECK(part.answer().stale);
  size_t want = 0;
  for (auto& [k, v] : f.model) want += fixture::part(k, fixture::partitions) >= 3;
  CHECK(part.answer().entries.size() == want);
  // A partition with no copy here (the topic grew a sixth, never stored here):
  // not_active, never a partial page.
  f.owner.set_partition_count("t", fixture::partitions + 1);
  CHECK_FALSE(f.q->has_copy("s", fixture::partitions));
  CHECK(f.q->range({.store = "s", .from_copies = true}, 10).failure() == failure_reason::not_active);
}

TEST_CASE("windows of a key range: key bytes then start across partitions, overlap and expiry, resumable") {
  auto dir = std::filesystem::temp_directory_path() / ("kstate-wrange-" + std::to_string(std::random_device{}()));
  view_def v{.name = "w", .kind = view_kind::count, .topic = "t", .key_format = data_format::bytes};
  v.window = window_spec{.type = window_type::tumbling, .size_ms = 10, .advance_ms = 10, .retention_ms = 40};
  constexpr int partitions = 4;
  auto part = [](std::string_view k, int32_t n) { return static_cast<int32_t>(std::hash<std::string_view>{}(k) % n); };
  {
    auto db = std::move(storage::db::open({.path = dir.string()}, {"w"}).value());
    // (key, start) -> value; keys with 0x00 and 0xff bytes and prefixes of each other.
    std::map<std::pair<std::string, int64_t>, std::string> stored;
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> len(0, 3), byte(0, 3), start(0, 30);
    const char alphabet[] = {'\0', 'a', '\xff', 'b'};
    auto b = db->new_batch();
    for (int i = 0; i < 600; ++i) {
      std::string k;
      for (int j = len(rng); j > 0; --j) k.push_back(alphabet[byte(rng)]);
      int64_t s = start(rng) * 10;
      std::string val = std::to_string(i);
      stored[{k, s}] = val;
      b.put(0, part(k, partitions), encode_windowed_key(k, s), frame_value(i, val));
    }
    // Stream time per partition: 300 except partition 1, which has seen nothing.
    std::map<int32_t, int64_t> stream_time;
    for (int p = 0; p < partitions; ++p) {
      b.set_position(0, p, 1000 + p);
      if (p == 1) continue;
      stream_time[p] = 300 - 20 * p;
      b.set_named_position(stream_time_position_name(v), p, stream_time[p]);
    }
    REQUIRE(db->write(b).ok());
    ownership_registry owner;
    owner.set_partition_count("t", partitions);
    std::vector<ownership_registry::assignment> all;
    for (int p = 0; p < partitions; ++p) all.push_back({"t", p, 0, true});
    owner.assign(all);
    engine q({v}, *db, owner, std::map<std::string, partitioner_fn>{{"w", part}});

    std::vector<std::string> keys;
    for (auto& [kw, val] : stored) keys.push_back(kw.first);
    std::uniform_int_distribution<size_t> any(0, keys.size() - 1);
    std::uniform_int_distribution<int64_t> t(0, 320);
    size_t nonempty = 0;
    for (int round = 0; round < 150; ++round) {
      window_range_query wq{.range = {.store = "w"}, .from = 0, .to = std::numeric_limits<int64_t>::max()};
      if (round % 3) wq.range.from = keys[any(rng)];
      if (round % 4) wq.range.to = keys[any(rng)];
      if (round % 5) {
        wq.from = t(rng);
        wq.to = wq.from + 1 + t(rng);
      }
      std::vector<std::tuple<std::string, int64_t, std::string, int32_t>> want, got;
      for (auto& [kw, val] : stored) {
        const auto& [k, s] = kw;
        int32_t p = part(k, partitions);
        if (wq.range.from && k < *wq.range.from) continue;
        if (wq.range.to && !(k < *wq.range.to)) continue;
        if (!(s < wq.to && s + 10 > wq.from)) continue;
        if (stream_time.count(p) && s + 10 + 40 <= stream_time[p]) continue;  // expired
        want.emplace_back(k, s, val, p);
      }
      for (int pages = 0;; ++pages) {
        REQUIRE(pages < 1000);
        auto page = q.window_range(wq, 4);
        REQUIRE(page.ok());
        CHECK(page.answer().entries.size() <= 4);
        CHECK(page.answer().pos.size() == static_cast<size_t>(partitions));
        for (auto& e : page.answer().entries) {
          got.emplace_back(e.key, e.window.start, e.window.value, e.partition);
          CHECK(e.window.end == e.window.start + 10);
          CHECK(e.stored_key == encode_windowed_key(e.key, e.window.start));
        }
        if (!page.answer().more) break;
        CHECK(page.answer().entries.size() == 4);
        wq.range.after = page.answer().entries.back().stored_key;
      }
      CHECK(got == want);
      nonempty += !want.empty();
    }
    CHECK(nonempty > 50);

    // Each key's windows, from the earliest time a client can name: every live window
    // (the lower bound of the scan used to overflow and come out past `to`).
    size_t keys_with_windows = 0;
    for (const std::string& k : std::set<std::string>(keys.begin(), keys.end())) {
      std::vector<int64_t> want_starts, got_starts;
      const int32_t p = part(k, partitions);
      for (auto& [kw, val] : stored)
        if (kw.first == k && !(stream_time.count(p) && kw.second + 10 + 40 <= stream_time[p]))
          want_starts.push_back(kw.second);
      auto one = q.windows({.store = "w",
                            .key = k,
                            .from = std::numeric_limits<int64_t>::min() + 1,
                            .to = std::numeric_limits<int64_t>::max()});
      REQUIRE(one.ok());
      for (auto& win : one.answer().windows) got_starts.push_back(win.start);
      CHECK(got_starts == want_starts);
      keys_with_windows += !want_starts.empty();
    }
    CHECK(keys_with_windows > 10);

    // Only some partitions (a scatter-gather part).
    window_range_query part1{.range = {.store = "w", .partitions = std::vector<int32_t>{1}}, .from = 0, .to = 1000};
    auto only = q.window_range(part1, 1000);
    REQUIRE(only.ok());
    for (auto& e : only.answer().entries) CHECK(e.partition == 1);
    CHECK(only.answer().pos.size() == 1);
    // Non-windowed and unknown stores fail.
    CHECK(q.window_range({.range = {.store = "nope"}, .to = 10}, 1).failure() == failure_reason::unknown_query_store);
    owner.revoke("t", 2);
    CHECK(q.window_range({.range = {.store = "w"}, .to = 10}, 1).failure() == failure_reason::not_active);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("sessions of a key and of a key range: overlap by start and last + 1, expired ones never answered") {
  auto dir = std::filesystem::temp_directory_path() / ("kstate-sessions-" + std::to_string(std::random_device{}()));
  view_def v{.name = "s", .kind = view_kind::count, .topic = "t"};
  v.window = window_spec{.type = window_type::session, .gap_ms = 5, .retention_ms = 100};
  REQUIRE(normalize(*v.window).ok());
  auto part = [](std::string_view, int32_t) { return int32_t{0}; };
  {
    auto db = std::move(storage::db::open({.path = dir.string()}, {"s"}).value());
    // Per key: live sessions (last + retention >= stream time 1000), which never overlap,
    // and expired ones (last < 900) anywhere, also inside the live ones' span, as a
    // session no record joined after it expired leaves them until compaction.
    struct stored {
      std::string key;
      int64_t start, last;
      std::string value;
    };
    std::vector<stored> all;
    std::map<std::pair<std::string, int64_t>, size_t> by_key;  // at most one session per stored key
    std::mt19937 rng(9);
    auto b = db->new_batch();
    auto add = [&](const std::string& k, int64_t start, int64_t last) {
      if (!by_key.emplace(std::make_pair(k, start), all.size()).second) return;
      all.push_back({k, start, last, std::to_string(all.size())});
      b.put(0, 0, encode_windowed_key(k, start), frame_value(static_cast<int64_t>(all.size()), last, all.back().value));
    };
    for (int k = 0; k < 30; ++k) {
      const std::string key = "k" + std::to_string(k);
      for (int64_t at = 700 + static_cast<int64_t>(rng() % 100); at < 1000;) {
        const int64_t last = at + static_cast<int64_t>(rng() % 40);
        add(key, at, last);
        at = last + 6 + static_cast<int64_t>(rng() % 30);
      }
      for (int i = 0; i < 3; ++i) {
        const int64_t start = 750 + static_cast<int64_t>(rng() % 140);
        add(key, start, std::min<int64_t>(899, start + static_cast<int64_t>(rng() % 20)));
      }
    }
    b.set_position(0, 0, 1);
    b.set_named_position(stream_time_position_name(v), 0, 1000);
    REQUIRE(db->write(b).ok());
    ownership_registry owner;
    owner.set_partition_count("t", 1);
    owner.assign({{"t", 0, 0, true}});
    engine q({v}, *db, owner, std::map<std::string, partitioner_fn>{{"s", part}});

    size_t nonempty = 0;
    for (int round = 0; round < 300; ++round) {
      const int64_t from = 600 + static_cast<int64_t>(rng() % 450);
      const int64_t to = from + 1 + static_cast<int64_t>(rng() % 120);
      const std::string key = "k" + std::to_string(rng() % 30);
      std::vector<std::tuple<int64_t, int64_t, std::string>> want, got;
      for (const auto& [kw, i] : by_key) {
        const auto& s = all[i];
        if (s.key == key && s.last + 100 >= 1000 && s.start < to && s.last + 1 > from)
          want.emplace_back(s.start, s.last + 1, s.value);
      }
      auto one = q.windows({.store = "s", .key = key, .from = from, .to = to});
      REQUIRE(one.ok());
      CHECK(one.answer().stream_time == 1000);
      for (const auto& w : one.answer().windows) got.emplace_back(w.start, w.end, w.value);
      CAPTURE(key);
      CAPTURE(from);
      CAPTURE(to);
      CHECK(got == want);
      nonempty += !want.empty();

      // The same interval over every key, in pages of 3.
      std::vector<std::tuple<std::string, int64_t, int64_t>> want_all, got_all;
      for (const auto& [kw, i] : by_key) {
        const auto& s = all[i];
        if (s.last + 100 >= 1000 && s.start < to && s.last + 1 > from)
          want_all.emplace_back(s.key, s.start, s.last + 1);
      }
      window_range_query wq{.range = {.store = "s"}, .from = from, .to = to};
      for (int pages = 0;; ++pages) {
        REQUIRE(pages < 1000);
        auto page = q.window_range(wq, 3);
        REQUIRE(page.ok());
        for (auto& e : page.answer().entries) got_all.emplace_back(e.key, e.window.start, e.window.end);
        if (!page.answer().more) break;
        wq.range.after = page.answer().entries.back().stored_key;
      }
      CHECK(got_all == want_all);
    }
    CHECK(nonempty > 50);
  }
  std::filesystem::remove_all(dir);
}

namespace {
// Answers of min_position waits, as a request handler would collect them.
struct answers {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<wait_outcome> got;
  freshness_waiter::callback collect() {
    return [this](wait_outcome outcome) {
      std::lock_guard lock(mu);
      got.push_back(outcome);
      cv.notify_all();
    };
  }
  // Waits until `n` answers came (generously), and returns them.
  std::vector<wait_outcome> wait_for(size_t n) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(120), [&] { return got.size() >= n; });
    return got;
  }
};
}  // namespace

TEST_CASE("freshness waiter: a callback that throws is logged; every other wait is answered, and waiting goes on") {
  fixture f;
  change_notifier notifier;
  // Another subscriber of the writer's notifier, ahead of the waiter, that throws.
  notifier.subscribe([] { throw std::runtime_error("subscriber failed on purpose"); });
  freshness_waiter waiter(*f.q, notifier);
  using clock = freshness_waiter::clock;
  answers a;
  int thrown = 0;  // touched by the waiter's thread only, read after its answers
  // Partition 2 stands at 102: offset 102 is not applied yet.
  CHECK(waiter.wait("s", {{2, 102}}, clock::now() + std::chrono::milliseconds(100), 0, [&](wait_outcome) {
    ++thrown;
    throw std::runtime_error("callback failed on purpose");
  }));
  CHECK(waiter.wait("s", {{2, 102}}, clock::now() + std::chrono::milliseconds(100), 0, a.collect()));
  CHECK(a.wait_for(1) == std::vector{wait_outcome::timed_out});  // deadline passed, answered despite the other
  CHECK(thrown == 1);

  // The subscriber that throws does not keep the waiter from hearing of a write.
  CHECK(waiter.wait("s", {{2, 102}}, clock::now() + std::chrono::seconds(120), 0, a.collect()));
  auto b = f.db->new_batch();
  b.set_position(0, 2, 103);
  REQUIRE(f.db->write(b).ok());
  CHECK_THROWS_AS(notifier.notify(), std::runtime_error);
  CHECK(a.wait_for(2) == std::vector{wait_outcome::timed_out, wait_outcome::reached});
  CHECK(waiter.pending() == 0);
}

TEST_CASE("a store with a ttl answers, pages and counts only the keys live at the clock, as a model says") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kstate-query-ttl-" + std::to_string(std::random_device{}()));
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  storage::db_options o{.path = dir.string()};
  o.ttl_ms = {{"s", 1000}};
  o.clock = [now] { return now->load(); };
  o.verify_files_interval_ms = 0;
  std::vector<view_def> views{view_def{
      .name = "s", .topic = "t", .key_format = data_format::bytes, .ttl = ttl_spec{1000, ttl_clock::record_time}}};
  constexpr int partitions = 4;
  auto part = [](std::string_view k, int32_t n) { return static_cast<int32_t>(std::hash<std::string_view>{}(k) % n); };
  // key -> (time, value); times spread over [0, 4000).
  std::map<std::string, std::pair<int64_t, std::string>> model;
  {
    auto db = std::move(storage::db::open(o, {"s"}).value());
    std::mt19937 rng(9);
    auto b = db->new_batch();
    for (int i = 0; i < 1500; ++i) {
      std::string k = "key-" + std::to_string(rng() % 100'000);
      const int64_t t = static_cast<int64_t>(rng() % 4000);
      const std::string v = "v" + std::to_string(i);
      model[k] = {t, v};
      b.put(0, part(k, partitions), k, frame_value(i, t, v));
    }
    for (int p = 0; p < partitions; ++p) b.set_position(0, p, 10);
    REQUIRE(db->write(b).ok());
    ownership_registry owner;
    owner.set_partition_count("t", partitions);
    std::vector<ownership_registry::assignment> all;
    for (int p = 0; p < partitions; ++p) all.push_back({"t", p, 0, true});
    owner.assign(all);
    engine q(views, *db, owner, std::map<std::string, partitioner_fn>{{"s", part}});

    for (int64_t at : {int64_t{0}, int64_t{1700}, int64_t{2900}, int64_t{5000}}) {
      CAPTURE(at);
      now->store(at);
      std::vector<std::pair<std::string, std::string>> live;  // in key order
      for (const auto& [k, tv] : model)
        if (at < tv.first + 1000) live.emplace_back(k, tv.second);

      // Lookups, one by one and as a batch.
      std::vector<std::pair<int32_t, std::string>> located;
      size_t served = 0;
      for (const auto& [k, tv] : model) {
        auto a = q.get(key_query{.store = "s", .key = k});
        REQUIRE(a.ok());
        CHECK(a.answer().value.has_value() == (at < tv.first + 1000));
        served += a.answer().value.has_value();
        located.emplace_back(part(k, partitions), k);
      }
      CHECK(served == live.size());
      auto many = q.get_many("s", located);
      REQUIRE(many.ok());
      size_t i = 0;
      for (const auto& [k, tv] : model) {
        const auto& e = many.answer().entries[i++];
        CHECK(e.value == (at < tv.first + 1000 ? std::optional<std::string>(tv.second) : std::nullopt));
      }

      // Pages of 97 in both orders, resumed after their last key, and one streamed range.
      for (bool desc : {false, true}) {
        std::vector<std::pair<std::string, std::string>> paged;
        range_query rq{.store = "s", .descending = desc};
        for (;;) {
          auto page = q.range(rq, 97);
          REQUIRE(page.ok());
          for (const auto& e : page.answer().entries) paged.emplace_back(e.key, e.value);
          if (!page.answer().more) break;
          rq.after = page.answer().entries.back().key;
        }
        auto want = live;
        if (desc) std::reverse(want.begin(), want.end());
        CHECK(paged == want);
      }
      auto stream = q.open_range(range_query{.store = "s"}, storage::scan_use::sweep);
      REQUIRE(stream.ok());
      std::vector<range_entry> streamed;
      while (stream.answer()->next(streamed, 100)) {
      }
      std::vector<std::pair<std::string, std::string>> swept;
      for (const auto& e : streamed) swept.emplace_back(e.key, e.value);
      CHECK(swept == live);

      auto exact = q.count("s", 1'000'000);
      REQUIRE(exact.ok());
      CHECK(exact.answer().exact);
      CHECK(exact.answer().count == live.size());
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a versioned store answers lookups, version lists and pages as of any time kept, as a model says") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kstate-query-versioned-" + std::to_string(std::random_device{}()));
  constexpr int64_t history = 2000;
  storage::db_options o{.path = dir.string()};
  o.versioned["s"] = storage::versioned_store{history, "s#stream_time"};
  o.verify_files_interval_ms = 0;
  std::vector<view_def> views{
      view_def{.name = "s", .topic = "t", .key_format = data_format::bytes, .versioned = versioned_spec{history, 0}}};
  constexpr int partitions = 4;
  auto part = [](std::string_view k, int32_t n) { return static_cast<int32_t>(std::hash<std::string_view>{}(k) % n); };
  // key -> timestamp -> value (nullopt: a tombstone). Timestamps in [0, 3000): most
  // arrive out of order, none is too late (the history is 2000 and the first record of
  // each partition comes at once).
  std::map<std::string, std::map<int64_t, std::optional<std::string>>> model;
  std::map<int32_t, int64_t> stream;
  {
    auto db = std::move(storage::db::open(o, {"s"}).value());
    std::mt19937 rng(21);
    auto b = db->new_batch();
    for (int i = 0; i < 2000; ++i) {
      std::string k = "key-" + std::to_string(rng() % 300);
      const int64_t t = 1000 + static_cast<int64_t>(rng() % 2000);
      std::optional<std::string> v;
      if (rng() % 5 != 0) v = "v" + std::to_string(i);
      const int32_t p = part(k, partitions);
      stream[p] = std::max(stream[p], t);
      model[k][t] = v;
      b.put_version(0, p, k, t, i, v ? std::optional<std::string_view>(*v) : std::nullopt);
    }
    for (int p = 0; p < partitions; ++p) b.set_position(0, p, 2000);
    REQUIRE(db->write(b).ok());
    ownership_registry owner;
    owner.set_partition_count("t", partitions);
    std::vector<ownership_registry::assignment> all;
    for (int p = 0; p < partitions; ++p) all.push_back({"t", p, 0, true});
    owner.assign(all);
    engine q(views, *db, owner, std::map<std::string, partitioner_fn>{{"s", part}});
    int64_t start = INT64_MIN;  // the latest history start of all partitions
    for (const auto& [p, st] : stream) start = std::max(start, st - history);

    auto at = [&](const std::string& k, int64_t t) -> std::optional<std::string> {
      auto& vs = model[k];
      auto it = vs.upper_bound(t);
      if (it == vs.begin()) return std::nullopt;
      return std::prev(it)->second;
    };
    for (int64_t t : {start, start + 400, int64_t{2500}, int64_t{2999}, int64_t{4000}}) {
      CAPTURE(t);
      std::vector<std::pair<std::string, std::string>> live;  // in key order
      for (const auto& [k, vs] : model)
        if (auto v = at(k, t)) live.emplace_back(k, *v);
      for (const auto& [k, vs] : model) {
        auto a = q.get(key_query{.store = "s", .key = k, .as_of = t});
        REQUIRE(a.ok());
        CHECK(a.answer().value == at(k, t));
      }
      for (bool desc : {false, true}) {
        std::vector<std::pair<std::string, std::string>> paged;
        range_query rq{.store = "s", .descending = desc, .as_of = t};
        for (;;) {
          auto page = q.range(rq, 13);
          REQUIRE(page.ok());
          for (const auto& e : page.answer().entries) paged.emplace_back(e.key, e.value);
          if (!page.answer().more) break;
          rq.after = page.answer().entries.back().key;
        }
        auto want = live;
        if (desc) std::reverse(want.begin(), want.end());
        CHECK(paged == want);
      }
      auto stream_page = q.open_range(range_query{.store = "s", .as_of = t}, storage::scan_use::sweep);
      REQUIRE(stream_page.ok());
      std::vector<range_entry> streamed;
      while (stream_page.answer()->next(streamed, 100)) {
      }
      std::vector<std::pair<std::string, std::string>> swept;
      for (const auto& e : streamed) swept.emplace_back(e.key, e.value);
      CHECK(swept == live);
      // A batch of every key (and one never written) as of t: each key's value then, or
      // absent; the count is the keys live then, summed the same over partition subsets.
      std::vector<std::pair<int32_t, std::string>> located;
      for (const auto& [k, vs] : model) located.emplace_back(part(k, partitions), k);
      located.emplace_back(part("never", partitions), "never");
      auto batch = q.get_many("s", located, t);
      REQUIRE(batch.ok());
      REQUIRE(batch.answer().entries.size() == located.size());
      for (size_t i = 0; i < located.size(); ++i) {
        CAPTURE(located[i].second);
        CHECK(batch.answer().entries[i].value ==
              (located[i].second == "never" ? std::nullopt : at(located[i].second, t)));
      }
      auto counted = q.count("s", 1'000'000, std::nullopt, t);
      REQUIRE(counted.ok());
      CHECK(counted.answer().exact);
      CHECK(counted.answer().count == live.size());
      uint64_t in_parts = 0;
      for (std::vector<int32_t> subset : {std::vector<int32_t>{0, 2}, std::vector<int32_t>{1, 3}}) {
        auto c = q.count("s", 1'000'000, subset, t);
        REQUIRE(c.ok());
        in_parts += c.answer().count;
      }
      CHECK(in_parts == live.size());
    }
    // Without as_of, the batch answers the latest values, as before.
    {
      std::vector<std::pair<int32_t, std::string>> located;
      for (const auto& [k, vs] : model) located.emplace_back(part(k, partitions), k);
      auto latest = q.get_many("s", located);
      REQUIRE(latest.ok());
      for (size_t i = 0; i < located.size(); ++i)
        CHECK(latest.answer().entries[i].value == at(located[i].second, 4000));
    }
    // A count as of a time over a store beyond the exact limit would scan it all: refused.
    auto too_many = q.count("s", 10, std::nullopt, start);
    REQUIRE_FALSE(too_many.ok());
    CHECK(too_many.failure() == failure_reason::too_many_keys);
    // Version lists, newest first, the latest one open-ended.
    for (const auto& [k, vs] : model) {
      auto a = q.versions(version_query{.store = "s", .key = k, .from = 0, .to = INT64_MAX, .limit = 1000});
      REQUIRE(a.ok());
      const int64_t kept_from = *a.answer().history_start;
      std::vector<int64_t> want;
      for (auto it = vs.rbegin(); it != vs.rend(); ++it) {
        want.push_back(it->first);
        if (it->first <= kept_from) break;  // the one valid at the history start is the oldest kept
      }
      std::vector<int64_t> got;
      for (const auto& e : a.answer().versions) got.push_back(e.valid_from);
      CHECK(got == want);
      if (!a.answer().versions.empty()) CHECK_FALSE(a.answer().versions.front().valid_to.has_value());
    }
    // Before the history: unknown, never "absent".
    auto gone = q.get(key_query{.store = "s", .key = model.begin()->first, .as_of = start - 2 * history});
    REQUIRE_FALSE(gone.ok());
    CHECK(gone.failure() == failure_reason::history_unavailable);
    auto gone_page = q.range(range_query{.store = "s", .as_of = start - 2 * history}, 10);
    REQUIRE_FALSE(gone_page.ok());
    CHECK(gone_page.failure() == failure_reason::history_unavailable);
    auto gone_batch =
        q.get_many("s", {{part(model.begin()->first, partitions), model.begin()->first}}, start - 2 * history);
    REQUIRE_FALSE(gone_batch.ok());
    CHECK(gone_batch.failure() == failure_reason::history_unavailable);
    auto gone_count = q.count("s", 1'000'000, std::nullopt, start - 2 * history);
    REQUIRE_FALSE(gone_count.ok());
    CHECK(gone_count.failure() == failure_reason::history_unavailable);
  }
  std::filesystem::remove_all(dir);
}
