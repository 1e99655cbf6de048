// Forwarded lookups to one owner ride together (http.peer_batch): with one exchange at
// a time allowed per owner, many concurrent lookups at the instance that does not own
// their keys go to the owner in batches, and each answer is exactly the owner's own
// (status, content type, body, position); with the owner gone, each is refused as a
// lone forward would be.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <sstream>
#include <thread>

#include "agg_common.h"

using namespace kstate::testing;

namespace {

// What the comparison looks at: everything a client sees of a lookup's answer except
// the serving instance's own headers (request id, date, the forwarding mark).
struct seen {
  int status = 0;
  std::string content_type, body, position;
  bool operator==(const seen&) const = default;
};

seen seen_of(const http_answer& a) {
  auto header = [&](const char* n) {
    auto it = a.headers.find(n);
    return it == a.headers.end() ? std::string() : it->second;
  };
  return {a.status, header("content-type"), a.body, header("x-kstate-position")};
}

// Fires every target at `port` from `threads` clients at once; the answers by index.
std::vector<std::optional<http_answer>> fire(uint16_t port, const std::vector<std::string>& targets, int threads) {
  std::vector<std::optional<http_answer>> out(targets.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      http_client c(port);
      for (size_t i = next++; i < targets.size(); i = next++) out[i] = c.get(targets[i]);
    });
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace

TEST_CASE("coalesced forwards: every answer equals the owner's own; a gone owner refuses each as alone") {
  const int partitions = 6;
  auto topic = unique_name("coalesce");
  create_topic(topic, partitions);
  // Keys with bytes that travel percent-encoded, some deleted, some never written.
  std::vector<produced> recs;
  table_model model;
  std::vector<std::string> keys;
  for (int i = 0; i < 400; ++i) {
    std::string key = (i % 3 == 0 ? "user/" : i % 3 == 1 ? "caf\xc3\xa9 " : "k%") + std::to_string(i);
    keys.push_back(key);
    produced r{key, R"({"i":)" + std::to_string(i) + R"(,"s":"v)" + std::string(i % 50, 'x') + "\"}"};
    recs.push_back(r);
    if (i % 11 == 0) recs.push_back({key, std::nullopt});
  }
  for (const auto& r : recs) apply_record(model, r);
  for (int i = 0; i < 100; ++i) keys.push_back("never-" + std::to_string(i));
  produce(topic, recs);

  auto dir = temp_dir("coalesce");
  auto app = unique_name("coalesce-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a");
  kstate_process b(app, {{"s", topic}}, dir + "/b");
  // One exchange at a time per owner: every lookup beyond it waits and rides in a batch.
  for (auto* p : {&a, &b}) p->extra_args({"--set", "http.peer_batch.max_in_flight=1"});
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  std::string why;
  for (int i = 0; i < 600 && !group_settled({a.port(), b.port()}, partitions, &why); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(group_settled({a.port(), b.port()}, partitions, &why), why);

  // The owner's own answers: b answers the keys it owns itself (no forwarding mark).
  std::vector<std::string> targets;
  std::vector<seen> direct;
  {
    http_client hb(b.port());
    for (const auto& k : keys)
      for (const char* suffix : {"", "?key_format=string"}) {
        const std::string target = "/v1/stores/s/keys/" + pct(k) + suffix;
        auto r = hb.get(target);
        REQUIRE(r);
        if (r->headers.count("x-kstate-forwarded-to")) continue;  // a owns it
        REQUIRE_MESSAGE((r->status == 200 || r->status == 404), target << ": " << r->body);
        CHECK((r->status == 200) == (model.count(k) == 1));
        targets.push_back(target);
        direct.push_back(seen_of(*r));
      }
  }
  MESSAGE(targets.size() << " lookups of keys b owns");
  REQUIRE(targets.size() > 200);

  const double batches_before = metric_with(a.port(), "kstate_http_forwarded_batches_total", "result=\"ok\"");
  const double batched_before = metric_with(a.port(), "kstate_http_forwarded_batched_requests_total", "");
  const double forwarded_before = metric_with(a.port(), "kstate_http_forwarded_requests_total", "kind=\"forward\"");
  const auto via_a = fire(a.port(), targets, 24);
  size_t equal = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    REQUIRE_MESSAGE(via_a[i], targets[i]);
    CHECK_MESSAGE(seen_of(*via_a[i]) == direct[i], targets[i] << ": " << via_a[i]->status << " " << via_a[i]->body);
    CHECK(via_a[i]->headers.count("x-kstate-forwarded-to") == 1);
    if (via_a[i]->headers.count("x-kstate-forwarded-to"))
      CHECK(via_a[i]->headers.at("x-kstate-forwarded-to") == b.endpoint());
    equal += seen_of(*via_a[i]) == direct[i];
  }
  const double batches = metric_with(a.port(), "kstate_http_forwarded_batches_total", "result=\"ok\"") - batches_before;
  const double batched = metric_with(a.port(), "kstate_http_forwarded_batched_requests_total", "") - batched_before;
  const double forwarded =
      metric_with(a.port(), "kstate_http_forwarded_requests_total", "kind=\"forward\"") - forwarded_before;
  MESSAGE(equal << " of " << targets.size() << " equal; " << batched << " requests rode in " << batches << " batches");
  // Coalescing happened, and each request still counts once as forwarded.
  CHECK(batches >= 1);
  CHECK(batched > batches);
  CHECK(forwarded == static_cast<double>(targets.size()));
  // No batch was refused.
  CHECK(metric_with(a.port(), "kstate_http_forwarded_batches_total", "result=\"refused\"") == 0);

  // The owner gone (before the group notices): each lookup is refused as a lone forward
  // to an owner that does not answer is, 503 not_owner with Retry-After.
  b.kill9();
  const auto refused = fire(a.port(), targets, 24);
  for (size_t i = 0; i < targets.size(); ++i) {
    REQUIRE(refused[i]);
    const auto& r = *refused[i];
    // The group may have moved the partition to a meanwhile: then a answers it itself.
    if (r.status != 503) {
      CHECK(r.headers.count("x-kstate-forwarded-to") == 0);
      continue;
    }
    CHECK(r.body_json()["error_code"] == 50302);
    CHECK(r.headers.count("retry-after") == 1);
    CHECK(r.headers.count("x-kstate-forwarded-to") == 0);
  }
  MESSAGE(metric_with(a.port(), "kstate_http_forwarded_batches_total", "result=\"error\"")
          << " batches failed in transit");
  CHECK(a.terminate() == 0);
}
