// Standby replicas: with standby_replicas 1 each instance keeps the other's partitions
// current. When an owner is killed, allow_stale answers come from the copy at once
// (correct values, marked stale), and the survivor takes the partitions over from the
// copy's position instead of reading them again.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <thread>

#include "support.h"

using namespace kstate::testing;

TEST_CASE("standby copies answer allow_stale reads while the owner is down, and make fail-over read nothing again") {
  const int keys = 20'000;
  auto topic = unique_name("standby");
  create_topic(topic, 6);
  std::vector<produced> recs;
  for (int k = 0; k < keys; ++k) recs.push_back({"key-" + std::to_string(k), R"({"i":)" + std::to_string(k) + "}"});
  produce(topic, recs);

  auto dir = temp_dir("standby");
  auto app = unique_name("standby-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a", "standby_replicas: 1\n");
  kstate_process b(app, {{"s", topic}}, dir + "/b", "standby_replicas: 1\n");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  // Settled, and both instances own partitions: with cooperative rebalancing the group
  // is briefly Stable with every partition still on A before B receives its share.
  auto both_own = [&] {
    if (!cluster_settled(a.port(), 2, 6)) return false;
    auto c = http_client(a.port()).get("/v1/cluster");
    if (!c || c->status != 200) return false;
    std::set<std::string> owners;
    const auto j = c->body_json();
    for (const auto& p : j["partitions"]) owners.insert(p["owner"].get<std::string>());
    return owners.size() == 2;
  };
  for (int i = 0; i < 600 && !both_own(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(both_own());
  std::string eb = "http://127.0.0.1:" + std::to_string(b.port());

  // Keys owned by B, and the metadata naming A as their standby.
  http_client ca(a.port());
  std::vector<int> owned_by_b;
  for (int k = 0; k < keys && owned_by_b.size() < 2000; ++k) {
    auto m = ca.get("/v1/stores/s/keys/key-" + std::to_string(k) + "/metadata");
    REQUIRE(m);
    auto body = m->body_json();
    if (body["active_owner"] == eb) {
      owned_by_b.push_back(k);
      REQUIRE(body["standbys"].size() == 1);
      CHECK(body["standbys"][0] == "http://127.0.0.1:" + std::to_string(a.port()));
    }
  }
  REQUIRE(!owned_by_b.empty());
  // New values for B's keys, written while B owns them: on A only the standby copy can
  // have them (A may hold older data of these partitions from before B joined).
  std::vector<produced> updates;
  for (int k : owned_by_b)
    updates.push_back({"key-" + std::to_string(k), R"({"i":)" + std::to_string(k) + R"(,"v":2})"});
  produce(topic, updates);
  // Let the standby copy catch up (it consumes on its own).
  std::this_thread::sleep_for(std::chrono::seconds(3));
  double consumed_before = a.metric_sum("kstate_ingest_records_consumed_total");

  b.kill9();
  // Before the session timeout, B is still the owner on record but does not answer.
  size_t stale_ok = 0, unavailable = 0;
  for (size_t i = 0; i < owned_by_b.size(); i += 10) {
    int k = owned_by_b[i];
    auto plain = ca.get("/v1/stores/s/keys/key-" + std::to_string(k));
    REQUIRE(plain);
    if (plain->status == 503) ++unavailable;
    auto s = ca.get("/v1/stores/s/keys/key-" + std::to_string(k) + "?allow_stale=true");
    REQUIRE(s);
    REQUIRE_MESSAGE(s->status == 200, s->body);
    auto body = s->body_json();
    CHECK(body["value"]["i"] == k);
    CHECK(body["value"]["v"] == 2);
    if (body.value("stale", false)) {
      ++stale_ok;
      CHECK(body["lag"] == 0);
      CHECK(s->headers["x-kstate-stale"] == "true");
    }
  }
  MESSAGE(stale_ok << " stale answers from the standby copy, " << unavailable << " plain lookups got 503");
  CHECK(stale_ok > 0);

  // The whole store in range pages through A with allow_stale=true: B's partitions from
  // A's copy while B is gone (the pages marked stale), every key with its latest value.
  {
    std::set<int> updated(owned_by_b.begin(), owned_by_b.end());
    std::map<std::string, json> got;
    int stale_pages = 0, pages = 0;
    std::string cursor;
    do {
      auto r = ca.get("/v1/stores/s/keys?limit=1000&allow_stale=true" + (cursor.empty() ? "" : "&cursor=" + cursor));
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 200, r->body);
      ++pages;
      const auto body = r->body_json();
      for (const auto& e : body["data"]) got[e["key"].get<std::string>()] = e["value"];
      if (body["metadata"].value("stale", false)) {
        ++stale_pages;
        CHECK(r->headers["x-kstate-stale"] == "true");
      }
      cursor = body["metadata"]["next"].is_null() ? "" : body["metadata"]["next"].get<std::string>();
    } while (!cursor.empty());
    CHECK(got.size() == static_cast<size_t>(keys));
    int wrong = 0;
    for (int k = 0; k < keys; ++k) {
      json want = {{"i", k}};
      if (updated.count(k)) want["v"] = 2;
      auto it = got.find("key-" + std::to_string(k));
      if (it == got.end() || it->second != want) ++wrong;
    }
    CHECK(wrong == 0);
    MESSAGE(pages << " range pages with allow_stale, " << stale_pages << " of them stale");
    CHECK(stale_pages > 0);
    // Streamed scans need every owner current: allow_stale is refused there.
    auto scan = ca.get("/v1/stores/s/keys?allow_stale=true", {{"Accept", "application/x-ndjson"}});
    REQUIRE(scan);
    CHECK(scan->status == 400);
  }

  // After the session timeout A owns everything; it resumed from the copy's position,
  // so its group consumer read no old record again.
  bool all = false;
  for (int i = 0; i < 300 && !all; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    all = cluster_settled(a.port(), 1);
  }
  REQUIRE(all);
  for (int k : owned_by_b) {
    auto r = ca.get("/v1/stores/s/keys/key-" + std::to_string(k));
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(r->body_json()["value"]["i"] == k);
    CHECK(r->body_json()["value"]["v"] == 2);
    CHECK_FALSE(r->body_json().contains("stale"));
  }
  double consumed_after = a.metric_sum("kstate_ingest_records_consumed_total");
  MESSAGE("group consumer records before the fail-over " << consumed_before << ", after " << consumed_after << " (the "
                                                         << updates.size()
                                                         << " updates came through the standby copy)");
  CHECK(consumed_after == consumed_before);
  CHECK(a.terminate() == 0);
}
