// db::get answers a key's value with the position of the write it came from, whether
// it reads the position from RocksDB or from memory (storage/src/position_cache.h); so
// does a snapshot taken for the positions of some partitions (pages, batches, counts).

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "storage/db.h"

using namespace kstate::storage;

namespace {

struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    path = std::filesystem::temp_directory_path() / ("kstate-positions-" + std::to_string(std::random_device{}()));
    std::filesystem::remove_all(path);
  }
  ~scratch_dir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("a lookup's position is the one of the write its value came from, with writes racing the reads") {
  scratch_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"t"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  const auto t = *d.find_view("t");
  // Write n puts "n" under key k and moves the position to n: a value read with another
  // position is a value and a position of two different writes.
  constexpr int writes = 20'000;
  std::atomic<bool> done{false};
  std::atomic<int> failed_writes{0};
  std::thread writer([&] {
    for (int n = 1; n <= writes; ++n) {
      auto b = d.new_batch();
      b.put(t, 5, "k", std::to_string(n));
      b.put(t, 5, "other-" + std::to_string(n % 64), "x");
      b.set_position(t, 5, n);
      if (!d.write(b).ok()) ++failed_writes;
    }
    done = true;
  });
  std::atomic<uint64_t> reads{0}, mismatched{0}, errors{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      while (!done) {
        auto g = d.get(t, 5, "k");
        ++reads;
        if (!g.ok()) {
          ++errors;
          continue;
        }
        if (!g->value) {
          // Before the first write: no value, no position.
          if (g->position) ++mismatched;
          continue;
        }
        if (!g->position || *g->value != std::to_string(*g->position)) ++mismatched;
      }
    });
  writer.join();
  for (auto& r : readers) r.join();
  CHECK(failed_writes == 0);
  CHECK(errors == 0);
  CHECK(mismatched == 0);
  INFO("reads: " << reads << ", from memory: " << d.cached_position_reads());
  CHECK(reads > 0);
  // With the writes over, every lookup takes the position from memory.
  const auto before = d.cached_position_reads();
  auto last = d.get(t, 5, "k");
  REQUIRE(last.ok());
  CHECK(last->value == std::to_string(writes));
  CHECK(last->position == writes);
  CHECK(d.cached_position_reads() == before + 1);
}

TEST_CASE("a snapshot's positions are those of the writes its data came from, with writes racing") {
  scratch_dir dir;
  auto opened = db::open(db_options{.path = dir.path.string()}, {"t"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  const auto t = *d.find_view("t");
  // Write n puts "n" under key k of partitions 3 and 5 and moves both positions to n.
  constexpr int writes = 20'000;
  const std::vector<int32_t> parts{3, 5};
  std::atomic<bool> done{false};
  std::atomic<int> failed_writes{0};
  std::thread writer([&] {
    for (int n = 1; n <= writes; ++n) {
      auto b = d.new_batch();
      for (int32_t p : parts) {
        b.put(t, p, "k", std::to_string(n));
        b.set_position(t, p, n);
      }
      if (!d.write(b).ok()) ++failed_writes;
    }
    done = true;
  });
  std::atomic<uint64_t> reads{0}, mismatched{0}, errors{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      while (!done) {
        auto snap = d.read_snapshot(t, parts);
        auto positions = snap->positions(t, parts);
        ++reads;
        if (!positions.ok()) {
          ++errors;
          continue;
        }
        for (std::size_t i = 0; i < parts.size(); ++i) {
          auto value = snap->get(t, parts[i], "k");
          auto one = snap->position(t, parts[i]);
          if (!value.ok() || !one.ok()) {
            ++errors;
            continue;
          }
          const auto& pos = (*positions)[i];
          // Before the first write: no value, no position.
          if (!*value ? pos.has_value() : (!pos || **value != std::to_string(*pos))) ++mismatched;
          if (*one != pos) ++mismatched;
        }
      }
    });
  writer.join();
  for (auto& r : readers) r.join();
  CHECK(failed_writes == 0);
  CHECK(errors == 0);
  CHECK(mismatched == 0);
  INFO("snapshots: " << reads << ", positions from memory: " << d.cached_position_reads());
  CHECK(reads > 0);
  // With the writes over, a snapshot takes its positions from memory; a partition it was
  // not taken for is read from RocksDB, with the same answer.
  const auto before = d.cached_position_reads();
  auto snap = d.read_snapshot(t, {5});
  CHECK(d.cached_position_reads() == before + 1);
  auto p5 = snap->positions(t, {5});
  REQUIRE(p5.ok());
  CHECK((*p5)[0] == writes);
  auto p3 = snap->position(t, 3);
  REQUIRE(p3.ok());
  CHECK(*p3 == writes);
  auto absent = snap->position(t, 7);
  REQUIRE(absent.ok());
  CHECK_FALSE(absent->has_value());
}

TEST_CASE("positions found at open, written, and replaced by a partition load are the ones lookups answer") {
  scratch_dir dir, src_dir;
  {
    auto d = db::open(db_options{.path = dir.path.string()}, {"users"});
    REQUIRE(d.ok());
    auto users = *d.value()->find_view("users");
    auto b = d.value()->new_batch();
    b.put(users, 0, "a", "1");
    b.set_position(users, 0, 100);
    b.put(users, 200'000, "far", "2");  // beyond the partitions kept in memory
    b.set_position(users, 200'000, 7);
    REQUIRE(d.value()->write(b).ok());
  }
  auto opened = db::open(db_options{.path = dir.path.string()}, {"users"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  auto users = *d.find_view("users");
  auto read = [&](int32_t p, const std::string& k) {
    auto g = d.get(users, p, k);
    REQUIRE(g.ok());
    return *g;
  };
  // Found at open: answered from memory.
  uint64_t n = d.cached_position_reads();
  auto a = read(0, "a");
  CHECK(a.value == "1");
  CHECK(a.position == 100);
  CHECK(d.cached_position_reads() == n + 1);
  // A partition never written: no position, read from RocksDB.
  auto none = read(3, "a");
  CHECK_FALSE(none.value);
  CHECK_FALSE(none.position);
  // Partitions beyond the cache: the same answer, read from RocksDB.
  n = d.cached_position_reads();
  auto far = read(200'000, "far");
  CHECK(far.value == "2");
  CHECK(far.position == 7);
  CHECK(d.cached_position_reads() == n);

  // Replaced by a copy from another database: its data and its position.
  auto src = db::open(db_options{.path = src_dir.path.string()}, {"users"});
  REQUIRE(src.ok());
  auto sb = src.value()->new_batch();
  sb.put(users, 0, "b", "copied");
  sb.set_position(users, 0, 500);
  REQUIRE(src.value()->write(sb).ok());
  auto snap = src.value()->read_snapshot();
  auto loader = d.load_partition(users, 0);
  REQUIRE(loader.ok());
  for (auto it = snap->scan(users, 0, std::nullopt, std::nullopt, false, scan_use::sweep); it->valid(); it->next())
    REQUIRE((*loader)->add(it->key(), it->value()).ok());
  REQUIRE((*loader)->commit({{"users", 500}}).ok());
  n = d.cached_position_reads();
  auto gone = read(0, "a");
  CHECK_FALSE(gone.value);
  CHECK(gone.position == 500);
  auto b = read(0, "b");
  CHECK(b.value == "copied");
  CHECK(b.position == 500);
  CHECK(d.cached_position_reads() == n + 2);

  // Written again: the new position.
  auto w = d.new_batch();
  w.put(users, 0, "b", "newer");
  w.set_position(users, 0, 501);
  REQUIRE(d.write(w).ok());
  auto newer = read(0, "b");
  CHECK(newer.value == "newer");
  CHECK(newer.position == 501);
}
