// The scrape-time metrics of server/state_metrics.h with more stores and partitions
// than any fixed family budget: every store and partition is a sample of its family,
// counted against a recount of what the test set up.

#include <doctest/doctest.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "core/ownership.h"
#include "core/value_codec.h"
#include "core/view.h"
#include "server/state_metrics.h"
#include "storage/db.h"

namespace fs = std::filesystem;
using namespace kstate;

TEST_CASE("state metrics: 40 stores and 120 partitions each appear once in their families") {
  constexpr int stores = 40;  // past the 32 families a scrape once had room for
  constexpr int partitions_per_topic = 3;
  auto dir = fs::temp_directory_path() / ("kstate-state-metrics-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);

  std::vector<view_def> views;
  std::vector<std::string> names;
  for (int i = 0; i < stores; ++i) {
    view_def v;
    v.name = "store" + std::to_string(i);
    v.topic = "topic" + std::to_string(i);
    v.source = v.topic;
    views.push_back(v);
    names.push_back(v.name);
  }
  storage::db_options opts;
  opts.path = dir.string();
  opts.block_cache_bytes = 8 << 20;
  auto db = storage::db::open(opts, names);
  REQUIRE(db.ok());

  ownership_registry ownership;
  std::vector<ownership_registry::assignment> assigned;
  for (const auto& v : views) {
    ownership.set_partition_count(v.topic, partitions_per_topic);
    for (int32_t p = 0; p < partitions_per_topic; ++p) assigned.push_back({v.topic, p, 10, false, 4});
  }
  ownership.assign(assigned);
  for (const auto& v : views)
    for (int32_t p = 0; p < partitions_per_topic; ++p) ownership.update_progress(v.topic, p, 4, 10);

  auto families = server::make_state_metrics(**db, views, ownership, "group")->Collect();

  std::map<std::string, const prometheus::MetricFamily*> by_name;
  for (const auto& f : families) CHECK_MESSAGE(by_name.emplace(f.name, &f).second, "family twice: ", f.name);

  // One sample per store, labelled with its name.
  for (const char* name : {"kstate_rocksdb_estimate_num_keys", "kstate_rocksdb_live_sst_files_size_bytes",
                           "kstate_rocksdb_num_running_flushes"}) {
    REQUIRE_MESSAGE(by_name.count(name), name);
    std::set<std::string> seen;
    for (const auto& m : by_name.at(name)->metric) {
      REQUIRE(m.label.size() == 1);
      CHECK(m.label[0].name == "store");
      seen.insert(m.label[0].value);
    }
    CHECK(seen == std::set<std::string>(names.begin(), names.end()));
    CHECK(by_name.at(name)->metric.size() == static_cast<size_t>(stores));
  }

  // One sample per assigned partition, with the lag the registry was given.
  REQUIRE(by_name.count("kstate_consumergroup_lag"));
  const auto& lag = by_name.at("kstate_consumergroup_lag")->metric;
  CHECK(lag.size() == static_cast<size_t>(stores * partitions_per_topic));
  std::set<std::pair<std::string, std::string>> partitions;
  for (const auto& m : lag) {
    CHECK(m.gauge.value == 6);
    std::map<std::string, std::string> l;
    for (const auto& x : m.label) l[x.name] = x.value;
    CHECK(l["consumergroup"] == "group");
    partitions.emplace(l["topic"], l["partition"]);
  }
  CHECK(partitions.size() == static_cast<size_t>(stores * partitions_per_topic));
  REQUIRE(by_name.count("kstate_partition_ready"));
  CHECK(by_name.at("kstate_partition_ready")->metric.size() == static_cast<size_t>(stores * partitions_per_topic));

  db->reset();
  fs::remove_all(dir);
}

TEST_CASE("state metrics: expired keys deleted by compaction are counted for stores with a ttl only") {
  auto dir = fs::temp_directory_path() / ("kstate-state-metrics-ttl-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<view_def> views{view_def{.name = "sessions", .topic = "t", .ttl = ttl_spec{1000}},
                              view_def{.name = "users", .topic = "t"}};
  storage::db_options opts;
  opts.path = dir.string();
  opts.ttl_ms = {{"sessions", 1000}};
  opts.clock = [] { return int64_t{10'000}; };
  opts.verify_files_interval_ms = 0;
  auto db = storage::db::open(opts, {"sessions", "users"});
  REQUIRE(db.ok());
  auto& d = **db;
  auto b = d.new_batch();
  // At 10,000: times 0, 5000 and 9000 are expired, 9500 is not.
  for (int64_t t : {0, 5000, 9000, 9500}) {
    b.put(*d.find_view("sessions"), 0, "k" + std::to_string(t), frame_value(1, t, "v"));
    b.put(*d.find_view("users"), 0, "k" + std::to_string(t), frame_value(1, t, "v"));
  }
  REQUIRE(d.write(b).ok());
  REQUIRE(d.flush().ok());
  REQUIRE(d.compact(*d.find_view("sessions")).ok());
  REQUIRE(d.compact(*d.find_view("users")).ok());

  ownership_registry ownership;
  auto families = server::make_state_metrics(d, views, ownership, "group")->Collect();
  const prometheus::MetricFamily* expired = nullptr;
  for (const auto& f : families)
    if (f.name == "kstate_store_expired_keys_total") expired = &f;
  REQUIRE(expired);
  REQUIRE(expired->metric.size() == 1);
  CHECK(expired->metric[0].label.at(0).value == "sessions");
  CHECK(expired->metric[0].counter.value == 3);
  db->reset();
  fs::remove_all(dir);
}
