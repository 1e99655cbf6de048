// Windowed aggregates against the real broker: events with known timestamps, some out
// of order within the grace period and some later than it, counted and summed per
// tumbling and hopping window; every window read over HTTP equals a recount made
// here from the events themselves, late records are counted, and windows past
// retention are not answered.
#include <doctest/doctest.h>

#include <ctime>
#include <map>
#include <random>
#include <set>
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

  kstate_process ks(
      unique_name("win"),
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

  CHECK(ks.metric_sum("kstate_ingest_late_records_total") == static_cast<double>(count_model.late + sum_model.late));

  http_client http(ks.port());
  auto check_store = [&](const std::string& store, const window_model& model, const spec& s) {
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> expected;  // key -> (start, value)
    size_t expired = 0;
    for (const auto& [kw, v] : model.values) {
      // Which partition holds the key: the one its events went to.
      int32_t p = -1;
      for (const auto& e : events)
        if (e.key == kw.first) {
          p = e.partition;
          break;
        }
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
  for (const char* target :
       {"/v1/stores/per_minute/windows/user-1?from=yesterday", "/v1/stores/per_minute/windows/user-1?from=10&to=5"}) {
    auto a = http.get(target);
    REQUIRE(a);
    CAPTURE(target);
    CHECK(a->status == 400);
    CHECK(a->headers["content-type"].find("application/problem+json") == 0);
  }
  CHECK(ks.terminate() == 0);
}

TEST_CASE("a restore from the changelog recovers the largest event time, also when a window's last record was older") {
  // Written before kstate starts, so both records of window 10:05 fold in one batch:
  // 10:05:50, then 10:05:10 (in the same window, not late). The changelog record of the
  // window must carry 10:05:50, the largest event time seen, or a restore would set
  // stream time back to 10:05:10.
  const std::string topic = unique_name("clicks-restore");
  create_topic(topic, 1);
  produce_bytes(topic, {{"k", "{}", k_base + 5 * k_minute + 50'000}, {"k", "{}", k_base + 5 * k_minute + 10'000}});
  const auto app = unique_name("win-restore");
  const auto dir = temp_dir("kstate-win-restore");
  const std::vector<kstate_process::view> views{
      {"per_minute", topic, "json", "", "string", "kind: count, window: {type: tumbling, size: 1m, grace: 30s}"}};
  {
    kstate_process ks(app, views, dir + "/a");
    ks.start();
    ks.wait_ready();
    for (int i = 0; i < 600 && ks.position_sum("per_minute") < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(ks.position_sum("per_minute") == 2);
    CHECK(ks.terminate() == 0);
  }
  // A new state directory: the window comes back from the changelog alone.
  kstate_process ks(app, views, dir + "/b");
  ks.start();
  ks.wait_ready();
  // 10:04:55 falls in window 10:04, which closed at 10:05:30 (end + grace): stream time
  // 10:05:50 is past it, so the record is late.
  produce_bytes(topic, {{"k", "{}", k_base + 4 * k_minute + 55'000}});
  for (int i = 0; i < 600 && ks.position_sum("per_minute") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(ks.position_sum("per_minute") == 3);
  http_client http(ks.port());
  auto a = http.get("/v1/stores/per_minute/windows/k?from=0");
  REQUIRE(a);
  REQUIRE(a->status == 200);
  const json body = a->body_json();
  std::vector<std::pair<int64_t, int64_t>> got;
  for (const auto& w : body["data"]) got.emplace_back(w["start"].get<int64_t>(), w["value"].get<int64_t>());
  INFO("windows: " << a->body);
  CHECK(got == std::vector<std::pair<int64_t, int64_t>>{{k_base + 5 * k_minute, 2}});
  CHECK(ks.metric_sum("kstate_ingest_late_records_total") == 1);
  CHECK(ks.terminate() == 0);
}

// RFC 3339 in UTC with milliseconds, from the C library's calendar.
static std::string format_iso(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

TEST_CASE("windowed reduce and aggregate over event times from a JSON field equal a recount") {
  const std::string topic = unique_name("readings");
  create_topic(topic, 3);
  // Event time in the value's field "t", alternately epoch ms and ISO-8601; the record
  // timestamps are a day earlier, so windows taken from them would all be wrong.
  auto events = make_events(3'000, 20, 20261204);
  std::vector<produced> records;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    json t = i % 2 ? json(e.ts) : json(format_iso(e.ts));
    records.push_back({e.key, json{{"n", e.n}, {"t", t}}.dump(), k_base - 86'400'000});
  }
  auto where = produce_bytes(topic, records);
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];

  const spec per_minute{k_minute, k_minute, k_minute, 300 * k_minute};
  window_model m;
  std::map<std::pair<std::string, int64_t>, json> max_of, stats_of;
  walk_windows(events, per_minute, m, [&](const event& e, int64_t start) {
    auto& mx = max_of[{e.key, start}];
    if (mx.is_null() || mx.get<int64_t>() < e.n) mx = e.n;
    auto& st = stats_of[{e.key, start}];
    if (st.is_null()) st = json{{"count", 0}, {"sum", 0}, {"min", e.n}, {"max", e.n}};
    st["count"] = st["count"].get<int64_t>() + 1;
    st["sum"] = st["sum"].get<int64_t>() + e.n;
    st["min"] = std::min(st["min"].get<int64_t>(), e.n);
    st["max"] = std::max(st["max"].get<int64_t>(), e.n);
  });
  REQUIRE(m.late > 30);

  const std::string window = "window: {type: tumbling, size: 1m, grace: 1m, retention: 5h, time_field: t}";
  kstate_process ks(unique_name("winfold"),
                    {{"max_per_minute", topic, "json", "", "string", "kind: reduce, reduce: max, value: n, " + window},
                     {"stats_per_minute", topic, "json", "", "string",
                      "kind: aggregate, fields: [count, sum, min, max], value: n, " + window}},
                    temp_dir("kstate-winfold"));
  ks.start();
  ks.wait_ready();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((ks.position_sum("max_per_minute") < static_cast<int64_t>(events.size()) ||
          ks.position_sum("stats_per_minute") < static_cast<int64_t>(events.size())) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(ks.position_sum("stats_per_minute") == static_cast<int64_t>(events.size()));
  CHECK(ks.metric_sum("kstate_ingest_late_records_total") == static_cast<double>(2 * m.late));

  auto read_all = [&](const std::string& store) {
    std::map<std::pair<std::string, int64_t>, json> out;
    http_client http(ks.port());
    std::string cursor;
    for (;;) {
      auto a = http.get("/v1/stores/" + store + "/windows?from=0&limit=1000" +
                        (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
      REQUIRE(a);
      REQUIRE(a->status == 200);
      auto body = a->body_json();
      for (const auto& w : body["data"]) out[{w["key"].get<std::string>(), w["start"].get<int64_t>()}] = w["value"];
      if (body["metadata"]["next"].is_null()) break;
      cursor = body["metadata"]["next"].get<std::string>();
    }
    return out;
  };
  CHECK(read_all("max_per_minute") == max_of);
  CHECK(read_all("stats_per_minute") == stats_of);
  MESSAGE(max_of.size() << " windows of reduce max and aggregate equal the recount; " << m.late << " late records");
  CHECK(ks.terminate() == 0);
}

TEST_CASE("one record dated year 9999 among normal ones: dead-lettered, stream time unmoved, every window recounted") {
  const std::string topic = unique_name("future"), dlq = unique_name("future-dlq");
  // The broker must take the timestamp too (Kafka 4 bounds future timestamps by default).
  kafka("topics --create --topic " + topic +
        " --partitions 3 --config message.timestamp.after.max.ms=9223372036854775807 >/dev/null");
  create_topic(dlq, 1);

  // Event time both as the record timestamp and in the field "t"; the record from the
  // year 9999 sits in the middle, keyed like the others.
  constexpr int64_t year_9999 = 253'402'214'400'000;  // 9999-12-31T00:00:00Z
  auto events = make_events(3'000, 20, 20261203);
  std::vector<produced> records;
  const size_t bad_at = 1'500;
  for (size_t i = 0; i < events.size(); ++i) {
    if (i == bad_at) records.push_back({"user-3", R"({"n":1,"t":"9999-12-31T00:00:00Z"})", year_9999});
    const auto& e = events[i];
    records.push_back({e.key, json{{"n", e.n}, {"t", e.ts}}.dump(), e.ts});
  }
  auto where = produce_bytes(topic, records);
  const auto bad_where = where[bad_at];
  where.erase(where.begin() + bad_at);
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];

  // Retention 1 h: the normal events span minutes, so only the bad record's stream
  // time could expire windows.
  const spec per_minute{k_minute, k_minute, k_minute, 60 * k_minute};
  const auto model = recount(events, per_minute, false);
  const std::string window = "window: {type: tumbling, size: 1m, grace: 1m, retention: 1h";
  kstate_process ks(unique_name("future"),
                    {{"by_timestamp", topic, "json", dlq, "string", "kind: count, " + window + "}"},
                     {"by_field", topic, "json", dlq, "string", "kind: count, " + window + ", time_field: t}"}},
                    temp_dir("kstate-future"));
  ks.start();
  ks.wait_ready();
  const auto total = static_cast<int64_t>(records.size());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((ks.position_sum("by_timestamp") < total || ks.position_sum("by_field") < total) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(ks.position_sum("by_timestamp") == total);
  REQUIRE(ks.position_sum("by_field") == total);

  // Rejected once by each view: counted as invalid and as from the future, and never late.
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 2);
  CHECK(ks.metric_sum("kstate_ingest_future_records_total") == 2);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == 2);
  CHECK(ks.metric_sum("kstate_ingest_late_records_total") == static_cast<double>(2 * model.late));

  http_client http(ks.port());
  for (const std::string store : {"by_timestamp", "by_field"}) {
    for (int k = 0; k < 20; ++k) {
      const std::string key = "user-" + std::to_string(k);
      auto a = http.get("/v1/stores/" + store + "/windows/" + key + "?from=0");
      REQUIRE(a);
      REQUIRE(a->status == 200);
      const json body = a->body_json();
      const int32_t p = body["partition"].get<int32_t>();
      std::vector<std::pair<int64_t, int64_t>> got, want;
      for (const auto& w : body["data"]) got.emplace_back(w["start"].get<int64_t>(), w["value"].get<int64_t>());
      for (const auto& [kw, v] : model.values)
        if (kw.first == key && kw.second + per_minute.size + per_minute.retention > model.stream_time.at(p))
          want.emplace_back(kw.second, v);
      CAPTURE(store);
      CAPTURE(key);
      CHECK(!want.empty());
      CHECK(got == want);
      // Stream time is the largest normal event time of the key's partition.
      CHECK(body["stream_time"].get<int64_t>() == model.stream_time.at(p));
      CHECK(body["stream_time"].get<int64_t>() < year_9999);
    }
  }

  // The dead letters: the record from the year 9999, once per view, with the reason.
  std::set<std::string> views;
  for (const auto& r : consume_all(dlq, 2)) {
    CHECK(r.headers.at("kstate.topic") == topic);
    CHECK(std::stoi(r.headers.at("kstate.partition")) == bad_where.first);
    CHECK(std::stoll(r.headers.at("kstate.offset")) == bad_where.second);
    CHECK(r.headers.at("kstate.reason").find("event time 9999-12-31T00:00:00.000Z is more than max_future") == 0);
    views.insert(r.headers.at("kstate.view"));
  }
  CHECK(views == std::set<std::string>{"by_timestamp", "by_field"});
  CHECK(ks.terminate() == 0);
}
