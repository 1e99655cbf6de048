// Malformed records never stop ingest: each is counted, logged, skipped and sent to the
// dead-letter topic, exactly once, with headers naming where it came from; as a bounded
// envelope when the topic refuses it whole; counted and logged when it refuses even that.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <random>
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

namespace {

// The dead-letter records of `dlq` by (partition, offset) of the source record.
std::map<std::pair<int, int64_t>, consumed> dead_letters_by_source(const std::string& dlq, size_t expected) {
  std::map<std::pair<int, int64_t>, consumed> out;
  for (auto& r : consume_all(dlq, expected))
    out[{std::stoi(r.headers.at("kstate.partition")), std::stoll(r.headers.at("kstate.offset"))}] = r;
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("a dead letter too large for its topic arrives as a bounded envelope; ingest goes on") {
  auto topic = unique_name("bad-big");
  auto dlq = topic + "-dlq";
  create_topic(topic, 2);
  // The topic takes records of at most 4 KiB; one rejected record is 20 KB.
  kafka("topics --create --topic " + dlq + " --partitions 1 --config max.message.bytes=4096 >/dev/null");

  const std::string big = R"({"big": ")" + std::string(20'000, 'x');  // unterminated: not JSON
  std::vector<produced> recs;
  table_model model;
  size_t invalid = 0;
  for (int i = 0; i < 300; ++i) {
    produced r{"k" + std::to_string(i % 50), R"({"i":)" + std::to_string(i) + "}"};
    if (i == 150) r.value = big;
    else if (i % 50 == 7) r.value = "{broken " + std::to_string(i);
    if (i == 150 || i % 50 == 7) ++invalid;
    else apply_record(model, r);
    recs.push_back(r);
  }
  produce(topic, recs);

  auto dir = temp_dir("bad-big");
  kstate_process ks(unique_name("bad-big-app"), {{"t", topic, "json", dlq}}, dir + "/state");
  ks.start();
  ks.wait_ready();
  REQUIRE(ks.position_sum("t") == static_cast<int64_t>(recs.size()));
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == invalid);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == invalid);
  CHECK(ks.metric_sum("kstate_ingest_dead_letters_truncated_total") == 1);
  CHECK(ks.metric_sum("kstate_ingest_dead_letters_failed_total") == 0);

  http_client c(ks.port());
  for (const auto& [key, value] : model) {
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    REQUIRE(a->status == 200);
    CHECK(a->body_json()["value"] == json::parse(value));
  }

  // Where the big record is, read back from the source topic.
  std::pair<int, int64_t> big_at{-1, -1};
  for (const auto& r : consume_all(topic, recs.size()))
    if (r.value && r.value->size() > 10'000) big_at = {r.partition, r.offset};
  auto dead = dead_letters_by_source(dlq, invalid);
  REQUIRE(dead.size() == invalid);
  for (const auto& [at, r] : dead) {
    CHECK(r.headers.at("kstate.topic") == topic);
    CHECK(r.headers.at("kstate.view") == "t");
    CHECK_FALSE(r.headers.at("kstate.reason").empty());
    if (at == big_at) {
      CHECK(r.headers.at("kstate.truncated") == "true");
      CHECK(r.headers.at("kstate.original_size") == std::to_string(big.size()));
      CHECK(r.headers.at("kstate.dead_letter_error") == "MSG_SIZE_TOO_LARGE");
      CHECK(r.key == "k0");
      CHECK(r.value == big.substr(0, 1024));
    } else {
      // The small ones arrive whole, even when the broker refused a request they shared
      // with the big one.
      CHECK(r.headers.count("kstate.truncated") == 0);
      CHECK(r.value.value_or("").rfind("{broken ", 0) == 0);
    }
  }
  CHECK(dead.count(big_at) == 1);
  CHECK(
      read_file(ks.log_path()).find(topic + "-" + std::to_string(big_at.first) + "@" + std::to_string(big_at.second)) !=
      std::string::npos);
  CHECK(ks.terminate() == 0);
}

TEST_CASE("dead letters that cannot be delivered even as envelopes are counted and logged; ingest goes on") {
  auto topic = unique_name("bad-none");
  auto dlq = topic + "-dlq";
  create_topic(topic, 2);
  // Smaller than the overhead of any record batch: nothing fits, not even an envelope.
  kafka("topics --create --topic " + dlq + " --partitions 1 --config max.message.bytes=64 >/dev/null");

  std::vector<produced> recs;
  table_model model;
  size_t invalid = 0;
  for (int i = 0; i < 200; ++i) {
    produced r{"k" + std::to_string(i % 40), R"({"i":)" + std::to_string(i) + "}"};
    if (i % 40 == 13) {
      r.value = "{broken " + std::to_string(i);
      ++invalid;
    } else {
      apply_record(model, r);
    }
    recs.push_back(r);
  }
  produce(topic, recs);

  auto dir = temp_dir("bad-none");
  kstate_process ks(unique_name("bad-none-app"), {{"t", topic, "json", dlq}}, dir + "/state");
  ks.start();
  ks.wait_ready();
  REQUIRE(ks.position_sum("t") == static_cast<int64_t>(recs.size()));
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == invalid);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == 0);
  CHECK(ks.metric_sum("kstate_ingest_dead_letters_failed_total") == invalid);

  http_client c(ks.port());
  for (const auto& [key, value] : model) {
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    REQUIRE(a->status == 200);
    CHECK(a->body_json()["value"] == json::parse(value));
  }
  // Each failure is logged with where the record came from.
  auto log = read_file(ks.log_path());
  size_t logged = 0;
  for (const auto& r : consume_all(topic, recs.size()))
    if (r.value && r.value->rfind("{broken ", 0) == 0) {
      auto at = topic + "-" + std::to_string(r.partition) + "@" + std::to_string(r.offset) +
                " (store t) could not be delivered";
      if (log.find(at) != std::string::npos) ++logged;
    }
  CHECK(logged == invalid);
  CHECK(ks.terminate() == 0);
}
