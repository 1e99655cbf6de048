// kill -9 at random moments while windowed counts and sums are computed under
// exactly_once: every window in the end equals a recount of the events (nothing lost,
// nothing counted twice, the same records late), and so does the state rebuilt from
// the changelogs alone after the state directory is deleted.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "agg_common.h"
#include "window_common.h"

using namespace kstate::testing;

namespace {

using windows = std::map<std::pair<std::string, int64_t>, int64_t>;  // (key, start) -> value

// Every window of a store over HTTP, paged through the cluster-wide route.
windows read_windows(uint16_t port, const std::string& store) {
  windows out;
  http_client http(port);
  std::string cursor;
  for (;;) {
    auto a = http.get("/v1/stores/" + store + "/windows?from=0&limit=1000" +
                      (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
    if (!a || a->status != 200) return {};
    auto body = a->body_json();
    for (const auto& w : body["data"])
      out[{w["key"].get<std::string>(), w["start"].get<int64_t>()}] = w["value"].get<int64_t>();
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

// Waits until the store answers `expected` (or the deadline); returns the last answer.
windows wait_windows(uint16_t port, const std::string& store, const windows& expected, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  windows got;
  while (std::chrono::steady_clock::now() < deadline) {
    got = read_windows(port, store);
    if (got == expected) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  return got;
}

// Windows of the model that are not expired at their partition's final stream time.
windows answerable(const window_model& m, const spec& s, const std::vector<event>& events) {
  std::map<std::string, int32_t> partition_of;
  for (const auto& e : events) partition_of[e.key] = e.partition;
  windows out;
  for (const auto& [kw, v] : m.values)
    if (kw.second + s.size + s.retention > m.stream_time.at(partition_of.at(kw.first))) out[kw] = v;
  return out;
}

// Keys whose windows differ from the model: missing, extra, or another value.
size_t differences(const windows& got, const windows& want) {
  size_t n = 0;
  for (const auto& [kw, v] : want) {
    auto it = got.find(kw);
    if (it == got.end() || it->second != v) ++n;
  }
  for (const auto& [kw, v] : got)
    if (!want.count(kw)) ++n;
  return n;
}

}  // namespace

TEST_CASE("exactly_once: kill -9 at least 10 times during windowed ingest; every window equals the recount") {
  const std::string topic = unique_name("eos-clicks");
  create_topic(topic, 3);
  // 16,000 events over 60 keys, about 20 minutes of event time, out of order within the
  // grace and 3% late.
  auto events = make_events(16'000, 60, 7);
  auto records = to_records(events);
  // A group field for the re-keyed view: "g0".."g9".
  for (size_t i = 0; i < events.size(); ++i)
    records[i].value =
        "{\"g\":\"g" + std::to_string(events[i].n % 10) + "\",\"n\":" + std::to_string(events[i].n) + "}";

  const spec per_minute{k_minute, k_minute, k_minute, 120 * k_minute};
  const spec hopping{k_minute, 20'000, 30'000, 120 * k_minute};
  const std::vector<kstate_process::view> views{
      {"per_minute", topic, "json", "", "string",
       "kind: count, window: {type: tumbling, size: 1m, grace: 1m, retention: 2h}"},
      {"hopping_sum", topic, "json", "", "string",
       "kind: sum, value: n, window: {type: hopping, size: 1m, advance: 20s, grace: 30s, retention: 2h}"},
      // Re-keyed through the repartition topic. The grace (1 h) exceeds any event's
      // lateness, so no record is late whatever order the repartition topic has.
      {"by_group", topic, "json", "", "string",
       "kind: count, group_by: {json: g}, window: {type: tumbling, size: 1m, grace: 1h, retention: 3h}"}};
  const auto app = unique_name("eos-win");
  const auto dir = temp_dir("eos-win");
  kstate_process ks(app, views, dir + "/state", "processing_guarantee: exactly_once\n");
  ks.extra_args({"-X", "group.instance.id=" + app + "-0"});

  const int chunks = 8;
  std::atomic<int> produced_chunks{0};
  std::thread producer([&] {
    const size_t n = records.size() / chunks;
    for (int c = 0; c < chunks; ++c) {
      auto first = c * n, last = c == chunks - 1 ? records.size() : (c + 1) * n;
      auto where = produce_bytes(topic, std::vector<produced>(records.begin() + first, records.begin() + last));
      for (size_t i = first; i < last; ++i) std::tie(events[i].partition, events[i].offset) = where[i - first];
      ++produced_chunks;
    }
  });

  int kills = 0;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> delay_ms(100, 1500);
  while (produced_chunks < chunks || kills < 10) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ks.kill9();
    ++kills;
  }
  producer.join();

  // The recount needs every event's partition and offset, known once all are produced.
  const auto count_model = recount(events, per_minute, false);
  const auto sum_model = recount(events, hopping, true);
  REQUIRE(count_model.late > 100);
  const auto want_counts = answerable(count_model, per_minute, events);
  const auto want_sums = answerable(sum_model, hopping, events);
  windows want_groups;
  for (const auto& e : events) ++want_groups[{"g" + std::to_string(e.n % 10), e.ts / k_minute * k_minute}];

  ks.start();
  ks.wait_ready();
  auto counts = wait_windows(ks.port(), "per_minute", want_counts, std::chrono::seconds(120));
  auto sums = wait_windows(ks.port(), "hopping_sum", want_sums, std::chrono::seconds(60));
  auto groups = wait_windows(ks.port(), "by_group", want_groups, std::chrono::seconds(60));
  MESSAGE(kills << " kills; " << want_counts.size() << " count windows, " << want_sums.size()
                << " hopping sum windows, " << want_groups.size()
                << " re-keyed windows; differences: " << differences(counts, want_counts) << ", "
                << differences(sums, want_sums) << " and " << differences(groups, want_groups));
  CHECK(kills >= 10);
  CHECK(differences(counts, want_counts) == 0);
  CHECK(differences(sums, want_sums) == 0);
  CHECK(differences(groups, want_groups) == 0);
  REQUIRE(ks.terminate() == 0);

  // State deleted: the windows come back from the changelogs alone, with the same
  // values, and the stream time restored with them keeps expired windows expired.
  std::filesystem::remove_all(dir + "/state");
  ks.start();
  ks.wait_ready();
  CHECK(differences(wait_windows(ks.port(), "per_minute", want_counts, std::chrono::seconds(120)), want_counts) == 0);
  CHECK(differences(wait_windows(ks.port(), "hopping_sum", want_sums, std::chrono::seconds(60)), want_sums) == 0);
  CHECK(differences(wait_windows(ks.port(), "by_group", want_groups, std::chrono::seconds(60)), want_groups) == 0);
  CHECK(ks.terminate() == 0);
}
