#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <random>

#include "core/json_check.h"
#include "core/value_codec.h"
#include "ingest/batch_builder.h"
#include "ingest/membership.h"
#include "ingest/partitioner.h"
#include "storage/db.h"

using namespace kstate;
using namespace kstate::ingest;

namespace {
struct fixture {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kstate-ingest-" + std::to_string(std::random_device{}()));
  std::vector<view_def> views;
  std::unique_ptr<storage::db> db;
  fixture() {
    view_def users{.name = "users",
                   .topic = "users-topic",
                   .key_format = data_format::string,
                   .value_format = data_format::json,
                   .dead_letter_topic = "dlq"};
    view_def raw{
        .name = "raw", .topic = "users-topic", .key_format = data_format::bytes, .value_format = data_format::bytes};
    view_def other{.name = "other", .topic = "other-topic", .value_format = data_format::string};
    views = {users, raw, other};
    db = std::move(storage::db::open({.path = dir.string()}, {"users", "raw", "other"}).value());
  }
  ~fixture() {
    db.reset();
    std::filesystem::remove_all(dir);
  }
};
record rec(std::string_view topic, int32_t p, int64_t off, std::optional<std::string_view> k,
           std::optional<std::string_view> v) {
  return record{topic, p, off, k, v};
}
}  // namespace

TEST_CASE("validate: formats decide what is malformed; tombstones are always valid") {
  view_def json_view{.name = "j", .topic = "t", .key_format = data_format::string, .value_format = data_format::json};
  CHECK(validate(json_view, rec("t", 0, 0, "k", R"({"a":1})"), 128).empty());
  CHECK(validate(json_view, rec("t", 0, 0, "k", "[1,2]"), 128).empty());
  CHECK_FALSE(validate(json_view, rec("t", 0, 0, "k", "{broken"), 128).empty());
  CHECK_FALSE(validate(json_view, rec("t", 0, 0, "k", ""), 128).empty());
  CHECK(validate(json_view, rec("t", 0, 0, "k", std::nullopt), 128).empty());
  CHECK_FALSE(validate(json_view, rec("t", 0, 0, std::nullopt, "1"), 128).empty());
  CHECK_FALSE(validate(json_view, rec("t", 0, 0, "\xc0\xaf", "1"), 128).empty());  // overlong '/'
  view_def bytes_view{.name = "b", .topic = "t", .key_format = data_format::bytes, .value_format = data_format::bytes};
  CHECK(validate(bytes_view, rec("t", 0, 0, "\xc0\xaf", "\xff\x00"), 128).empty());
  view_def str_view{.name = "s", .topic = "t", .value_format = data_format::string};
  CHECK(validate(str_view, rec("t", 0, 0, "k", "h\xc3\xa9llo \xf0\x9f\x98\x80"), 128).empty());
  CHECK_FALSE(validate(str_view, rec("t", 0, 0, "k", "\xed\xa0\x80"), 128).empty());  // surrogate
}

TEST_CASE("validate: JSON keys and values deeper than max_json_depth are invalid, with a reason naming the limit") {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  view_def v{.name = "j", .topic = "t", .key_format = data_format::json, .value_format = data_format::json};
  // At the limit: valid; one deeper: refused, for keys and values, arrays and objects.
  CHECK(validate(v, rec("t", 0, 0, nested(128), nested(128)), 128).empty());
  CHECK(validate(v, rec("t", 0, 0, "1", R"({"a":{"b":[]}})"), 3).empty());
  CHECK(validate(v, rec("t", 0, 0, "1", R"({"a":{"b":[]}})"), 2) == "value is nested deeper than max_json_depth (2)");
  CHECK(validate(v, rec("t", 0, 0, nested(129), "1"), 128) == "key is nested deeper than max_json_depth (128)");
  const std::string deep = nested(100'000);
  CHECK(validate(v, rec("t", 0, 0, "1", deep), 128) == "value is nested deeper than max_json_depth (128)");
  // Not JSON at all still says so.
  CHECK(validate(v, rec("t", 0, 0, "1", "[1,"), 128) == "value is not valid JSON (value_format json)");
  // Other formats are not JSON: no depth applies.
  view_def s{.name = "s", .topic = "t", .value_format = data_format::string};
  CHECK(validate(s, rec("t", 0, 0, "k", deep), 128).empty());
}

TEST_CASE("a record nested too deep is rejected by the batch like any invalid record, position passing it") {
  fixture f;
  auto made = batch_builder::create(*f.db, f.views, 16);
  REQUIRE(made.ok());
  auto& b = *made.value();
  const std::string deep = std::string(17, '[') + std::string(17, ']');
  const std::string ok = std::string(16, '[') + std::string(16, ']');
  b.add(rec("users-topic", 1, 7, "a", ok));
  b.add(rec("users-topic", 1, 8, "b", deep));
  REQUIRE(b.rejections().size() == 1);
  CHECK(b.rejections()[0].view == "users");
  CHECK(b.rejections()[0].offset == 8);
  CHECK(b.rejections()[0].dead_letter_topic == "dlq");
  CHECK(b.rejections()[0].reason == "value is nested deeper than max_json_depth (16)");
  CHECK(b.partition_counts().at({"users-topic", 1}).invalid == 1);
  REQUIRE(f.db->write(b.batch()).ok());
  auto users = *f.db->find_view("users");
  CHECK(f.db->get(users, 1, "a")->value == frame_value(7, ok));
  CHECK_FALSE(f.db->get(users, 1, "b")->value);
  CHECK(f.db->stored_position(users, 1).value() == 9);
}

TEST_CASE("one batch carries every view's state changes and each partition's next offset") {
  fixture f;
  auto made = batch_builder::create(*f.db, f.views);
  REQUIRE(made.ok());
  auto& b = *made.value();
  b.add(rec("users-topic", 2, 10, "alice", R"({"n":1})"));
  b.add(rec("users-topic", 2, 11, "bob", "not json"));
  b.add(rec("users-topic", 2, 12, "alice", std::nullopt));
  b.add(rec("other-topic", 0, 5, "x", "hello"));

  auto users = *f.db->find_view("users"), raw = *f.db->find_view("raw"), other = *f.db->find_view("other");
  // Expected, written out from the rules: users applies alice put, skips bob (invalid
  // JSON), applies alice delete; raw applies all three. A key changed twice in the batch
  // is written once, with its last change, and the changes come in (view, partition,
  // key) order; then each (view, partition)'s final position, once, in view order. The
  // position passes bob for users too.
  struct exp {
    storage::view_id v;
    int32_t p;
    std::string key;
    std::optional<std::string> val;
    std::optional<int64_t> pos;
  };
  std::vector<exp> expected{
      {users, 2, "alice", {}, {}},
      {raw, 2, "alice", {}, {}},
      {raw, 2, "bob", frame_value(11, "not json"), {}},
      {other, 0, "x", frame_value(5, "hello"), {}},
  };
  std::sort(expected.begin(), expected.end(),
            [](const exp& a, const exp& b) { return std::tie(a.v, a.p, a.key) < std::tie(b.v, b.p, b.key); });
  expected.push_back({users, 2, "", {}, 13});
  expected.push_back({raw, 2, "", {}, 13});
  expected.push_back({other, 0, "", {}, 6});
  auto entries = b.batch().entries();
  REQUIRE(entries.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(entries[i].view == expected[i].v);
    CHECK(entries[i].partition == expected[i].p);
    CHECK(entries[i].position == expected[i].pos);
    if (!expected[i].pos) {
      CHECK(entries[i].key == expected[i].key);
      CHECK(entries[i].value == expected[i].val);
    }
  }
  REQUIRE(b.rejections().size() == 1);
  CHECK(b.rejections()[0].offset == 11);
  CHECK(b.rejections()[0].view == "users");
  CHECK(b.rejections()[0].dead_letter_topic == "dlq");
  CHECK(b.rejections()[0].value == "not json");
  CHECK(b.touched().at({"users-topic", 2}) == 13);
  CHECK(b.partition_counts().at({"users-topic", 2}).invalid == 1);
  CHECK(b.pending_records() == 4);

  REQUIRE(f.db->write(b.batch()).ok());
  CHECK_FALSE(f.db->get(users, 2, "alice")->value);
  CHECK(f.db->get(raw, 2, "bob")->value == frame_value(11, "not json"));
  CHECK(f.db->stored_position(users, 2).value() == 13);
  b.reset();
  CHECK(b.batch().empty());
  CHECK(b.rejections().empty());
}

TEST_CASE("a view that already reflects an offset does not apply it again") {
  fixture f;
  auto made = batch_builder::create(*f.db, f.views);
  REQUIRE(made.ok());
  auto& b = *made.value();
  b.set_view_position("users-topic", 0, "users", 100);
  b.set_view_position("users-topic", 0, "raw", 50);
  CHECK(b.resume_offset("users-topic", 0) == 50);  // the slowest view decides
  CHECK_FALSE(b.resume_offset("users-topic", 1));
  b.add(rec("users-topic", 0, 60, "k", R"("v")"));
  auto entries = b.batch().entries();
  REQUIRE(entries.size() == 2);  // only raw: users is already past 60
  CHECK(entries[0].view == *f.db->find_view("raw"));
  CHECK(entries[1].position == 61);
}

TEST_CASE("partitioners: murmur2 matches the Java client's default partitioner") {
  // Expected values computed by the Java client itself (kafka-clients 3.9.2):
  //   Utils.toPositive(Utils.murmur2(key.getBytes(UTF_8))) % n   for n = 1, 3, 6, 12, 100
  // which is what its default partitioner does for keyed records.
  struct vec {
    const char* key;
    int expected[5];
  };
  const vec vectors[] = {
      {"", {0, 0, 3, 9, 81}},
      {"a", {0, 1, 4, 4, 24}},
      {"key", {0, 1, 1, 1, 81}},
      {"kstate", {0, 1, 1, 1, 33}},
      {"user-42", {0, 1, 4, 4, 60}},
      {"alice", {0, 0, 3, 9, 49}},
      {"h\xc3\xa9llo", {0, 0, 0, 6, 2}},
      {"a/b", {0, 0, 0, 6, 10}},
      {"\xf0\x9f\x98\x80", {0, 0, 3, 9, 17}},
      {"0123456789abcdef", {0, 0, 0, 0, 52}},
  };
  const int counts[] = {1, 3, 6, 12, 100};
  auto murmur2 = make_partitioner("murmur2");
  REQUIRE(murmur2);
  for (const auto& v : vectors) {
    for (int i = 0; i < 5; ++i) {
      CAPTURE(v.key);
      CAPTURE(counts[i]);
      CHECK((*murmur2)(v.key, counts[i]) == v.expected[i]);
    }
  }
}

TEST_CASE("partitioners: every name maps into range; unknown names are refused") {
  for (const char* name : {"murmur2", "consistent", "fnv1a"}) {
    auto p = make_partitioner(name);
    REQUIRE(p);
    for (int n : {1, 2, 7}) {
      for (const char* key : {"", "x", "some longer key"}) {
        auto got = (*p)(key, n);
        CHECK(got >= 0);
        CHECK(got < n);
      }
    }
    CHECK((*p)("x", 0) == -1);
  }
  CHECK_FALSE(make_partitioner("random"));
  CHECK_FALSE(make_partitioner(""));
}

TEST_CASE("consumer-protocol assignments decode as the Kafka protocol lays them out") {
  // ConsumerProtocolAssignment v1, written out byte by byte from the protocol's schema:
  // version 1; 2 topics: "orders" [0, 5], "t" [70000]; user data of 3 bytes.
  const std::vector<unsigned char> bytes = {0x00, 0x01,                                     // version
                                            0x00, 0x00, 0x00, 0x02,                         // 2 topics
                                            0x00, 0x06, 'o',  'r',  'd',  'e',  'r',  's',  // "orders"
                                            0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
                                            0x00, 0x00,                                      // 2 partitions: 0,
                                            0x00, 0x05,                                      // 5
                                            0x00, 0x01, 't',                                 // "t"
                                            0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x11, 0x70,  // 1 partition: 70000
                                            0x00, 0x00, 0x00, 0x03, 0xAA, 0xBB, 0xCC};       // user data
  using parts = std::vector<std::pair<std::string, int32_t>>;
  auto got = decode_consumer_assignment(bytes.data(), bytes.size());
  REQUIRE(got);
  CHECK(*got == parts{{"orders", 0}, {"orders", 5}, {"t", 70000}});
  // Without the user data (version 0 has none to speak of): the same partitions.
  const size_t partitions_end = bytes.size() - 7;
  got = decode_consumer_assignment(bytes.data(), partitions_end);
  REQUIRE(got);
  CHECK(got->size() == 3);
  // Cut anywhere inside the topics, it is refused rather than read past its end.
  for (size_t n = 0; n < partitions_end; ++n) CHECK_MESSAGE(!decode_consumer_assignment(bytes.data(), n), n);
  // An empty assignment (a member that holds nothing).
  const std::vector<unsigned char> none = {0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  got = decode_consumer_assignment(none.data(), none.size());
  REQUIRE(got);
  CHECK(got->empty());
  // Negative counts and lengths, and counts larger than the bytes, are refused.
  auto with = [&](size_t at, std::vector<unsigned char> v) {
    auto b = bytes;
    std::copy(v.begin(), v.end(), b.begin() + static_cast<std::ptrdiff_t>(at));
    return decode_consumer_assignment(b.data(), b.size());
  };
  CHECK_FALSE(with(2, {0xFF, 0xFF, 0xFF, 0xFF}));   // topic count -1
  CHECK_FALSE(with(6, {0xFF, 0xFF}));               // topic name length -1
  CHECK_FALSE(with(14, {0x7F, 0xFF, 0xFF, 0xFF}));  // 2^31-1 partitions
  CHECK_FALSE(with(18, {0x80, 0x00, 0x00, 0x00}));  // partition -2^31
}

TEST_CASE("member client.id: the endpoint survives encoding, and only kstate's encoding yields one") {
  // The usual case stays readable in Kafka's own tools: nothing is escaped.
  CHECK(encode_member_client_id("kstate", "http://127.0.0.1:1111") == "kstate;endpoint=http://127.0.0.1:1111");
  CHECK(endpoint_from_client_id("kstate;endpoint=http://127.0.0.1:1111") == "http://127.0.0.1:1111");
  // Separators and escapes inside either part cannot be mistaken for the boundary.
  auto tricky = encode_member_client_id("a;endpoint=http://evil:1 %", "http://h:8080/p;x=%41?q=1");
  CHECK(tricky == "a%3Bendpoint=http://evil:1%20%25;endpoint=http://h:8080/p%3Bx=%2541?q=1");
  CHECK(endpoint_from_client_id(tricky) == "http://h:8080/p;x=%41?q=1");
  // Non-ASCII and spaces travel as printable ASCII only.
  auto utf8 = encode_member_client_id("k", "http://h\xC3\xA9te:1/a b");
  for (unsigned char c : utf8) CHECK((c >= 0x21 && c <= 0x7e));
  CHECK(endpoint_from_client_id(utf8) == "http://h\xC3\xA9te:1/a b");
  // Later fields are skipped, so a newer kstate can add some.
  CHECK(endpoint_from_client_id("k;zone=eu-1;endpoint=http://a:1") == "http://a:1");
  // No endpoint: other clients in the group, no endpoint given, malformed escapes.
  CHECK(encode_member_client_id("kstate", "") == "kstate");
  CHECK_FALSE(endpoint_from_client_id("kstate"));
  CHECK_FALSE(endpoint_from_client_id("consumer-my-group-1"));
  CHECK_FALSE(endpoint_from_client_id(""));
  CHECK_FALSE(endpoint_from_client_id("k;endpoint="));
  CHECK_FALSE(endpoint_from_client_id("k;zone=eu-1"));
  CHECK_FALSE(endpoint_from_client_id("k;endpoint=http://a:1%"));
  CHECK_FALSE(endpoint_from_client_id("k;endpoint=http://a:1%4"));
  CHECK_FALSE(endpoint_from_client_id("k;endpoint=http://a:1%zz"));
}

namespace {

// A topic read by three table views: by record time, by ingest time (ttl 1000 ms each),
// and without a ttl.
struct ttl_fixture {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kstate-ingest-ttl-" + std::to_string(std::random_device{}()));
  std::vector<view_def> views;
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(0);
  ttl_fixture() {
    views = {view_def{.name = "by_record",
                      .topic = "t",
                      .value_format = data_format::string,
                      .ttl = ttl_spec{1000, ttl_clock::record_time}},
             view_def{.name = "by_ingest",
                      .topic = "t",
                      .value_format = data_format::string,
                      .ttl = ttl_spec{1000, ttl_clock::ingest_time}},
             view_def{.name = "forever", .topic = "t", .value_format = data_format::string}};
  }
  ~ttl_fixture() { std::filesystem::remove_all(dir); }
  // An empty state directory each time: a rebuild.
  std::unique_ptr<storage::db> open_fresh() {
    std::filesystem::remove_all(dir);
    storage::db_options o{.path = dir.string()};
    o.ttl_ms = {{"by_record", 1000}, {"by_ingest", 1000}};
    o.clock = [n = now] { return n->load(); };
    o.verify_files_interval_ms = 0;
    return std::move(storage::db::open(o, {"by_record", "by_ingest", "forever"}).value());
  }
  std::unique_ptr<batch_builder> builder(storage::db& db) {
    return std::move(batch_builder::create(db, views, default_max_json_depth, [n = now] { return n->load(); }).value());
  }
};

std::optional<int64_t> stored_time(storage::db& db, const char* view, std::string_view key) {
  auto got = db.get(*db.find_view(view), 0, key);
  REQUIRE(got.ok());
  REQUIRE(got->value);
  return unframe_value(*got->value)->time;
}

}  // namespace

TEST_CASE("values of views with a ttl carry the record's time, or the ingest time, bounded while catching up") {
  ttl_fixture f;
  auto db = f.open_fresh();
  auto b = f.builder(*db);
  b->set_catch_up("t", 0, 3);  // offsets 0..2 existed when the partition was assigned
  f.now->store(50'000);
  auto add = [&](int64_t offset, const char* key, int64_t ts) {
    record r{"t", 0, offset, key, "v"};
    r.timestamp = ts;
    b->add(r);
  };
  add(0, "a", 10'000);  // catching up, written long ago
  add(1, "b", 60'000);  // catching up, timestamp ahead of the clock
  add(2, "c", -1);      // catching up, no timestamp
  add(3, "d", 10'000);  // first applied now, written long ago (a backfill)
  add(4, "e", -1);
  REQUIRE(db->write(b->batch()).ok());
  b->reset();

  f.now->store(0);  // reads at time 0 hide nothing: the stored times are all read back
  struct expect {
    const char* key;
    int64_t by_record, by_ingest;
  };
  for (auto [key, by_record, by_ingest] :
       {expect{"a", 10'000, 10'000}, expect{"b", 60'000, 50'000}, expect{"c", 50'000, 50'000},
        expect{"d", 10'000, 50'000}, expect{"e", 50'000, 50'000}}) {
    CAPTURE(key);
    CHECK(stored_time(*db, "by_record", key) == by_record);
    CHECK(stored_time(*db, "by_ingest", key) == by_ingest);
    CHECK(stored_time(*db, "forever", key) == std::nullopt);  // a plain frame: no cost, no expiry
  }
  // Once the clock is past time + ttl the key is gone from the view with that time only.
  f.now->store(50'999);
  CHECK(!db->get(*db->find_view("by_record"), 0, "a")->value);
  CHECK(!db->get(*db->find_view("by_ingest"), 0, "a")->value);
  CHECK(!db->get(*db->find_view("by_record"), 0, "d")->value);
  CHECK(db->get(*db->find_view("by_ingest"), 0, "d")->value);
  CHECK(db->get(*db->find_view("forever"), 0, "a")->value);
  f.now->store(51'000);
  CHECK(!db->get(*db->find_view("by_ingest"), 0, "d")->value);
  CHECK(db->get(*db->find_view("by_record"), 0, "b")->value);  // by its (future) timestamp: until 61,000
}

TEST_CASE("a key expired before a rebuild from the topic stays expired after it, in both clock modes") {
  // Model: each record is written at ts, first applied live at ts + lag (the consumer's
  // delay), and the key is checked at q. After the state is lost, the topic is applied
  // again from its beginning at rebuild time r >= q, every record catching up. A key
  // that was expired at q must be expired at every later instant after the rebuild.
  ttl_fixture f;
  std::mt19937 rng(5);
  struct rec_t {
    std::string key;
    int64_t ts, lag;
  };
  std::vector<rec_t> log;
  for (int i = 0; i < 300; ++i)
    log.push_back(rec_t{"k" + std::to_string(rng() % 120), 100'000 + i * 20, static_cast<int64_t>(rng() % 3000)});
  const int64_t q = 100'000 + 300 * 20 + 500;

  std::map<std::string, std::pair<bool, bool>> served_at_q;  // key -> (by_record, by_ingest)
  {
    auto db = f.open_fresh();
    auto b = f.builder(*db);
    b->set_catch_up("t", 0, 0);  // a new topic: nothing to catch up on
    for (size_t i = 0; i < log.size(); ++i) {
      f.now->store(log[i].ts + log[i].lag);
      record r{"t", 0, static_cast<int64_t>(i), log[i].key, "v"};
      r.timestamp = log[i].ts;
      b->add(r);
      REQUIRE(db->write(b->batch()).ok());
      b->reset();
    }
    f.now->store(q);
    for (const auto& r : log)
      served_at_q[r.key] = {db->get(*db->find_view("by_record"), 0, r.key)->value.has_value(),
                            db->get(*db->find_view("by_ingest"), 0, r.key)->value.has_value()};
  }
  size_t expired_by_record = 0, expired_by_ingest = 0;
  for (const auto& [k, s] : served_at_q) {
    expired_by_record += !s.first;
    expired_by_ingest += !s.second;
  }
  REQUIRE(expired_by_record > 10);  // the model has keys of each kind
  REQUIRE(expired_by_ingest > 10);
  REQUIRE(expired_by_record < served_at_q.size());

  for (int64_t rebuild_at : {q, q + 700, q + 5000}) {
    CAPTURE(rebuild_at);
    auto db = f.open_fresh();
    auto b = f.builder(*db);
    b->set_catch_up("t", 0, static_cast<int64_t>(log.size()));
    f.now->store(rebuild_at);
    for (size_t i = 0; i < log.size(); ++i) {
      record r{"t", 0, static_cast<int64_t>(i), log[i].key, "v"};
      r.timestamp = log[i].ts;
      b->add(r);
    }
    REQUIRE(db->write(b->batch()).ok());
    for (const auto& [key, s] : served_at_q) {
      CAPTURE(key);
      if (!s.first) CHECK(!db->get(*db->find_view("by_record"), 0, key)->value);
      if (!s.second) CHECK(!db->get(*db->find_view("by_ingest"), 0, key)->value);
      // By record time a rebuild changes nothing: a key served at q still is, if asked at q.
      if (rebuild_at == q) CHECK(db->get(*db->find_view("by_record"), 0, key)->value.has_value() == s.first);
    }
  }
}

TEST_CASE("a versioned view gets every record as a version, out of order and in one batch alike") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kstate-ingest-versioned-" + std::to_string(std::random_device{}()));
  std::filesystem::remove_all(dir);
  std::vector<view_def> views{view_def{.name = "hist",
                                       .topic = "t",
                                       .value_format = data_format::string,
                                       .dead_letter_topic = "dlq",
                                       .versioned = versioned_spec{10'000, 1'000}},
                              view_def{.name = "latest", .topic = "t", .value_format = data_format::string}};
  storage::db_options o{.path = dir.string()};
  o.versioned["hist"] = storage::versioned_store{10'000, stream_time_position_name(views[0])};
  auto db = std::move(storage::db::open(o, {"hist", "latest"}).value());
  const int64_t now = 1'000'000;
  auto b = std::move(batch_builder::create(*db, views, default_max_json_depth, [] { return now; }).value());
  // Model: key -> (timestamp -> value, nullopt for a tombstone), and the latest-only view's
  // value (the last record applied, whatever its timestamp).
  std::map<std::string, std::map<int64_t, std::optional<std::string>>> model;
  std::map<std::string, std::optional<std::string>> last;
  std::mt19937 rng(3);
  int64_t offset = 0;
  std::vector<std::string> values;  // the records' bytes outlive the batch
  values.reserve(400);
  for (int batch = 0; batch < 20; ++batch) {
    for (int i = 0; i < 20; ++i) {
      const std::string key = "k" + std::to_string(rng() % 4);
      const int64_t ts = now - 5'000 + static_cast<int64_t>(rng() % 4'000);  // never too late, often out of order
      values.push_back(rng() % 5 == 0 ? std::string() : "v" + std::to_string(offset));
      std::optional<std::string_view> v;
      if (!values.back().empty()) v = values.back();
      record r{"t", 0, offset++, key, v};
      r.timestamp = ts;
      b->add(r);
      model[key][ts] = v ? std::optional<std::string>(std::string(*v)) : std::nullopt;
      last[key] = model[key][ts];
    }
    REQUIRE(db->write(b->batch()).ok());
    b->reset();
  }
  // Refused with a reason, counted, dead-lettered: no timestamp, or too far ahead.
  record none{"t", 0, offset++, "k0", "x"};
  b->add(none);
  record ahead{"t", 0, offset++, "k0", "y"};
  ahead.timestamp = now + 1'001;
  b->add(ahead);
  REQUIRE(b->take().rejections.size() == 2);

  auto hist = *db->find_view("hist");
  auto snap = db->read_snapshot();
  for (const auto& [key, versions] : model) {
    for (int64_t t = now - 5'100; t < now; t += 37) {
      auto got = snap->version_at(hist, 0, key, t);
      REQUIRE(got.ok());
      auto v = versions.upper_bound(t);
      if (v == versions.begin()) {
        CHECK_FALSE(got->has_value());
        continue;
      }
      --v;
      REQUIRE(got->has_value());
      CHECK((*got)->valid_from == v->first);
      CHECK((*got)->value.has_value() == v->second.has_value());
      if (v->second) CHECK(unframe_value(*(*got)->value)->value == *v->second);
    }
    // The latest value is the newest by timestamp, not the last applied.
    auto latest = db->get(hist, 0, key);
    const auto& newest = versions.rbegin()->second;
    CHECK(latest->value.has_value() == newest.has_value());
    if (newest) CHECK(unframe_value(*latest->value)->value == *newest);
    auto plain = db->get(*db->find_view("latest"), 0, key);
    CHECK(plain->value.has_value() == last[key].has_value());
  }
  snap.reset();
  db.reset();
  std::filesystem::remove_all(dir);
}
