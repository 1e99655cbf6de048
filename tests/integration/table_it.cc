// A table view materializes a topic as "last write wins, a tombstone deletes", for
// records written by the Java producer (so partitioning is the Java client's).
#include <doctest/doctest.h>

#include <random>

#include "support.h"

using namespace kstate::testing;

TEST_CASE("every key of a 200,000-record, 50,000-key topic equals the last-write-wins model") {
  const int keys = 50'000, records = 200'000, partitions = 6;
  auto topic = unique_name("table");
  create_topic(topic, partitions);

  std::mt19937 rng(20261202);
  std::vector<std::string> names;
  for (int i = 0; i < keys; ++i) names.push_back("key-" + std::to_string(i));
  // Keys that need percent-encoding in URLs, and multi-byte UTF-8.
  names[0] = "a/b";
  names[1] = "100%";
  names[2] = "ключ";
  names[3] = "emoji-\xF0\x9F\x98\x80";
  names[4] = "with space";
  names[5] = "q?x=1&y";

  std::vector<produced> recs;
  recs.reserve(records);
  std::vector<int> order(keys);
  for (int i = 0; i < keys; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) recs.push_back({names[i], R"({"seq":)" + std::to_string(recs.size()) + "}"});
  std::uniform_int_distribution<int> pick(0, keys - 1);
  std::uniform_int_distribution<int> pct100(0, 99);
  while (static_cast<int>(recs.size()) < records) {
    const auto& k = names[pick(rng)];
    if (pct100(rng) < 10) recs.push_back({k, std::nullopt});
    else recs.push_back({k, R"({"seq":)" + std::to_string(recs.size()) + R"(,"k":")" + k + "\"}"});
  }
  table_model model;
  for (const auto& r : recs) apply_record(model, r);
  produce(topic, recs);

  auto dir = temp_dir("table");
  kstate_process ks(unique_name("table-app"), {{"t", topic}}, dir + "/state");
  ks.start();
  ks.wait_ready();
  auto applied = ks.position_sum("t");
  CHECK(applied == records);

  http_client c(ks.port());
  size_t present = 0, absent = 0;
  for (const auto& k : names) {
    auto a = c.get("/v1/stores/t/keys/" + pct(k));
    REQUIRE(a);
    auto it = model.find(k);
    if (it == model.end()) {
      CHECK_MESSAGE(a->status == 404, k);
      CHECK(a->body_json()["error_code"] == 40402);
      ++absent;
    } else {
      REQUIRE_MESSAGE(a->status == 200, k << ": " << a->body);
      auto body = a->body_json();
      CHECK_MESSAGE(body["value"] == json::parse(it->second), k);
      CHECK(body["key"] == k);
      CHECK(body["position"].contains(std::to_string(body["partition"].get<int>())));
      ++present;
    }
  }
  MESSAGE("present " << present << ", deleted " << absent);
  CHECK(present == model.size());
  CHECK(absent > 0);

  auto unknown = c.get("/v1/stores/nope/keys/x");
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  CHECK(unknown->body_json()["error_code"] == 40401);
  CHECK(unknown->headers["content-type"] == "application/problem+json");

  auto bad = c.get("/v1/stores/t/keys/%zz");
  REQUIRE(bad);
  CHECK(bad->status == 400);
  auto still = c.get("/v1/stores/t/keys/" + pct(names[10]));
  REQUIRE(still);
  CHECK(still->status != 400);

  CHECK(ks.terminate() == 0);
}
