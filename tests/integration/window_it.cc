// Windowed aggregates against the real broker: events with known timestamps, some out
// of order within the grace period and some later than it, counted and summed per
// tumbling and hopping window; every window read over HTTP equals a recount made
// here from the events themselves, late records are counted, and windows past
// retention are not answered.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <thread>

#include "support.h"
#include "window_common.h"

using namespace kstate::testing;

TEST_CASE("windowed counts and sums equal a recount; late records are counted; expired windows are gone") {
  const std::string topic = unique_name("clicks");
  create_topic(topic, 3);

  // 40 keys, 8,000 events: time advances 75 ms per event on average; most events are
  // up to 50 s out of order (within the 60 s grace of the counts), 3% are 5-15 min
  // late (beyond every grace).
  auto events = make_events(8'000, 40, 20261202);
  auto records = to_records(events);
  auto where = produce_bytes(topic, records);
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];

  // Per minute, 1 min grace, retention 5 min: the stream ends about 10 min after it
  // starts, so the first windows expire.
  const spec per_minute{k_minute, k_minute, k_minute, 5 * k_minute};
  // Hopping: 1 min windows every 20 s, 30 s grace, retention 1 h (nothing expires).
  const spec hopping{k_minute, 20'000, 30'000, 60 * k_minute};
  const auto count_model = recount(events, per_minute, false);
  const auto sum_model = recount(events, hopping, true);
  REQUIRE(count_model.late > 100);
  REQUIRE(sum_model.late > 100);

  kstate_process ks(unique_name("win"),
                    {{"per_minute", topic, "json", "", "string",
                      "kind: count, window: {type: tumbling, size: 1m, grace: 1m, retention: 5m}"},
                     {"hopping_sum", topic, "json", "", "string",
                      "kind: sum, value: n, window: {type: hopping, size: 1m, advance: 20s, grace: 30s, retention: 1h}"}},
                    temp_dir("kstate-win"));
  ks.start();
  ks.wait_ready();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((ks.position_sum("per_minute") < static_cast<int64_t>(events.size()) ||
          ks.position_sum("hopping_sum") < static_cast<int64_t>(events.size())) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(ks.position_sum("per_minute") == static_cast<int64_t>(events.size()));
  REQUIRE(ks.position_sum("hopping_sum") == static_cast<int64_t>(events.size()));

  CHECK(ks.metric_sum("kstate_ingest_late_records_total") ==
        static_cast<double>(count_model.late + sum_model.late));

  http_client http(ks.port());
  auto check_store = [&](const std::string& store, const window_model& model, const spec& s) {
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> expected;  // key -> (start, value)
    size_t expired = 0;
    for (const auto& [kw, v] : model.values) {
      // Which partition holds the key: the one its events went to.
      int32_t p = -1;
      for (const auto& e : events)
        if (e.key == kw.first) { p = e.partition; break; }
      if (kw.second + s.size + s.retention <= model.stream_time.at(p)) {
        ++expired;
        continue;
      }
      expected[kw.first].emplace_back(kw.second, v);
    }
    size_t windows = 0;
    for (int k = 0; k < 40; ++k) {
      const std::string key = "user-" + std::to_string(k);
      auto a = http.get("/v1/stores/" + store + "/windows/" + key + "?from=0");
      REQUIRE(a);
      REQUIRE(a->status == 200);
      const json body = a->body_json();
      std::vector<std::pair<int64_t, int64_t>> got;
      for (const auto& w : body["data"]) {
        CHECK(w["end"].get<int64_t>() == w["start"].get<int64_t>() + s.size);
        got.emplace_back(w["start"].get<int64_t>(), w["value"].get<int64_t>());
      }
      CAPTURE(store);
      CAPTURE(key);
      CHECK(got == expected[key]);
      windows += got.size();
    }
    MESSAGE(store << ": " << windows << " windows equal the recount, " << expired << " expired and not answered");
    return expired;
  };
  CHECK(check_store("per_minute", count_model, per_minute) > 0);
  CHECK(check_store("hopping_sum", sum_model, hopping) == 0);

  // An interval selects the windows overlapping it, by start; ISO-8601 works as epoch ms.
  {
    auto a = http.get("/v1/stores/hopping_sum/windows/user-7?from=2026-12-02T10:03:00Z&to=2026-12-02T10:04:00Z");
    REQUIRE(a);
    REQUIRE(a->status == 200);
    const json body = a->body_json();
    std::vector<int64_t> starts;
    for (const auto& w : body["data"]) starts.push_back(w["start"].get<int64_t>());
    std::vector<int64_t> want;
    for (const auto& [kw, v] : sum_model.values)
      if (kw.first == "user-7" && kw.second < k_base + 4 * k_minute && kw.second + k_minute > k_base + 3 * k_minute)
        want.push_back(kw.second);
    CHECK(starts == want);
    CHECK(!starts.empty());
  }
  // Bad intervals and non-windowed use are 400 problems.
  for (const char* target : {"/v1/stores/per_minute/windows/user-1?from=yesterday",
                             "/v1/stores/per_minute/windows/user-1?from=10&to=5"}) {
    auto a = http.get(target);
    REQUIRE(a);
    CAPTURE(target);
    CHECK(a->status == 400);
    CHECK(a->headers["content-type"].find("application/problem+json") == 0);
  }
  CHECK(ks.terminate() == 0);
}
