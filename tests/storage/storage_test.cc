#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "core/value_codec.h"
#include "storage/db.h"
#include "storage/key_codec.h"

using namespace kstate::storage;

namespace {
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() / ("kstate-storage-" + std::to_string(std::random_device{}()));
    std::filesystem::remove_all(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};
}  // namespace

TEST_CASE("data keys are the big-endian partition followed by the key bytes") {
  auto k = encode_data_key(258, std::string_view("a\0/", 3));
  CHECK(k == std::string("\x00\x00\x01\x02"
                         "a\0/",
                         7));
  auto d = decode_data_key(k);
  REQUIRE(d);
  CHECK(d->partition == 258);
  CHECK(d->key == std::string_view("a\0/", 3));
  CHECK_FALSE(decode_data_key("abc"));
}

TEST_CASE("data keys sort by partition, then by key bytes compared unsigned") {
  using pk = std::pair<int32_t, std::string>;
  std::vector<pk> in{{1, "b"}, {0, "\xff"}, {0, "a"}, {1, ""}, {0, std::string("a\0", 2)}, {2, "\x01"}};
  std::vector<std::string> encoded;
  for (auto& [p, k] : in) encoded.push_back(encode_data_key(p, k));
  // RocksDB's default comparator: memcmp order.
  std::sort(encoded.begin(), encoded.end(),
            [](const std::string& a, const std::string& b) { return std::string_view(a) < std::string_view(b); });
  std::vector<pk> out;
  for (auto& e : encoded) out.emplace_back(decode_data_key(e)->partition, std::string(decode_data_key(e)->key));
  std::vector<pk> expected{{0, "a"}, {0, std::string("a\0", 2)}, {0, "\xff"}, {1, ""}, {1, "b"}, {2, "\x01"}};
  CHECK(out == expected);
}

TEST_CASE("offsets round-trip through their 8-byte encoding") {
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{1} << 40, INT64_MAX}) {
    CHECK(decode_offset(encode_offset(v)) == v);
  }
  CHECK_FALSE(decode_offset("1234567"));
}

TEST_CASE("a batch holds state changes and positions together, and applies atomically") {
  temp_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"users", "orders"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto users = *d.find_view("users");
  auto orders = *d.find_view("orders");

  auto b = d.new_batch();
  b.put(users, 3, "alice", "v1");
  b.del(users, 3, "bob");
  b.set_position(users, 3, 42);
  b.put(orders, 0, "o1", "x");
  b.set_position(orders, 0, 7);
  auto entries = b.entries();
  REQUIRE(entries.size() == 5);
  CHECK(entries[0].view == users);
  CHECK(entries[0].partition == 3);
  CHECK(entries[0].key == "alice");
  CHECK(entries[0].value == "v1");
  CHECK_FALSE(entries[1].value);  // delete
  CHECK(entries[2].position == 42);
  CHECK(entries[2].view == users);
  CHECK(entries[2].partition == 3);
  CHECK(entries[4].position == 7);
  CHECK(entries[4].view == orders);

  // Nothing is visible before write().
  CHECK_FALSE(d.get(users, 3, "alice")->value);
  CHECK_FALSE(d.stored_position(users, 3).value());
  REQUIRE(d.write(b).ok());
  auto g = d.get(users, 3, "alice");
  REQUIRE(g.ok());
  CHECK(g->value == "v1");
  CHECK(g->position == 42);
  CHECK(d.stored_position(orders, 0).value() == 7);
  // Partitions are separate key spaces.
  CHECK_FALSE(d.get(users, 2, "alice")->value);
}

TEST_CASE("state and positions survive reopening; views added later start empty") {
  temp_dir dir;
  {
    auto d = db::open(db_options{.path = dir.path.string()}, {"users"});
    REQUIRE(d.ok());
    auto b = d.value()->new_batch();
    auto users = *d.value()->find_view("users");
    b.put(users, 0, "k", "v");
    b.set_position(users, 0, 100);
    REQUIRE(d.value()->write(b).ok());
  }
  auto d = db::open(db_options{.path = dir.path.string()}, {"users", "later"});
  REQUIRE(d.ok());
  auto users = *d.value()->find_view("users");
  auto later = *d.value()->find_view("later");
  CHECK(d.value()->get(users, 0, "k")->value == "v");
  CHECK(d.value()->stored_position(users, 0).value() == 100);
  CHECK_FALSE(d.value()->stored_position(later, 0).value());
}

TEST_CASE("the instance identity stays with its directory, and a copy elsewhere gets a new one") {
  temp_dir dir;
  std::string first;
  {
    auto d = db::open(db_options{.path = dir.path.string()}, {"v"});
    REQUIRE(d.ok());
    auto id = d.value()->instance_id("host=a;path=/x");
    REQUIRE(id.ok());
    CHECK(id->created);
    CHECK_FALSE(id->renewed);
    CHECK(id->id.size() == 16);
    first = id->id;
    // Asked again in the same place: the same id.
    auto again = d.value()->instance_id("host=a;path=/x");
    REQUIRE(again.ok());
    CHECK(again->id == first);
    CHECK_FALSE(again->created);
  }
  {
    // Reopened in the same place (a restart): the same id.
    auto d = db::open(db_options{.path = dir.path.string()}, {"v"});
    REQUIRE(d.ok());
    auto id = d.value()->instance_id("host=a;path=/x");
    REQUIRE(id.ok());
    CHECK(id->id == first);
    CHECK_FALSE(id->renewed);
    // The same files seen from another place (a copy, another host): a new id, kept.
    auto moved = d.value()->instance_id("host=b;path=/x");
    REQUIRE(moved.ok());
    CHECK(moved->renewed);
    CHECK(moved->id != first);
    auto later = d.value()->instance_id("host=b;path=/x");
    REQUIRE(later.ok());
    CHECK(later->id == moved->id);
    CHECK_FALSE(later->renewed);
  }
}

TEST_CASE("a state directory held by another open database is refused with a clear error") {
  temp_dir dir;
  auto first = db::open(db_options{.path = dir.path.string()}, {"v"});
  REQUIRE(first.ok());
  auto second = db::open(db_options{.path = dir.path.string()}, {"v"});
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().message().find("in use by another process") != std::string::npos);
}

TEST_CASE("bad options are rejected by name") {
  temp_dir dir;
  db_options bad{.path = dir.path.string()};
  bad.defaults.compression = "gzip";
  auto d = db::open(bad, {"v"});
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().message().find("compression") != std::string::npos);
}

TEST_CASE("windows expired at their partition's stored stream time leave the disk on the next expiry pass") {
  temp_dir dir;
  kstate::window_spec spec;
  spec.size_ms = 1000;
  spec.retention_ms = 5000;
  REQUIRE(kstate::normalize(spec).ok());
  db_options o;
  o.path = dir.path.string();
  o.windowed["clicks"] = windowed_store{spec, "clicks#stream_time"};
  o.window_expiry_interval_ms = 0;  // passes only when the test asks
  o.defaults.compression = "none";  // sizes on disk then follow the bytes kept

  // 3 partitions x 100 keys x 20 windows (starts 0, 1000, .., 19000), 200-byte values;
  // the table view "users" holds the same bytes and must keep all of them.
  const std::map<int32_t, int64_t> stream_time{{0, 20000}, {1, 10000}};  // partition 2: none yet
  std::mt19937 rng(7);
  auto value = [&] {
    std::string v(200, '\0');
    for (auto& c : v) c = static_cast<char>(rng());
    return v;
  };
  std::set<std::pair<int32_t, std::string>> live;  // what must remain: (partition, stored key)
  size_t expired = 0;
  {
    auto opened = db::open(o, {"clicks", "users"});
    REQUIRE(opened.ok());
    auto& d = *opened.value();
    auto clicks = *d.find_view("clicks"), users = *d.find_view("users");
    for (int32_t p = 0; p < 3; ++p) {
      auto b = d.new_batch();
      for (int k = 0; k < 100; ++k)
        for (int64_t start = 0; start < 20000; start += 1000) {
          auto key = kstate::encode_windowed_key("user-" + std::to_string(k), start);
          b.put(clicks, p, key, value());
          b.put(users, p, key, value());
          auto st = stream_time.find(p);
          // Expired: the window's end is at least `retention` before stream time.
          if (st != stream_time.end() && start + 1000 + 5000 <= st->second) ++expired;
          else live.emplace(p, key);
        }
      if (auto st = stream_time.find(p); st != stream_time.end())
        b.set_named_position("clicks#stream_time", p, st->second);
      REQUIRE(d.write(b).ok());
    }
    REQUIRE(expired == 100 * 15 + 100 * 5);
    REQUIRE(d.flush().ok());
    auto before = d.stats(clicks).value().total_sst_bytes;

    auto passes = d.expire_windows();
    REQUIRE(passes.ok());
    CHECK(*passes == 1);
    CHECK(d.stats(clicks).value().expired_windows == expired);
    std::set<std::pair<int32_t, std::string>> kept;
    size_t users_kept = 0;
    auto snap = d.read_snapshot();
    for (int32_t p = 0; p < 3; ++p) {
      for (auto it = snap->scan(clicks, p, {}, {}, false, scan_use::sweep); it->valid(); it->next())
        kept.emplace(p, std::string(it->key()));
      for (auto it = snap->scan(users, p, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++users_kept;
    }
    CHECK(kept == live);
    CHECK(users_kept == 3 * 100 * 20);
    auto after = d.stats(clicks).value().total_sst_bytes;
    MESSAGE("windowed view on disk: " << before << " -> " << after << " bytes");
    // The files shrink to the live share (4,000 of 6,000 windows here).
    const double live_share = static_cast<double>(live.size()) / (3 * 100 * 20);
    CHECK(static_cast<double>(after) < static_cast<double>(before) * (live_share + 0.05));

    // Nothing new expired: the next pass compacts nothing.
    CHECK(d.expire_windows().value() == 0);

    // Stream time reaches partition 2 (cutoff 14001 as for partition 0).
    auto b = d.new_batch();
    b.set_named_position("clicks#stream_time", 2, 20000);
    REQUIRE(d.write(b).ok());
    CHECK(d.expire_windows().value() == 1);
    CHECK(d.stats(clicks).value().expired_windows == expired + 100 * 15);
  }
  // Stream times are read back on open: a reopened database expires nothing more and
  // keeps what is live.
  auto reopened = db::open(o, {"clicks", "users"});
  REQUIRE(reopened.ok());
  auto& d = *reopened.value();
  auto clicks = *d.find_view("clicks");
  CHECK(d.expire_windows().value() == 1);
  CHECK(d.stats(clicks).value().expired_windows == 0);
  size_t count = 0;
  auto snap = d.read_snapshot();
  for (int32_t p = 0; p < 3; ++p)
    for (auto it = snap->scan(clicks, p, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++count;
  CHECK(count == live.size() - 100 * 15);  // partition 2 lost its first 15 windows of each key
}

TEST_CASE("sessions expire by their end, the last record time in their frame, not by their start") {
  temp_dir dir;
  kstate::window_spec spec;
  spec.type = kstate::window_type::session;
  spec.gap_ms = 100;
  spec.retention_ms = 1000;
  REQUIRE(kstate::normalize(spec).ok());
  db_options o;
  o.path = dir.path.string();
  o.windowed["visits"] = windowed_store{spec, "visits#stream_time"};
  o.window_expiry_interval_ms = 0;
  auto opened = db::open(o, {"visits"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto visits = *d.find_view("visits");
  // Sessions of random starts and lengths; stream time 50,000: a session is kept while
  // last + retention >= stream time, whatever its start.
  constexpr int64_t stream_time = 50'000;
  std::mt19937 rng(11);
  std::set<std::string> live;
  size_t expired = 0;
  auto b = d.new_batch();
  for (int k = 0; k < 200; ++k) {
    const int64_t start = static_cast<int64_t>(rng() % 48'000);
    const int64_t last = start + static_cast<int64_t>(rng() % 3'000);
    auto key = kstate::encode_windowed_key("user-" + std::to_string(k), start);
    b.put(visits, 0, key, kstate::frame_value(k, last, "1"));
    if (last + 1000 < stream_time) ++expired;
    else live.insert(key);
  }
  b.set_named_position("visits#stream_time", 0, stream_time);
  REQUIRE(d.write(b).ok());
  REQUIRE(expired > 0);
  REQUIRE(!live.empty());
  REQUIRE(d.flush().ok());
  CHECK(d.expire_windows().value() == 1);
  CHECK(d.stats(visits).value().expired_windows == expired);
  std::set<std::string> kept;
  auto snap = d.read_snapshot();
  for (auto it = snap->scan(visits, 0, {}, {}, false, scan_use::sweep); it->valid(); it->next())
    kept.emplace(it->key());
  CHECK(kept == live);
}

TEST_CASE("a windowed store that names no configured view is refused") {
  temp_dir dir;
  db_options o;
  o.path = dir.path.string();
  kstate::window_spec spec;
  spec.size_ms = 1000;
  REQUIRE(kstate::normalize(spec).ok());
  o.windowed["nope"] = windowed_store{spec, "nope#stream_time"};
  auto opened = db::open(o, {"clicks"});
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().message().find("nope") != std::string::npos);
}

TEST_CASE("a batch missing an operation is refused whole, with the error, and never throws") {
  temp_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"users"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto users = *d.find_view("users");
  const view_id unknown = users + 100;

  auto b = d.new_batch();
  b.put(users, 0, "alice", "v1");
  b.set_position(users, 0, 5);
  CHECK(b.error().ok());
  b.put(unknown, 0, "bob", "v2");  // cannot be added: the batch remembers why
  b.set_position(unknown, 0, 9);
  CHECK_FALSE(b.error().ok());
  auto s = d.write(b);
  CHECK_FALSE(s.ok());
  CHECK(s.message().find("unknown view") != std::string::npos);
  // Nothing of it was applied: not alice, not the position that would pass bob.
  CHECK_FALSE(d.get(users, 0, "alice").value().value);
  CHECK_FALSE(d.stored_position(users, 0).value());

  b.clear();
  CHECK(b.error().ok());
  b.put(users, 0, "alice", "v1");
  REQUIRE(d.write(b).ok());
  CHECK(d.get(users, 0, "alice").value().value == std::optional<std::string>("v1"));
}

namespace {
// Every entry of one partition of `view`, read through a snapshot.
std::map<std::string, std::string> partition_contents(const db& d, view_id view, int32_t partition) {
  std::map<std::string, std::string> out;
  auto snap = d.read_snapshot();
  for (auto it = snap->scan(view, partition, std::nullopt, std::nullopt, false, scan_use::sweep); it->valid();
       it->next())
    out.emplace(std::string(it->key()), std::string(it->value()));
  return out;
}
}  // namespace

TEST_CASE("a partition copied from another database replaces the old one whole, with its positions") {
  temp_dir src_dir, dst_dir;
  auto src = db::open(db_options{.path = src_dir.path.string()}, {"users"});
  auto dst = db::open(db_options{.path = dst_dir.path.string()}, {"users"});
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  auto& s = *src.value();
  auto& d = *dst.value();
  auto users = *s.find_view("users");

  // The model: what the source's partition 2 holds, random keys (zero bytes included).
  std::mt19937 rng(7);
  std::map<std::string, std::string> model;
  auto b = s.new_batch();
  for (int i = 0; i < 5000; ++i) {
    std::string k(1 + rng() % 12, '\0');
    for (auto& ch : k) ch = static_cast<char>(rng() % 4);
    std::string v = "v" + std::to_string(rng());
    model[k] = v;
    b.put(users, 2, k, v);
  }
  b.set_position(users, 2, 5000);
  b.set_named_position("users#changelog", 2, 4321);
  b.put(users, 1, "other", "source's partition 1");
  b.set_position(users, 1, 9);
  REQUIRE(s.write(b).ok());
  auto snap = s.read_snapshot();
  // Written after the snapshot: not part of the copy.
  auto later = s.new_batch();
  later.put(users, 2, "after-the-snapshot", "x");
  later.set_position(users, 2, 5001);
  REQUIRE(s.write(later).ok());

  // The destination holds an older state of partition 2 (keys the copy does not have,
  // a position the copy replaces, a named position it does not know) and partition 1.
  auto old = d.new_batch();
  old.put(users, 2, "stale-only-here", "old");
  old.put(users, 2, model.begin()->first, "old value");
  old.set_position(users, 2, 10);
  old.set_named_position("users#stream_time", 2, 77);
  old.put(users, 1, "mine", "kept");
  old.set_position(users, 1, 3);
  REQUIRE(d.write(old).ok());

  auto positions = snap->view_positions(users, 2);
  REQUIRE(positions.ok());
  CHECK(*positions == std::vector<std::pair<std::string, int64_t>>{{"users", 5000}, {"users#changelog", 4321}});
  auto loader = d.load_partition(users, 2);
  REQUIRE(loader.ok());
  for (auto it = snap->scan(users, 2, std::nullopt, std::nullopt, false, scan_use::sweep); it->valid(); it->next())
    REQUIRE((*loader)->add(it->key(), it->value()).ok());
  CHECK((*loader)->entries() == model.size());
  // Nothing changes before the commit.
  CHECK(d.stored_position(users, 2).value() == 10);
  CHECK(partition_contents(d, users, 2).count("stale-only-here") == 1);
  REQUIRE((*loader)->commit(*positions).ok());

  CHECK(partition_contents(d, users, 2) == model);
  CHECK(d.stored_position(users, 2).value() == 5000);
  CHECK(d.stored_named_position("users#changelog", 2).value() == 4321);
  CHECK_FALSE(d.stored_named_position("users#stream_time", 2).value());
  CHECK(*d.read_snapshot()->view_positions(users, 2) == *positions);
  // Another partition is untouched.
  CHECK(partition_contents(d, users, 1) == std::map<std::string, std::string>{{"mine", "kept"}});
  CHECK(d.stored_position(users, 1).value() == 3);
  // Loaded files moved into the database: nothing is left behind.
  CHECK(std::filesystem::is_empty(dst_dir.path / "bootstrap"));
}

TEST_CASE("a partition load replaces a companion's partition (a join's sides) in the same commit") {
  temp_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"j", "j#sides", "other"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto j = *d.find_view("j"), sides = *d.find_view("j#sides"), other = *d.find_view("other");

  // The old state: partition 2 with joined values and sides the copy does not have,
  // partition 1 of both, which the load leaves alone.
  auto old = d.new_batch();
  old.put(j, 2, "gone", "old joined");
  old.put(sides, 2, "gone", "old sides");
  old.put(sides, 2, "only-a-side", "old sides");
  old.set_position(j, 2, 10);
  old.put(j, 1, "mine", "kept");
  old.put(sides, 1, "mine", "kept sides");
  old.set_position(j, 1, 3);
  REQUIRE(d.write(old).ok());

  // The copy: joined values for some keys, sides for more (an inner join holds sides
  // of keys not joined yet).
  std::mt19937 rng(9);
  std::map<std::string, std::string> joined, side_model;
  for (int i = 0; i < 500; ++i) {
    std::string k = "k" + std::to_string(rng() % 1000);
    side_model[k] = "sides of " + k;
    if (rng() % 3 != 0) joined[k] = "joined " + k;
  }
  auto loader = d.load_partition(j, 2, {sides});
  REQUIRE(loader.ok());
  for (const auto& [k, v] : joined) REQUIRE((*loader)->add(k, v).ok());
  for (const auto& [k, v] : side_model) REQUIRE((*loader)->add_companion(0, k, v).ok());
  CHECK_FALSE((*loader)->add_companion(1, "k", "v").ok());  // there is one companion
  CHECK((*loader)->entries() == joined.size() + side_model.size());
  // Nothing changes before the commit.
  CHECK(partition_contents(d, sides, 2).count("only-a-side") == 1);
  REQUIRE((*loader)->commit({{"j", 700}, {"j#changelog", 650}}).ok());

  CHECK(partition_contents(d, j, 2) == joined);
  CHECK(partition_contents(d, sides, 2) == side_model);
  CHECK(d.stored_position(j, 2).value() == 700);
  CHECK(d.stored_named_position("j#changelog", 2).value() == 650);
  CHECK(partition_contents(d, j, 1) == std::map<std::string, std::string>{{"mine", "kept"}});
  CHECK(partition_contents(d, sides, 1) == std::map<std::string, std::string>{{"mine", "kept sides"}});
  CHECK(std::filesystem::is_empty(dir.path / "bootstrap"));

  // A copy without sides empties the companion's partition: nothing of the old state
  // stays beside the new one.
  auto bare = d.load_partition(j, 2, {sides});
  REQUIRE(bare.ok());
  REQUIRE((*bare)->add("x", "joined x").ok());
  REQUIRE((*bare)->commit({{"j", 800}}).ok());
  CHECK(partition_contents(d, j, 2) == std::map<std::string, std::string>{{"x", "joined x"}});
  CHECK(partition_contents(d, sides, 2).empty());
  CHECK(partition_contents(d, sides, 1).size() == 1);

  // Without companions there is none to add to; a view is not its own companion.
  auto plain = d.load_partition(other, 0);
  REQUIRE(plain.ok());
  CHECK_FALSE((*plain)->add_companion(0, "k", "v").ok());
  CHECK_FALSE(d.load_partition(j, 0, {j}).ok());
  CHECK_FALSE(d.load_partition(j, 0, {99}).ok());
}

TEST_CASE("a partition load that is not committed changes nothing, and bad loads are refused") {
  temp_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"users", "orders"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto users = *d.find_view("users");
  auto b = d.new_batch();
  b.put(users, 0, "k", "v");
  b.set_position(users, 0, 1);
  REQUIRE(d.write(b).ok());
  {
    auto loader = d.load_partition(users, 0);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->add("a", "1").ok());
    REQUIRE((*loader)->add("b", "2").ok());
    CHECK_FALSE((*loader)->add("b", "again").ok());         // not ascending
    CHECK_FALSE((*loader)->commit({{"orders", 5}}).ok());   // another view's position
    CHECK_FALSE((*loader)->commit({{"users#x", 5}}).ok());  // no position of its own
  }
  CHECK(partition_contents(d, users, 0) == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(d.stored_position(users, 0).value() == 1);
  CHECK(std::filesystem::is_empty(dir.path / "bootstrap"));

  // A copy with no entries empties the partition and sets its position.
  auto empty = d.load_partition(users, 0);
  REQUIRE(empty.ok());
  REQUIRE((*empty)->commit({{"users", 40}}).ok());
  CHECK(partition_contents(d, users, 0).empty());
  CHECK(d.stored_position(users, 0).value() == 40);
}

namespace {

// Files of the database in `dir` whose names end in `suffix` or start with `prefix`.
std::vector<std::filesystem::path> files_named(const std::filesystem::path& dir, const std::string& prefix,
                                               const std::string& suffix = {}) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto n = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if ((!prefix.empty() && n.rfind(prefix, 0) == 0) ||
        (!suffix.empty() && n.size() >= suffix.size() &&
         n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0))
      out.push_back(e.path());
  }
  return out;
}

// Opens `dir` with view "v", writes key "k" and position 7 to partition 0, flushes to an
// SST file, and returns the instance id it made.
std::string fill_and_flush(const std::filesystem::path& dir) {
  auto d = db::open(db_options{.path = dir.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(d.ok());
  auto id = d.value()->instance_id("host=a");
  REQUIRE(id.ok());
  auto b = d.value()->new_batch();
  auto v = *d.value()->find_view("v");
  b.put(v, 0, "k", "value");
  for (int i = 0; i < 100; ++i) b.put(v, 0, "filler-" + std::to_string(i), std::string(100, 'f'));
  b.set_position(v, 0, 7);
  REQUIRE(d.value()->write(b).ok());
  REQUIRE(d.value()->flush().ok());
  return id->id;
}

// Mounts `dir` over itself read-only (a bind mount: files already open for writing
// through the directory's own mount still take writes, new files do not), or does
// nothing without the privilege; unmounted on destruction.
struct read_only_mount {
  std::string dir;
  bool mounted = false;
  explicit read_only_mount(std::string d) : dir(std::move(d)) {
    mounted = std::system(("mount --bind '" + dir + "' '" + dir + "' 2>/dev/null").c_str()) == 0;
    if (mounted && std::system(("mount -o remount,ro,bind '" + dir + "' 2>/dev/null").c_str()) != 0) undo();
  }
  void undo() {
    if (mounted) (void)std::system(("umount -l '" + dir + "'").c_str());
    mounted = false;
  }
  ~read_only_mount() { undo(); }
};

}  // namespace

TEST_CASE("a database whose SST file was deleted is moved aside on open, and the new one keeps its identity") {
  temp_dir dir;
  const auto id = fill_and_flush(dir.path);
  // The largest SST file: the view's (the identity, in the meta column family, is in a
  // small one).
  auto ssts = files_named(dir.path, "", ".sst");
  REQUIRE(ssts.size() >= 2);
  std::sort(ssts.begin(), ssts.end(),
            [](const auto& a, const auto& b) { return std::filesystem::file_size(a) > std::filesystem::file_size(b); });
  std::filesystem::remove(ssts.front());

  auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(d.ok());
  const auto& q = d.value()->quarantined();
  REQUIRE(q);
  CHECK(std::filesystem::path(q->path).parent_path() == dir.path / "quarantine");
  // Moved, not deleted: the rest of the old database is there.
  CHECK_FALSE(files_named(q->path, "MANIFEST-").empty());
  CHECK_FALSE(q->reason.empty());
  // Empty: no value, no position (so every view is rebuilt), the same instance.
  auto v = *d.value()->find_view("v");
  CHECK_FALSE(d.value()->get(v, 0, "k")->value);
  CHECK_FALSE(d.value()->stored_position(v, 0).value());
  auto again = d.value()->instance_id("host=a");
  REQUIRE(again.ok());
  CHECK(again->id == id);
  CHECK_FALSE(again->created);
  CHECK_FALSE(again->renewed);
}

TEST_CASE("a database whose MANIFEST was deleted is moved aside on open and starts empty") {
  temp_dir dir;
  (void)fill_and_flush(dir.path);
  for (const auto& f : files_named(dir.path, "MANIFEST-")) std::filesystem::remove(f);
  auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(d.ok());
  REQUIRE(d.value()->quarantined());
  auto v = *d.value()->find_view("v");
  CHECK_FALSE(d.value()->get(v, 0, "k")->value);
  CHECK_FALSE(d.value()->stored_position(v, 0).value());
  // Opened again: healthy now, nothing moved.
  d.value().reset();  // closed
  auto reopened = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(reopened.ok());
  CHECK_FALSE(reopened.value()->quarantined());
}

TEST_CASE("a database whose CURRENT file was deleted is moved aside on open, not taken for a new one") {
  temp_dir dir;
  (void)fill_and_flush(dir.path);
  {
    // Unflushed writes in the log, which a new database would replay over nothing.
    auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
    REQUIRE(d.ok());
    auto b = d.value()->new_batch();
    b.set_position(*d.value()->find_view("v"), 0, 8);
    REQUIRE(d.value()->write(b).ok());
  }
  std::filesystem::remove(dir.path / "CURRENT");
  auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(d.ok());
  REQUIRE(d.value()->quarantined());
  CHECK(d.value()->quarantined()->reason.find("CURRENT") != std::string::npos);
  auto v = *d.value()->find_view("v");
  CHECK_FALSE(d.value()->stored_position(v, 0).value());
  CHECK_FALSE(d.value()->get(v, 0, "k")->value);
}

TEST_CASE("an intact database is opened as it is, nothing moved") {
  temp_dir dir;
  (void)fill_and_flush(dir.path);
  auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(d.ok());
  CHECK_FALSE(d.value()->quarantined());
  CHECK_FALSE(std::filesystem::exists(dir.path / "quarantine"));
  CHECK(d.value()->get(*d.value()->find_view("v"), 0, "k")->value == "value");
}

TEST_CASE("a file deleted under an open database is reported as damage, by a check and by the background check") {
  temp_dir dir;
  (void)fill_and_flush(dir.path);
  SUBCASE("an SST file") {
    auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
    REQUIRE(d.ok());
    CHECK(d.value()->verify_files().ok());
    CHECK(d.value()->must_reopen().empty());
    auto ssts = files_named(dir.path, "", ".sst");
    REQUIRE_FALSE(ssts.empty());
    std::filesystem::remove(ssts.front());
    auto s = d.value()->verify_files();
    CHECK(s.code() == kstate::status_code::corruption);
    CHECK(s.message().find(ssts.front().filename().string()) != std::string::npos);
    CHECK(d.value()->must_reopen() == s.message());
    // Still readable while RocksDB holds the file open: the damage is what the next open
    // would find.
    CHECK(d.value()->get(*d.value()->find_view("v"), 0, "k")->value == "value");
  }
  SUBCASE("the MANIFEST, found by the background check within its interval") {
    auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 100}, {"v"});
    REQUIRE(d.ok());
    for (const auto& f : files_named(dir.path, "MANIFEST-")) std::filesystem::remove(f);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (d.value()->must_reopen().empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(d.value()->must_reopen().find("MANIFEST-") != std::string::npos);
  }
  SUBCASE("the current write-ahead log") {
    auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
    REQUIRE(d.ok());
    auto wals = files_named(dir.path, "", ".log");
    REQUIRE_FALSE(wals.empty());
    for (const auto& f : wals) std::filesystem::remove(f);
    CHECK(d.value()->verify_files().code() == kstate::status_code::corruption);
    CHECK(d.value()->must_reopen().find("write-ahead log") != std::string::npos);
  }
}

TEST_CASE(
    "writes refused by a read-only state directory go through once it is writable again, after a reopen if needed") {
  temp_dir dir;
  db_options o{.path = dir.path.string(), .verify_files_interval_ms = 0};
  o.defaults.write_buffer_bytes = 64 << 10;  // flushes (new files) soon
  auto d = db::open(o, {"v"});
  REQUIRE(d.ok());
  auto v = *d.value()->find_view("v");
  read_only_mount ro(dir.path.string());
  if (!ro.mounted) {
    MESSAGE("skipped: mounting needs root");
    return;
  }
  // Writes go on into the open log until RocksDB needs a new file, then fail.
  int written = 0;
  kstate::status failed;  // ok
  const std::string value(1000, 'x');
  for (int i = 0; i < 100'000 && failed.ok(); ++i) {
    auto b = d.value()->new_batch();
    b.put(v, 0, "k" + std::to_string(i), value);
    b.set_position(v, 0, i + 1);
    failed = d.value()->write(b);
    if (failed.ok()) ++written;
  }
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.code() == kstate::status_code::io_error);
  CHECK(failed.message().find("Read-only file system") != std::string::npos);
  // Still refused while read-only, even after asking RocksDB to recover.
  auto still = d.value()->resume();
  CHECK_FALSE(still.ok());
  MESSAGE("resume while read-only: " << still.to_string());
  CHECK(d.value()->must_reopen().empty());  // read-only: nothing to do but wait
  // Writable again. RocksDB 7.8 stops for good when it cannot create a write-ahead log
  // (a fatal background error): resume() still fails, and says a reopen is needed.
  ro.undo();
  auto resumed = d.value()->resume();
  for (int i = 0; i < 2 && !resumed.ok(); ++i) {
    CHECK(d.value()->must_reopen().empty());  // not at the first failure
    resumed = d.value()->resume();
  }
  if (!resumed.ok()) {
    MESSAGE("resume once writable: " << resumed.to_string());
    CHECK(d.value()->must_reopen().find("only reopening") != std::string::npos);
    d.value().reset();  // closed
    d = db::open(o, {"v"});
    REQUIRE(d.ok());
    CHECK_FALSE(d.value()->quarantined());
  }
  // The refused write goes through now, and everything written before is there.
  auto b = d.value()->new_batch();
  b.put(v, 0, "k" + std::to_string(written), value);
  b.set_position(v, 0, written + 1);
  REQUIRE(d.value()->write(b).ok());
  d.value().reset();  // closed
  auto reopened = db::open(o, {"v"});
  REQUIRE(reopened.ok());
  CHECK(reopened.value()->stored_position(v, 0).value() == written + 1);
  for (int i = 0; i <= written; i += 97) CHECK(reopened.value()->get(v, 0, "k" + std::to_string(i))->value == value);
  CHECK(reopened.value()->get(v, 0, "k" + std::to_string(written))->value == value);
}

TEST_CASE("a read-only state directory at open is a clear error, and nothing is moved") {
  temp_dir dir;
  (void)fill_and_flush(dir.path);
  read_only_mount ro(dir.path.string());
  if (!ro.mounted) {
    MESSAGE("skipped: mounting needs root");
    return;
  }
  auto d = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().code() == kstate::status_code::io_error);
  CHECK(d.error().message().find("refuses writes") != std::string::npos);
  CHECK(d.error().message().find("Read-only file system") != std::string::npos);
  ro.undo();
  CHECK_FALSE(std::filesystem::exists(dir.path / "quarantine"));
  auto reopened = db::open(db_options{.path = dir.path.string(), .verify_files_interval_ms = 0}, {"v"});
  REQUIRE(reopened.ok());
  CHECK(reopened.value()->get(*reopened.value()->find_view("v"), 0, "k")->value == "value");
}

namespace {

// What reads of a view with a ttl must return at `now`, from the model: every key whose
// value has no time, or a time later than now - ttl.
std::map<std::pair<int32_t, std::string>, std::string> live_at(
    const std::map<std::pair<int32_t, std::string>, std::pair<std::optional<int64_t>, std::string>>& model, int64_t ttl,
    int64_t now) {
  std::map<std::pair<int32_t, std::string>, std::string> out;
  for (const auto& [k, tv] : model)
    if (!tv.first || now < *tv.first + ttl) out.emplace(k, tv.second);
  return out;
}

}  // namespace

TEST_CASE("keys of a view with a ttl are never read once expired, by any read, and compaction deletes them") {
  temp_dir dir;
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  db_options o;
  o.path = dir.path.string();
  o.ttl_ms["sessions"] = 1000;
  o.clock = [now] { return now->load(); };
  o.window_expiry_interval_ms = 0;
  o.verify_files_interval_ms = 0;
  auto opened = db::open(o, {"sessions", "plain"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto sessions = *d.find_view("sessions"), plain = *d.find_view("plain");

  // 3 partitions x 200 keys, times spread over [0, 3000); one key in ten has a plain
  // frame (written before the view had a ttl): it never expires. "plain" holds the same
  // timed values but has no ttl: nothing of it is ever hidden.
  std::map<std::pair<int32_t, std::string>, std::pair<std::optional<int64_t>, std::string>> model;
  std::mt19937 rng(23);
  for (int32_t p = 0; p < 3; ++p) {
    auto b = d.new_batch();
    for (int k = 0; k < 200; ++k) {
      char key[8];
      snprintf(key, sizeof key, "k%03d", k);
      const std::string value = "v" + std::to_string(rng());
      std::optional<int64_t> time;
      if (k % 10 != 0) time = static_cast<int64_t>(rng() % 3000);
      const auto framed = time ? kstate::frame_value(k, *time, value) : kstate::frame_value(k, value);
      b.put(sessions, p, key, framed);
      b.put(plain, p, key, framed);
      model[{p, key}] = {time, framed};
    }
    REQUIRE(d.write(b).ok());
  }

  auto reads_equal_model = [&](int64_t at) {
    now->store(at);
    const auto want = live_at(model, 1000, at);
    CAPTURE(at);
    auto snap = d.read_snapshot();
    std::vector<std::pair<int32_t, std::string>> all;
    for (const auto& [k, v] : model) all.push_back(k);
    auto many = snap->multi_get(sessions, all);
    REQUIRE(many.ok());
    for (size_t i = 0; i < all.size(); ++i) {
      auto w = want.find(all[i]);
      auto expect = w == want.end() ? std::optional<std::string>() : std::optional<std::string>(w->second);
      CHECK(d.get(sessions, all[i].first, all[i].second).value().value == expect);
      CHECK(snap->get(sessions, all[i].first, all[i].second).value() == expect);
      CHECK((*many)[i] == expect);
      CHECK(snap->get(plain, all[i].first, all[i].second).value() == model.at(all[i]).second);
    }
    // Scans and cursors, both directions, whole partitions and within bounds.
    for (bool desc : {false, true})
      for (auto [lo, hi] : {std::pair<std::optional<std::string>, std::optional<std::string>>{},
                            std::pair<std::optional<std::string>, std::optional<std::string>>{"k050", "k150"}}) {
        auto cursor = snap->cursor(sessions, desc, scan_use::page);
        for (int32_t p = 0; p < 3; ++p) {
          std::vector<std::string> expect;
          for (const auto& [k, v] : want)
            if (k.first == p && (!lo || k.second >= *lo) && (!hi || k.second < *hi)) expect.push_back(k.second);
          if (desc) std::reverse(expect.begin(), expect.end());
          std::vector<std::string> scanned, seen;
          for (auto it = snap->scan(sessions, p, lo, hi, desc, scan_use::sweep); it->valid(); it->next())
            scanned.emplace_back(it->key());
          for (cursor->seek(p, lo, hi); cursor->valid(); cursor->next()) seen.emplace_back(cursor->key());
          CHECK(scanned == expect);
          CHECK(seen == expect);
        }
      }
    return want.size();
  };
  CHECK(reads_equal_model(0) == 600);
  const auto at_1500 = reads_equal_model(1500);
  CHECK(at_1500 < 600);
  CHECK(at_1500 > 60);
  CHECK(reads_equal_model(3999) == 60);  // only the plain frames are left

  // A snapshot keeps the instant it was taken at.
  now->store(0);
  auto early = d.read_snapshot();
  now->store(5000);
  CHECK(early->get(sessions, 0, "k001").value().has_value());
  CHECK(!d.read_snapshot()->get(sessions, 0, "k001").value().has_value());

  // Compaction at 1500 deletes exactly what the model says expired then, and nothing of
  // the view without a ttl. Reading at time 0 afterwards hides nothing: what is read is
  // what is left on disk.
  now->store(1500);
  REQUIRE(d.flush().ok());
  REQUIRE(d.compact(sessions).ok());
  REQUIRE(d.compact(plain).ok());
  CHECK(d.stats(sessions).value().expired_keys == 600 - at_1500);
  CHECK(d.stats(plain).value().expired_keys == 0);
  CHECK(d.stats(sessions).value().estimated_keys == at_1500);
  now->store(0);
  size_t on_disk = 0, plain_on_disk = 0;
  auto snap = d.read_snapshot();
  for (int32_t p = 0; p < 3; ++p) {
    for (auto it = snap->scan(sessions, p, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++on_disk;
    for (auto it = snap->scan(plain, p, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++plain_on_disk;
  }
  CHECK(on_disk == at_1500);
  CHECK(plain_on_disk == 600);
}

TEST_CASE("a ttl is refused for an unknown view, a windowed view, and when not positive") {
  temp_dir dir;
  db_options o;
  o.path = dir.path.string();
  o.ttl_ms["nope"] = 1000;
  auto r = db::open(o, {"a"});
  REQUIRE(!r.ok());
  CHECK(r.error().message().find("'nope'") != std::string::npos);
  o.ttl_ms = {{"a", 0}};
  r = db::open(o, {"a"});
  REQUIRE(!r.ok());
  CHECK(r.error().message().find("positive") != std::string::npos);
  kstate::window_spec spec;
  spec.size_ms = 1000;
  REQUIRE(kstate::normalize(spec).ok());
  o.ttl_ms = {{"a", 10}};
  o.windowed["a"] = windowed_store{spec, "a#stream_time"};
  r = db::open(o, {"a"});
  REQUIRE(!r.ok());
  CHECK(r.error().message().find("windowed") != std::string::npos);
}

TEST_CASE("a partition copied from a peer leaves out keys expired there, and the rest keep their times") {
  temp_dir src_dir, dst_dir;
  auto now = std::make_shared<std::atomic<int64_t>>(1000);
  auto options = [&](const temp_dir& d) {
    db_options o;
    o.path = d.path.string();
    o.ttl_ms = {{"sessions", 500}};
    o.clock = [now] { return now->load(); };
    o.verify_files_interval_ms = 0;
    return o;
  };
  auto src = db::open(options(src_dir), {"sessions"});
  auto dst = db::open(options(dst_dir), {"sessions"});
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  auto& s = *src.value();
  auto& d = *dst.value();
  auto view = *s.find_view("sessions");
  // Times 0..1499 (key i at time i): at 1000, keys 0..500 are expired (time + 500 <= 1000).
  auto b = s.new_batch();
  for (int i = 0; i < 1500; ++i) {
    char key[8];
    snprintf(key, sizeof key, "k%04d", i);
    b.put(view, 0, key, kstate::frame_value(i, i, "v"));
  }
  b.set_position(view, 0, 1500);
  REQUIRE(s.write(b).ok());

  // The copy, as a bootstrap sends it: a scan of the source's snapshot.
  auto loader = d.load_partition(view, 0);
  REQUIRE(loader.ok());
  auto snap = s.read_snapshot();
  for (auto it = snap->scan(view, 0, {}, {}, false, scan_use::sweep); it->valid(); it->next())
    REQUIRE((*loader)->add(it->key(), it->value()).ok());
  CHECK((*loader)->entries() == 1500 - 501);
  REQUIRE((*loader)->commit({{"sessions", 1500}}).ok());

  // On the receiver, keys expire when they would have on the source.
  for (int64_t at : {int64_t{1000}, int64_t{1200}, int64_t{1999}, int64_t{2000}}) {
    now->store(at);
    size_t live = 0;
    auto r = d.read_snapshot();
    for (auto it = r->scan(view, 0, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++live;
    // Model: keys i with i + 500 > at, of 0..1499.
    CHECK(live == static_cast<size_t>(std::clamp<int64_t>(1500 - (at - 500 + 1), 0, 1500)));
  }
  now->store(0);  // nothing hidden: the receiver holds exactly what was sent
  size_t held = 0;
  auto r = d.read_snapshot();
  for (auto it = r->scan(view, 0, {}, {}, false, scan_use::sweep); it->valid(); it->next()) ++held;
  CHECK(held == 1500 - 501);
}
