// Malformed records never stop ingest: each is counted, logged, skipped and sent to the
// dead-letter topic, exactly once, with headers naming where it came from.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <random>
#include <fstream>
#include <set>
#include <sstream>

#include "support.h"

using namespace kstate::testing;

TEST_CASE("1% invalid JSON: counted, dead-lettered at exactly their offsets, valid keys all correct") {
  const int records = 20'000, keys = 2'000;
  auto topic = unique_name("bad");
  auto dlq = topic + "-dlq";
  create_topic(topic, 6);
  create_topic(dlq, 1);

  std::mt19937 rng(99);
  std::uniform_int_distribution<int> pick(0, keys - 1);
  std::vector<produced> recs;
  table_model model;
  size_t injected = 0;
  for (int i = 0; i < records; ++i) {
    produced r{"k" + std::to_string(pick(rng)), R"({"i":)" + std::to_string(i) + "}"};
    if (i % 100 == 37) {  // 1%: broken JSON, by construction
      r.value = "{\"i\": " + std::to_string(i) + ", broken";
      ++injected;
    } else if (i % 1000 == 500) {  // a record without a key cannot be materialized
      r.key = std::nullopt;
      ++injected;
    } else {
      apply_record(model, r);
    }
    recs.push_back(r);
  }
  produce(topic, recs);

  auto dir = temp_dir("bad");
  kstate_process ks(unique_name("bad-app"), {{"t", topic, "json", dlq}}, dir + "/state");
  ks.start();
  ks.wait_ready();
  REQUIRE(ks.position_sum("t") == records);
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == injected);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == injected);

  http_client c(ks.port());
  for (int k = 0; k < keys; ++k) {
    auto key = "k" + std::to_string(k);
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    auto it = model.find(key);
    if (it == model.end()) {
      CHECK(a->status == 404);
    } else {
      REQUIRE(a->status == 200);
      CHECK(a->body_json()["value"] == json::parse(it->second));
    }
  }

  // Where the broken records landed, read back from the source topic itself.
  std::set<std::pair<int, int64_t>> expected;
  for (const auto& r : consume_all(topic, records))
    if (!r.key || (r.value && r.value->find("broken") != std::string::npos)) expected.insert({r.partition, r.offset});
  REQUIRE(expected.size() == injected);

  // The dead-letter topic holds exactly those, once each.
  int64_t dlq_end = 0;
  std::istringstream offsets(kafka("get-offsets --topic " + dlq));
  std::string line;
  while (std::getline(offsets, line)) dlq_end += std::stoll(line.substr(line.rfind(':') + 1));
  CHECK(dlq_end == static_cast<int64_t>(injected));
  std::set<std::pair<int, int64_t>> dead;
  for (const auto& r : consume_all(dlq, injected)) {
    CHECK(r.headers.at("kstate.topic") == topic);
    CHECK(r.headers.at("kstate.view") == "t");
    CHECK_FALSE(r.headers.at("kstate.reason").empty());
    dead.insert({std::stoi(r.headers.at("kstate.partition")), std::stoll(r.headers.at("kstate.offset"))});
  }
  CHECK(dead == expected);

  // Each was logged with topic, partition and offset.
  std::ifstream log(ks.log_path());
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  auto [p, o] = *expected.begin();
  CHECK(all.find(topic + "-" + std::to_string(p) + "@" + std::to_string(o)) != std::string::npos);
  CHECK(ks.terminate() == 0);
}
