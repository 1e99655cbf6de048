// Two instances in one consumer group: any instance answers any point lookup (keys
// owned by the other are forwarded to it, once), and /v1/cluster names the owners the
// group coordinator assigned.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {
// Waits until /v1/cluster on `ks` reports a Stable group of `members` instances that
// together own every partition, each instance ready.
json wait_for_cluster(kstate_process& ks, size_t members, int partitions) {
  http_client c(ks.port());
  for (int i = 0; i < 600; ++i) {
    auto a = c.get("/v1/cluster");
    if (a && a->status == 200) {
      auto j = a->body_json();
      bool ok = j["group_state"] == "Stable" && j["instances"].size() == members &&
                j["partitions"].size() == static_cast<size_t>(partitions);
      for (const auto& inst : j["instances"]) ok = ok && inst["ready"] == true;
      if (ok) return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("the group did not settle; see " << ks.log_path());
  return {};
}
}  // namespace

TEST_CASE("two instances: every key through either instance equals the model; one hop at most") {
  const int partitions = 6;
  auto topic = unique_name("duo");
  create_topic(topic, partitions);
  std::vector<produced> recs;
  table_model model;
  for (int i = 0; i < 6000; ++i) {
    produced r{"user-" + std::to_string(i % 2000), R"({"i":)" + std::to_string(i) + "}"};
    if (i % 37 == 0) r.value = std::nullopt;
    recs.push_back(r);
    apply_record(model, r);
  }
  produce(topic, recs);

  auto dir = temp_dir("duo");
  auto app = unique_name("duo-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a");
  kstate_process b(app, {{"s", topic}}, dir + "/b");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  auto cluster = wait_for_cluster(a, 2, partitions);
  wait_for_cluster(b, 2, partitions);

  // Every partition has exactly one owner, and the owners are the two instances.
  std::string ea = "http://127.0.0.1:" + std::to_string(a.port()), eb = "http://127.0.0.1:" + std::to_string(b.port());
  std::map<int, std::string> owner;
  for (const auto& p : cluster["partitions"]) {
    CHECK(owner.emplace(p["partition"].get<int>(), p["owner"].get<std::string>()).second);
    CHECK(p["lag"] == 0);
  }
  CHECK(owner.size() == static_cast<size_t>(partitions));
  std::set<std::string> owners;
  for (auto& [p, o] : owner) owners.insert(o);
  CHECK(owners == std::set<std::string>{ea, eb});

  // Kafka's own tool describes the same assignment (matched by client id, which
  // carries each instance's endpoint).
  auto described = kafka("consumer-groups --describe --group " + app + " --members --verbose 2>/dev/null");
  for (const auto& [p, o] : owner) CHECK(described.find(o) != std::string::npos);

  size_t forwarded = 0, checked = 0;
  for (auto* via : {&a, &b}) {
    http_client c(via->port());
    for (int k = 0; k < 2000; ++k) {
      auto key = "user-" + std::to_string(k);
      auto r = c.get("/v1/stores/s/keys/" + key);
      REQUIRE(r);
      auto it = model.find(key);
      if (it == model.end()) {
        CHECK_MESSAGE(r->status == 404, key << " via " << via->port() << ": " << r->body);
      } else {
        REQUIRE_MESSAGE(r->status == 200, key << " via " << via->port() << ": " << r->body);
        CHECK(r->body_json()["value"] == json::parse(it->second));
        auto served_by = r->body_json()["served_by"].get<std::string>();
        CHECK(served_by == owner.at(r->body_json()["partition"].get<int>()));
      }
      if (r->headers.count("x-kstate-forwarded-to")) ++forwarded;
      ++checked;
    }
  }
  MESSAGE(checked << " lookups, " << forwarded << " forwarded to the owner");
  CHECK(forwarded > 1000);
  CHECK(forwarded < checked);

  // A forwarded request is never forwarded again: a non-owner answers 503.
  http_client c(a.port());
  int refused = 0;
  for (int k = 0; k < 50; ++k) {
    auto r = c.get("/v1/stores/s/keys/user-" + std::to_string(k), {{"X-Kstate-Hop", "1"}});
    REQUIRE(r);
    if (r->status == 503) {
      CHECK(r->body_json()["error_code"] == 50302);
      CHECK(r->headers.count("retry-after") == 1);
      ++refused;
    } else {
      CHECK(r->status != 500);
    }
  }
  CHECK(refused > 0);

  // The key metadata names the owner.
  auto m = c.get("/v1/stores/s/keys/user-7/metadata");
  REQUIRE(m);
  REQUIRE(m->status == 200);
  CHECK(m->body_json()["active_owner"] == owner.at(m->body_json()["partition"].get<int>()));

  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}
