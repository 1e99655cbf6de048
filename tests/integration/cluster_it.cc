// Two instances in one consumer group: any instance answers any point lookup (keys
// owned by the other are forwarded to it, once), and /v1/cluster names the owners the
// group coordinator assigned.
#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {
// Waits until /v1/cluster on `ks` reports a Stable group of `members` instances that
// together own every partition, each instance ready, and a lag for every partition (null
// while the owner has not reported the partition's position and end yet).
json wait_for_cluster(kstate_process& ks, size_t members, int partitions) {
  for (int i = 0; i < 600; ++i) {
    if (cluster_settled(ks.port(), members, partitions)) {
      auto a = http_client(ks.port()).get("/v1/cluster");
      REQUIRE(a);
      auto body = a->body_json();
      bool lags_known = true;
      for (const auto& p : body["partitions"]) lags_known = lags_known && p["lag"].is_number();
      if (lags_known) return body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("the group did not settle; see " << ks.log_path());
  return {};
}

}  // namespace

TEST_CASE("two instances: keys, ranges, counts and batches through either instance equal the model; one hop at most") {
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

  // Ranges through either instance: every partition's keys, merged into one byte order,
  // paged exactly once with small and large pages.
  std::vector<std::string> sorted;
  for (const auto& [k, v] : model) sorted.push_back(k);
  for (auto* via : {&a, &b}) {
    for (int limit : {7, 1000}) {
      http_client rc(via->port());
      std::vector<std::string> got;
      std::string cursor;
      for (int guard = 0; guard < 1000; ++guard) {
        auto r =
            rc.get("/v1/stores/s/keys?limit=" + std::to_string(limit) + (cursor.empty() ? "" : "&cursor=" + cursor));
        REQUIRE(r);
        REQUIRE_MESSAGE(r->status == 200, r->body);
        auto body = r->body_json();
        for (const auto& e : body["data"]) {
          got.push_back(e["key"].get<std::string>());
          CHECK(e["value"] == json::parse(model.at(got.back())));
        }
        CHECK(body["metadata"]["position"].size() == static_cast<size_t>(partitions));
        if (body["metadata"]["next"].is_null()) break;
        cursor = body["metadata"]["next"].get<std::string>();
      }
      CHECK_MESSAGE(got == sorted, "via " << via->port() << " limit " << limit);
    }
    http_client rc(via->port());
    auto desc = rc.get("/v1/stores/s/keys?order=desc&prefix=user-19&limit=1000");
    REQUIRE(desc);
    REQUIRE_MESSAGE(desc->status == 200, desc->body);
    std::vector<std::string> want, got;
    for (auto it = sorted.rbegin(); it != sorted.rend(); ++it)
      if (it->rfind("user-19", 0) == 0) want.push_back(*it);
    auto desc_body = desc->body_json();  // named: a temporary would die before the loop body
    for (const auto& e : desc_body["data"]) got.push_back(e["key"].get<std::string>());
    CHECK_MESSAGE(got == want, "got " << got.size() << " want " << want.size() << " first "
                                      << (got.empty() ? "" : got[0]) << " / " << (want.empty() ? "" : want[0])
                                      << " last " << (got.empty() ? "" : got.back()) << " / "
                                      << (want.empty() ? "" : want.back()));
  }
  // Count and batchGet through either instance: summed and merged across owners.
  for (auto* via : {&a, &b}) {
    http_client rc(via->port());
    auto n = rc.get("/v1/stores/s/count");
    REQUIRE(n);
    REQUIRE_MESSAGE(n->status == 200, n->body);
    CHECK(n->body_json()["count"] == model.size());
    CHECK(n->body_json()["exact"] == true);
    CHECK(n->body_json()["metadata"]["position"].size() == static_cast<size_t>(partitions));

    json req = {{"keys", json::array()}};
    std::vector<std::string> asked;
    for (int k = 0; k < 2100; k += 7) asked.push_back("user-" + std::to_string(k));  // some never written
    for (const auto& k : asked) req["keys"].push_back(k);
    auto bg = rc.post("/v1/stores/s/keys:batchGet", "application/json", req.dump());
    REQUIRE(bg);
    REQUIRE_MESSAGE(bg->status == 200, bg->body);
    auto body = bg->body_json();
    std::vector<std::string> want_found, want_missing, got_found, got_missing;
    for (const auto& k : asked) (model.count(k) ? want_found : want_missing).push_back(k);
    for (const auto& e : body["data"]) {
      got_found.push_back(e["key"].get<std::string>());
      CHECK(e["value"] == json::parse(model.at(got_found.back())));
    }
    for (const auto& m : body["missing"]) got_missing.push_back(m.get<std::string>());
    CHECK(got_found == want_found);  // in request order
    CHECK(got_missing == want_missing);
  }

  // NDJSON scans through either instance stream every key once, in order.
  for (auto* via : {&a, &b}) {
    http_client rc(via->port());
    auto scan = rc.get("/v1/stores/s/keys", {{"Accept", "application/x-ndjson"}});
    REQUIRE(scan);
    REQUIRE_MESSAGE(scan->status == 200, scan->body);
    std::vector<std::string> got;
    std::istringstream in(scan->body);
    std::string line;
    while (std::getline(in, line)) {
      auto e = json::parse(line);
      got.push_back(e["key"].get<std::string>());
      CHECK(e["value"] == json::parse(model.at(got.back())));
    }
    CHECK_MESSAGE(got == sorted, "NDJSON via " << via->port() << ": " << got.size() << " keys");
  }

  // The internal parameters are refused from clients.
  {
    http_client rc(a.port());
    auto r = rc.get("/v1/stores/s/keys?partitions=0");
    REQUIRE(r);
    CHECK(r->status == 400);
  }

  // Only the instances of the group speak the internal dialect: a request marked as a
  // hop must carry a signature made with the group's secret (kept in Kafka).
  http_client c(a.port());
  {
    auto unsigned_hop = c.get("/v1/stores/s/keys/user-1", {{"X-Kstate-Hop", "1"}});
    REQUIRE(unsigned_hop);
    CHECK(unsigned_hop->status == 401);
    CHECK(unsigned_hop->body_json()["error_code"] == 40102);
    const std::string target = "/v1/stores/s/keys/user-1";
    auto forged = c.get(target, {{"X-Kstate-Hop", "1"},
                                 {"X-Kstate-Peer", peer_signature("not the group's secret!", "GET", target, "")}});
    REQUIRE(forged);
    CHECK(forged->status == 401);
    // Internal parameters are refused from clients on every route that has them.
    auto internal = c.get("/v1/stores/s/count?partitions=0");
    REQUIRE(internal);
    CHECK(internal->status == 400);
  }
  // A forwarded request is never forwarded again: a non-owner answers 503.
  const auto secrets = consume_all(app + "-peer-secret", 1);
  REQUIRE(secrets.size() == 1);
  REQUIRE(secrets[0].value);
  const std::string secret = *secrets[0].value;
  int refused = 0, answered = 0;
  for (int k = 0; k < 50; ++k) {
    const std::string target = "/v1/stores/s/keys/user-" + std::to_string(k);
    auto r = c.get(target, {{"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", peer_signature(secret, "GET", target, "")}});
    REQUIRE(r);
    if (r->status == 503) {
      CHECK(r->body_json()["error_code"] == 50302);
      CHECK(r->headers.count("retry-after") == 1);
      CHECK(r->headers.count("x-kstate-forwarded-to") == 0);
      ++refused;
    } else {
      CHECK(r->status != 500);
      CHECK(r->status != 401);
      ++answered;
    }
  }
  CHECK(refused > 0);
  CHECK(answered > 0);

  // The key metadata names the owner.
  auto m = c.get("/v1/stores/s/keys/user-7/metadata");
  REQUIRE(m);
  REQUIRE(m->status == 200);
  CHECK(m->body_json()["active_owner"] == owner.at(m->body_json()["partition"].get<int>()));

  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}
