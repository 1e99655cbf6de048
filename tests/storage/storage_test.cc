#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

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
  CHECK(k == std::string("\x00\x00\x01\x02" "a\0/", 7));
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
  std::sort(encoded.begin(), encoded.end(), [](const std::string& a, const std::string& b) {
    return std::string_view(a) < std::string_view(b);
  });
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
