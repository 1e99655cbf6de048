// The windows of every key, across two instances: a windowed count and a hopping sum
// over events with known timestamps, split between two kstate instances of one
// application, read page by page through each instance with /v1/stores/{s}/windows.
// Every walk equals a recount made here from the events (same set, same order, same
// values, nothing twice, nothing missing at page boundaries), also for a sub-range of
// keys and a sub-interval of time.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "support.h"
#include "window_common.h"

using namespace kstate::testing;

namespace {

constexpr int k_partitions = 6;

// One window as the API lists it.
struct window_row {
  std::string key;
  int64_t start, end, value;
  int32_t partition;
  bool operator==(const window_row&) const = default;
};

// The recount's windows still answered at the end (not expired at their partition's
// final stream time), ordered as kstate documents it: group key bytes, then start.
std::vector<window_row> answered(const std::vector<event>& events, const spec& s, bool sum) {
  const auto m = recount(events, s, sum);
  std::map<std::string, int32_t> partition_of;
  for (const auto& e : events) partition_of[e.key] = e.partition;
  std::vector<window_row> out;
  for (const auto& [kw, v] : m.values) {
    const int32_t p = partition_of.at(kw.first);
    if (kw.second + s.size + s.retention <= m.stream_time.at(p)) continue;
    out.push_back({kw.first, kw.second, kw.second + s.size, v, p});
  }
  return out;  // std::map orders std::string keys by bytes (char_traits compare as unsigned)
}

// Waits until both instances report a Stable group of two owning every partition.
void wait_for_cluster(kstate_process& ks) {
  for (int i = 0; i < 600; ++i) {
    if (cluster_settled(ks.port(), 2, k_partitions)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("the group did not settle; see " << ks.log_path());
}

// Follows metadata.next from `target` to the end; checks each page's size and that
// every page reflects every partition.
std::vector<window_row> walk(http_client& http, const std::string& target, size_t limit, size_t& pages) {
  std::vector<window_row> out;
  std::string next_target = target + "&limit=" + std::to_string(limit);
  pages = 0;
  for (;;) {
    auto a = http.get(next_target);
    REQUIRE(a);
    CAPTURE(next_target);
    CAPTURE(a->body);
    REQUIRE(a->status == 200);
    const json body = a->body_json();
    ++pages;
    CHECK(body["data"].size() <= limit);
    CHECK(body["metadata"]["position"].size() == static_cast<size_t>(k_partitions));
    for (const auto& w : body["data"]) {
      out.push_back({w["key"].get<std::string>(), w["start"].get<int64_t>(), w["end"].get<int64_t>(),
                     w["value"].get<int64_t>(), w["partition"].get<int32_t>()});
      CHECK(w["start_time"].is_string());
      CHECK(w["end_time"].is_string());
      CHECK(w["offset"].get<int64_t>() >= 0);
    }
    const auto& next = body["metadata"]["next"];
    if (next.is_null()) break;
    CHECK(body["data"].size() == limit);
    next_target = target + "&limit=" + std::to_string(limit) + "&cursor=" + next.get<std::string>();
    REQUIRE(pages < 10'000);
  }
  return out;
}

}  // namespace

TEST_CASE("windows of every key through either of two instances equal the recount, page by page") {
  const std::string topic = unique_name("winrange");
  create_topic(topic, k_partitions);

  // 70 keys ("user-1" is a prefix of "user-10".."user-19": byte order is not numeric
  // order), 4,000 events over about 10 minutes, up to 40 s out of order.
  std::mt19937_64 rng(20261203);
  std::vector<event> events;
  std::vector<produced> records;
  int64_t clock = k_base;
  for (int i = 0; i < 4'000; ++i) {
    clock += static_cast<int64_t>(rng() % 300);
    event e;
    e.key = "user-" + std::to_string(rng() % 70);
    e.ts = clock - static_cast<int64_t>(rng() % 40'000);
    e.n = static_cast<int64_t>(rng() % 1000);
    records.push_back({e.key, "{\"n\":" + std::to_string(e.n) + "}", e.ts});
    events.push_back(std::move(e));
  }
  auto where = produce_bytes(topic, records);
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];

  // Per minute with a 4 min retention: the first windows of every partition expire.
  const spec per_minute{k_minute, k_minute, 30'000, 4 * k_minute};
  // Hopping 1 min every 20 s, retention 1 h: nothing expires, three windows per event.
  const spec hopping{k_minute, 20'000, 30'000, 60 * k_minute};
  const auto count_model = answered(events, per_minute, false);
  const auto sum_model = answered(events, hopping, true);

  const std::vector<kstate_process::view> views = {
      {"per_minute", topic, "json", "", "string",
       "kind: count, window: {type: tumbling, size: 1m, grace: 30s, retention: 4m}"},
      {"hopping_sum", topic, "json", "", "string",
       "kind: sum, value: n, window: {type: hopping, size: 1m, advance: 20s, grace: 30s, retention: 1h}"},
      {"plain", topic}};
  auto dir = temp_dir("winrange");
  auto app = unique_name("winrange-app");
  kstate_process a(app, views, dir + "/a");
  kstate_process b(app, views, dir + "/b");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  wait_for_cluster(a);
  wait_for_cluster(b);
  const auto total = static_cast<int64_t>(events.size());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto applied = [&](const std::string& store) { return a.position_sum(store) + b.position_sum(store); };
  while ((applied("per_minute") < total || applied("hopping_sum") < total) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(applied("per_minute") == total);
  REQUIRE(applied("hopping_sum") == total);
  // The split is real: each instance owns some partitions of the windowed stores.
  CHECK(a.position_sum("per_minute") > 0);
  CHECK(b.position_sum("per_minute") > 0);

  // Sanity of the model itself: windows expired, and keys whose bytes order differs
  // from their numbers exist.
  size_t all_count_windows = 0;
  {
    std::set<std::pair<std::string, int64_t>> all;
    for (const auto& e : events) all.insert({e.key, (e.ts / k_minute) * k_minute});
    all_count_windows = all.size();
  }
  REQUIRE(count_model.size() < all_count_windows);
  REQUIRE(count_model.size() > 100);

  for (auto* via : {&a, &b}) {
    http_client http(via->port());
    CAPTURE(via->port());
    size_t pages = 0;

    // The whole range, small pages.
    auto got = walk(http, "/v1/stores/per_minute/windows?from=0", 7, pages);
    CHECK(got == count_model);
    CHECK(pages == (count_model.size() + 6) / 7);
    got = walk(http, "/v1/stores/hopping_sum/windows?from=0", 11, pages);
    CHECK(got == sum_model);
    // Without from: the same (from defaults to the epoch).
    got = walk(http, "/v1/stores/hopping_sum/windows?to=9999999999999", 1000, pages);
    CHECK(got == sum_model);
    CHECK(pages == (sum_model.size() + 999) / 1000);

    // A sub-range of keys [user-2, user-4): user-2, user-20..user-29, user-3, ...
    {
      std::vector<window_row> want;
      for (const auto& w : sum_model)
        if (w.key >= "user-2" && w.key < "user-4") want.push_back(w);
      REQUIRE(want.size() > 20);
      got = walk(http, "/v1/stores/hopping_sum/windows?key_from=user-2&key_to=user-4", 5, pages);
      CHECK(got == want);
    }
    // Open on one side.
    {
      std::vector<window_row> want;
      for (const auto& w : count_model)
        if (w.key >= "user-66") want.push_back(w);
      got = walk(http, "/v1/stores/per_minute/windows?key_from=user-66", 4, pages);
      CHECK(got == want);
      want.clear();
      for (const auto& w : count_model)
        if (w.key < "user-11") want.push_back(w);
      got = walk(http, "/v1/stores/per_minute/windows?key_to=user-11", 4, pages);
      CHECK(got == want);
    }
    // A sub-interval: windows overlapping [10:03:30, 10:06), ISO-8601 and epoch ms.
    {
      const int64_t from = k_base + 3 * k_minute + 30'000, to = k_base + 6 * k_minute;
      std::vector<window_row> want;
      for (const auto& w : sum_model)
        if (w.start < to && w.end > from && w.key >= "user-5") want.push_back(w);
      REQUIRE(want.size() > 20);
      got =
          walk(http,
               "/v1/stores/hopping_sum/windows?from=2026-12-02T10:03:30Z&to=" + std::to_string(to) + "&key_from=user-5",
               6, pages);
      CHECK(got == want);
    }

    // Mistakes get 4xx problems.
    for (const char* target : {"/v1/stores/plain/windows",                      // not windowed
                               "/v1/stores/per_minute/keys",                    // windowed: use /windows
                               "/v1/stores/per_minute/keys/user-1",             // windowed: use /windows/{key}
                               "/v1/stores/per_minute/windows?from=10&to=5",    // empty interval
                               "/v1/stores/per_minute/windows?from=yesterday",  // bad time
                               "/v1/stores/per_minute/windows?limit=0",         // bad limit
                               "/v1/stores/per_minute/windows?cursor=AAAA",     // damaged cursor
                               "/v1/stores/per_minute/windows?partitions=0",    // set by kstate only
                               "/v1/stores/per_minute/windows?key_from=x&key_format=long"}) {
      auto r = http.get(target);
      REQUIRE(r);
      CAPTURE(target);
      CHECK(r->status == 400);
      CHECK(r->headers["content-type"].find("application/problem+json") == 0);
    }
    CHECK(http.get("/v1/stores/nope/windows")->status == 404);
    // A cursor is bound to its query: one made for another interval is refused.
    {
      auto first = http.get("/v1/stores/per_minute/windows?from=0&limit=3");
      REQUIRE(first);
      auto cursor = first->body_json()["metadata"]["next"].get<std::string>();
      auto other = http.get("/v1/stores/per_minute/windows?from=1&limit=3&cursor=" + cursor);
      REQUIRE(other);
      CHECK(other->status == 400);
      CHECK(other->body_json()["error_code"] == 40004);
    }
  }
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}
