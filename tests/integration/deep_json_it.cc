// JSON nested 100,000 deep, in records and in request keys: printing such a value
// recurses once per level and would overflow a thread's stack. kstate bounds the depth
// (max_json_depth, default 128) wherever it takes JSON in, so the records are
// dead-lettered, the keys refused with 400, and the process stays up, also across a
// restart that reads the same records again.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "agg_common.h"

using namespace kstate::testing;

namespace {

std::string nested_arrays(int depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::string nested_objects(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  return s + "1" + std::string(depth, '}');
}

bool alive(uint16_t port) {
  http_client c(port);
  auto a = c.get("/livez");
  return a && a->status == 200;
}

}  // namespace

TEST_CASE(
    "values nested 100,000 deep are dead-lettered by a table and a group_by json count; the rest is exact, across a "
    "restart") {
  const auto topic = unique_name("deep"), dlq = unique_name("deep-dlq");
  create_topic(topic, 3);
  create_topic(dlq, 1);

  // 598 ordinary orders of 40 users, and two deep values among them, each under a key
  // of its own: arrays nested 100,000 deep where the group key is, and objects nested
  // 100,000 deep.
  std::vector<produced> records;
  std::set<size_t> deep_at;
  table_model table;
  std::map<std::string, int64_t> per_user;
  for (int i = 0; i < 600; ++i) {
    if (i == 200 || i == 400) {
      const std::string v = i == 200 ? "{\"user\":{\"id\":" + nested_arrays(100'000) + "}}" : nested_objects(100'000);
      deep_at.insert(records.size());
      records.push_back({"deep-" + std::to_string(i), v});
      continue;
    }
    const std::string user = "u" + std::to_string(i % 40);
    produced r{"order-" + std::to_string(i % 97),
               "{\"user\":{\"id\":\"" + user + "\"},\"i\":" + std::to_string(i) + "}"};
    apply_record(table, r);
    ++per_user[user];
    records.push_back(r);
  }
  const auto where = produce_bytes(topic, records);
  const std::string state_dir = temp_dir("kstate-deep");

  kstate_process ks(unique_name("deep-app"),
                    {{"orders", topic, "json", dlq},
                     {"per_user", topic, "json", dlq, "string", "kind: count, group_by: {json: user.id}"}},
                    state_dir);

  auto check_state = [&] {
    // Every record but the deep ones is reflected, key by key, in both views.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (ks.position_sum("orders") < static_cast<int64_t>(records.size()) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(ks.position_sum("orders") == static_cast<int64_t>(records.size()));
    REQUIRE(wait_total(ks.port(), "per_user", 598, std::chrono::seconds(120)) == 598);
    http_client h(ks.port());
    std::vector<std::string> keys{"deep-200", "deep-400"};
    for (int k = 0; k < 97; ++k) keys.push_back("order-" + std::to_string(k));
    for (const auto& key : keys) {
      auto a = h.get("/v1/stores/orders/keys/" + key);
      REQUIRE(a);
      CAPTURE(key);
      auto it = table.find(key);
      REQUIRE(a->status == (it == table.end() ? 404 : 200));
      if (it != table.end()) CHECK(a->body_json()["value"] == json::parse(it->second));
    }
    // A range renders every stored value.
    auto all = read_store(ks.port(), "orders");
    CHECK(all.size() == table.size());
    std::map<std::string, int64_t> got;
    for (const auto& [k, v] : read_store(ks.port(), "per_user")) got[k] = v.get<int64_t>();
    CHECK(got == per_user);
    CHECK(alive(ks.port()));
  };

  ks.start();
  ks.wait_ready();
  check_state();
  // One rejection per view for each deep value, counted and dead-lettered.
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 4);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == 4);

  // The dead letters are the deep records, from their own topic, partition and offset,
  // once per view, with a reason naming the limit.
  std::map<std::pair<int32_t, int64_t>, size_t> deep_where;
  for (size_t i : deep_at) deep_where[where[i]] = i;
  auto check_dead_letters = [&](size_t total, std::vector<const char*> views_of_last) {
    std::multiset<std::tuple<std::string, int32_t, int64_t>> expected, dead;
    for (size_t i : deep_at)
      for (const char* view : {"orders", "per_user"}) expected.insert({view, where[i].first, where[i].second});
    for (size_t i : deep_at)
      for (const char* view : views_of_last) expected.insert({view, where[i].first, where[i].second});
    for (const auto& r : consume_all(dlq, total)) {
      const std::pair<int32_t, int64_t> at{std::stoi(r.headers.at("kstate.partition")),
                                           std::stoll(r.headers.at("kstate.offset"))};
      CHECK(r.headers.at("kstate.topic") == topic);
      CHECK(r.headers.at("kstate.reason").find("max_json_depth (128)") != std::string::npos);
      REQUIRE(deep_where.count(at) == 1);
      CHECK(r.value == records[deep_where.at(at)].value);
      dead.insert({r.headers.at("kstate.view"), at.first, at.second});
    }
    CHECK(dead == expected);
  };
  check_dead_letters(4, {});

  // Keys given as JSON are bounded the same way: 400 bad key encoding, not a crash.
  {
    http_client h(ks.port());
    auto a = h.get("/v1/stores/orders/keys/" + pct(nested_arrays(200)) + "?key_format=json");
    REQUIRE(a);
    CHECK(a->status == 400);
    CHECK(a->body_json()["error_code"] == 40002);
    auto b = h.post("/v1/stores/orders/keys:batchGet", "application/json",
                    json{{"key_format", "json"}, {"keys", {nested_arrays(100'000)}}}.dump());
    REQUIRE(b);
    CHECK(b->status == 400);
    CHECK(b->body_json()["error_code"] == 40002);
    // At the limit a key is still a key (absent here).
    auto c = h.get("/v1/stores/orders/keys/" + pct(nested_arrays(128)) + "?key_format=json");
    REQUIRE(c);
    CHECK(c->status == 404);
    CHECK(alive(ks.port()));
  }

  // A restart: still up, still exact, nothing read or dead-lettered again.
  REQUIRE(ks.terminate() == 0);
  ks.start();
  ks.wait_ready();
  check_state();
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 0);

  // Without its state directory the table reads its topic again from the beginning,
  // deep records included, and the aggregate restores from its changelog: the deep
  // records are refused again, and nothing else changes.
  REQUIRE(ks.terminate() == 0);
  std::filesystem::remove_all(state_dir);
  ks.start();
  ks.wait_ready();
  check_state();
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 2);
  check_dead_letters(6, {"orders"});
  CHECK(ks.terminate() == 0);
}
