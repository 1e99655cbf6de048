// Versioned views: placement of versions (out of order, tombstones, too late), as-of
// reads, version lists, as-of cursors, compaction and copies, each against a model.

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "core/value_codec.h"
#include "storage/db.h"

using namespace kstate::storage;

namespace {

struct versions_dir {
  std::filesystem::path path;
  versions_dir() {
    path = std::filesystem::temp_directory_path() / ("kstate-versions-" + std::to_string(std::random_device{}()));
    std::filesystem::remove_all(path);
  }
  ~versions_dir() { std::filesystem::remove_all(path); }
};

constexpr int64_t history = 1000;

db_options versioned_options(const std::string& path) {
  db_options o{.path = path};
  o.versioned["t"] = versioned_store{history, "t#stream_time"};
  return o;
}

// What a versioned view must answer: per (partition, key), every placed version by
// valid_from (nullopt: a tombstone), and per partition the stream time.
struct model {
  std::map<std::pair<int32_t, std::string>, std::map<int64_t, std::optional<std::string>>> versions;
  std::map<int32_t, int64_t> stream;
  uint64_t late = 0;

  void put(int32_t p, const std::string& k, int64_t ts, std::optional<std::string> v) {
    auto st = stream.find(p);
    if (st != stream.end() && ts < st->second - history) {
      ++late;
      return;
    }
    stream[p] = st == stream.end() ? ts : std::max(st->second, ts);
    versions[{p, k}][ts] = std::move(v);
  }
  int64_t start(int32_t p) const { return stream.at(p) - history; }
  // (valid_from, valid_to or nullopt, value or nullopt) of the version valid at t.
  struct answer {
    int64_t from;
    std::optional<int64_t> to;
    std::optional<std::string> value;
  };
  std::optional<answer> at(int32_t p, const std::string& k, int64_t t) const {
    auto it = versions.find({p, k});
    if (it == versions.end()) return std::nullopt;
    auto v = it->second.upper_bound(t);
    if (v == it->second.begin()) return std::nullopt;
    std::optional<int64_t> to;
    if (v != it->second.end()) to = v->first;
    --v;
    return answer{v->first, to, v->second};
  }
  // Versions valid at some time in [from, to) ending after `not_before`, newest first.
  std::vector<answer> between(int32_t p, const std::string& k, int64_t from, int64_t to, int64_t not_before) const {
    std::vector<answer> out;
    auto it = versions.find({p, k});
    if (it == versions.end()) return out;
    for (auto v = it->second.begin(); v != it->second.end(); ++v) {
      auto n = std::next(v);
      std::optional<int64_t> end;
      if (n != it->second.end()) end = n->first;
      if (v->first < to && (!end || (*end > from && *end > not_before))) out.push_back({v->first, end, v->second});
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
};

std::string value_of(const std::optional<std::string>& stored) {
  if (!stored) return "<none>";
  auto f = kstate::unframe_value(*stored);
  return f ? std::string(f->value) : "<bad frame>";
}

// Keys that share prefixes and hold zero bytes: the escaping must keep them apart and in order.
const std::vector<std::string> keys = {
    "a", std::string("a\0", 2), std::string("a\0b", 3), "ab", "b", std::string("\0", 1), "\xff", "k1", "k10", "k2"};

// Writes `n` random records (timestamps out of order, some tombstones, some too late) in
// batches of random size, into the db and the model alike.
void write_random(db& d, view_id t, model& m, std::mt19937& rng, int n, int64_t& offset, int64_t base) {
  std::uniform_int_distribution<int> batch_size(1, 20), key(0, static_cast<int>(keys.size()) - 1), part(0, 2),
      coin(0, 9), jitter(-1500, 400);
  int64_t clock = base;
  int written = 0;
  while (written < n) {
    auto b = d.new_batch();
    const int size = batch_size(rng);
    for (int i = 0; i < size && written < n; ++i, ++written) {
      clock += 7;
      const int32_t p = part(rng);
      const auto& k = keys[static_cast<size_t>(key(rng))];
      const int64_t ts = clock + jitter(rng);  // often older than the stream time, sometimes too old
      std::optional<std::string> v;
      if (coin(rng) != 0) v = "v" + std::to_string(offset);
      b.put_version(t, p, k, ts, offset, v ? std::optional<std::string_view>(*v) : std::nullopt);
      m.put(p, k, ts, v);
      b.set_position(t, p, ++offset);
    }
    REQUIRE(d.write(b).ok());
  }
}

// Every as-of read at many times in each partition's history, and the latest values,
// against the model.
void check_reads(const db& d, view_id t, const model& m, std::mt19937& rng) {
  auto snap = d.read_snapshot();
  for (const auto& [p, st] : m.stream) {
    auto start = snap->history_start(t, p);
    REQUIRE(start.ok());
    REQUIRE(start->has_value());
    CHECK(**start == m.start(p));
    std::uniform_int_distribution<int64_t> when(m.start(p), st + 50);
    for (const auto& k : keys) {
      for (int i = 0; i < 40; ++i) {
        const int64_t at = i == 0 ? m.start(p) : when(rng);
        auto got = snap->version_at(t, p, k, at);
        REQUIRE(got.ok());
        auto want = m.at(p, k, at);
        REQUIRE(got->has_value() == want.has_value());
        if (!want) continue;
        CHECK((*got)->valid_from == want->from);
        CHECK((*got)->valid_to == want->to);
        CHECK(value_of((*got)->value) == (want->value ? *want->value : "<none>"));
      }
      // The latest value, where plain reads find it.
      auto latest = d.get(t, p, k);
      REQUIRE(latest.ok());
      auto want = m.at(p, k, INT64_MAX);
      if (!want || !want->value) CHECK_FALSE(latest->value.has_value());
      else CHECK(value_of(latest->value) == *want->value);
    }
  }
}

// The as-of cursor over every partition at many times, both orders, with bounds.
void check_cursor(const db& d, view_id t, const model& m, std::mt19937& rng) {
  auto snap = d.read_snapshot();
  const std::vector<std::pair<std::optional<std::string>, std::optional<std::string>>> bounds = {
      {std::nullopt, std::nullopt}, {std::string("a\0", 2), "b"}, {"ab", std::nullopt}, {std::nullopt, "a"}};
  for (bool descending : {false, true})
    for (const auto& [lower, upper] : bounds)
      for (const auto& [p, st] : m.stream) {
        std::uniform_int_distribution<int64_t> when(m.start(p), st + 50);
        for (int i = 0; i < 10; ++i) {
          const int64_t at = when(rng);
          std::vector<std::pair<std::string, std::string>> want;
          for (const auto& k : keys) {
            if ((lower && k < *lower) || (upper && k >= *upper)) continue;
            auto a = m.at(p, k, at);
            if (a && a->value) want.emplace_back(k, *a->value);
          }
          std::sort(want.begin(), want.end());
          if (descending) std::reverse(want.begin(), want.end());
          std::vector<std::pair<std::string, std::string>> got;
          auto c = snap->cursor_as_of(t, at, descending, scan_use::page);
          for (c->seek(p, lower, upper); c->valid(); c->next())
            got.emplace_back(std::string(c->key()), value_of(std::string(c->value())));
          REQUIRE(c->error().ok());
          CHECK(got == want);
        }
      }
}

}  // namespace

TEST_CASE("versions are placed by timestamp, out of order and tombstones included, and read as of any time kept") {
  versions_dir dir;
  auto opened = db::open(versioned_options(dir.path.string()), {"t"});
  REQUIRE(opened.ok());
  auto& d = **opened;
  auto t = *d.find_view("t");
  model m;
  std::mt19937 rng(7);
  int64_t offset = 0;
  write_random(d, t, m, rng, 1500, offset, 1'000'000);
  CHECK(m.late > 0);  // the generator does produce records too late to place
  CHECK(d.stats(t)->late_versions == m.late);
  check_reads(d, t, m, rng);
  check_cursor(d, t, m, rng);

  SUBCASE("version lists overlap the interval asked, newest first, bounded by the limit") {
    auto snap = d.read_snapshot();
    std::uniform_int_distribution<int64_t> span(0, 800);
    for (const auto& [p, st] : m.stream)
      for (const auto& k : keys)
        for (int i = 0; i < 10; ++i) {
          const int64_t from = m.start(p) + span(rng), to = from + span(rng);
          const size_t limit = i % 3 == 0 ? 2 : 100;
          auto got = snap->versions(t, p, k, from, to, m.start(p), limit);
          REQUIRE(got.ok());
          auto want = m.between(p, k, from, to, m.start(p));
          if (want.size() > limit) want.resize(limit);
          REQUIRE(got->size() == want.size());
          for (size_t j = 0; j < want.size(); ++j) {
            CHECK((*got)[j].valid_from == want[j].from);
            CHECK((*got)[j].valid_to == want[j].to);
            CHECK(value_of((*got)[j].value) == (want[j].value ? *want[j].value : "<none>"));
          }
        }
  }

  SUBCASE("compaction deletes exactly the versions that ended before the history, and answers do not change") {
    REQUIRE(d.compact(t).ok());
    check_reads(d, t, m, rng);
    check_cursor(d, t, m, rng);
    auto snap = d.read_snapshot();
    for (const auto& [p, st] : m.stream) {
      size_t kept = 0;
      for (const auto& k : keys) kept += m.between(p, k, INT64_MIN, INT64_MAX, m.start(p)).size();
      size_t stored = 0;
      for (auto it = snap->scan_versions(t, p); it->valid(); it->next()) ++stored;
      CHECK(stored == kept);
    }
    CHECK(d.stats(t)->expired_versions > 0);
  }

  SUBCASE("a restart keeps the versions and the stream time: too-late records stay too late") {
    opened->reset();
    auto again = db::open(versioned_options(dir.path.string()), {"t"});
    REQUIRE(again.ok());
    auto& d2 = **again;
    check_reads(d2, t, m, rng);
    write_random(d2, t, m, rng, 300, offset, 1'000'000 + 1500 * 7);
    check_reads(d2, t, m, rng);
    check_cursor(d2, t, m, rng);
  }

  SUBCASE("a copy of a partition carries its versions and stream time") {
    versions_dir other;
    auto copy = db::open(versioned_options(other.path.string()), {"t"});
    REQUIRE(copy.ok());
    auto snap = d.read_snapshot();
    model copied;
    for (const auto& [p, st] : m.stream) {
      auto loader = (*copy)->load_partition(t, p);
      REQUIRE(loader.ok());
      for (auto it = snap->scan(t, p, std::nullopt, std::nullopt, false, scan_use::sweep); it->valid(); it->next())
        REQUIRE((*loader)->add(it->key(), it->value()).ok());
      for (auto it = snap->scan_versions(t, p); it->valid(); it->next())
        REQUIRE((*loader)->add_version(it->key(), it->value()).ok());
      auto positions = snap->view_positions(t, p);
      REQUIRE(positions.ok());
      REQUIRE((*loader)->commit(*positions).ok());
    }
    check_reads(**copy, t, m, rng);
    check_cursor(**copy, t, m, rng);
    // Placement goes on in the copy exactly as in the original.
    model both = m;
    std::mt19937 same(11), same2(11);
    int64_t o1 = offset, o2 = offset;
    write_random(d, t, m, same, 200, o1, 1'000'000 + 1500 * 7);
    write_random(**copy, t, both, same2, 200, o2, 1'000'000 + 1500 * 7);
    check_reads(**copy, t, both, rng);
    check_reads(d, t, m, rng);
  }
}

TEST_CASE("a version written for a view that is not versioned fails the whole batch") {
  versions_dir dir;
  auto opened = db::open(versioned_options(dir.path.string()), {"t", "plain"});
  REQUIRE(opened.ok());
  auto plain = *(*opened)->find_view("plain");
  auto b = (*opened)->new_batch();
  b.put_version(plain, 0, "k", 1, 0, std::string_view("v"));
  b.set_position(plain, 0, 1);
  CHECK_FALSE((*opened)->write(b).ok());
  CHECK_FALSE((*opened)->stored_position(plain, 0)->has_value());
}

TEST_CASE("a versioned view cannot have a ttl") {
  versions_dir dir;
  auto o = versioned_options(dir.path.string());
  o.ttl_ms["t"] = 1000;
  CHECK_FALSE(db::open(o, {"t"}).ok());
}

TEST_CASE("a versioned view's size includes its versions, its key estimate counts latest values") {
  versions_dir dir;
  auto opened = db::open(versioned_options(dir.path.string()), {"t"});
  REQUIRE(opened.ok());
  auto& d = **opened;
  auto t = *d.find_view("t");
  auto b = d.new_batch();
  std::mt19937 rng(5);
  std::string value(1000, ' ');
  for (int i = 0; i < 200; ++i) {
    for (auto& c : value) c = static_cast<char>(rng());  // incompressible
    b.put_version(t, 0, "k" + std::to_string(i % 10), 1000 + i, i, value);
  }
  b.set_position(t, 0, 200);
  REQUIRE(d.write(b).ok());
  REQUIRE(d.flush().ok());
  auto st = d.stats(t);
  REQUIRE(st.ok());
  // 200 versions of ~1 KB each are on disk beside 10 latest values.
  CHECK(st->live_sst_bytes > 100 * value.size());
  CHECK(st->estimated_keys <= 20);
}
