// Standby copies of aggregate views: with standby_replicas 1 each instance follows the
// changelogs of the other's partitions (a re-keyed sum, a windowed count and a session
// count; a join).
// When the owner is killed, allow_stale reads answer from the copy, and the survivor
// takes the partitions over restoring only the changelog tail the copy had not applied
// (here none): without the copy it would read every changelog record of those
// partitions, at least one per key.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "standby_common.h"
#include "window_common.h"

using namespace kstate::testing;

TEST_CASE(
    "standby copies of aggregate views follow their changelogs: stale reads while the owner is down, and a fail-over "
    "that restores only the tail") {
  // 4 source partitions and 6 of the repartition topic: whatever the split of the 10
  // between two instances, one of them owns partitions of both store topics.
  const int partitions = 4, repartitions = 6;
  auto topic = unique_name("sbagg");
  create_topic(topic, partitions);
  auto app = unique_name("sbagg-app");
  const std::string repartition = app + "-by_group-repartition";

  // 6,000 events over 60 keys, a group field over 400 groups: the sum is re-keyed by
  // group (its store topic is the repartition topic), the windowed count is by key.
  auto events = make_events(6'000, 60, 20261207);
  std::vector<produced> records;
  std::map<std::string, int64_t> sums;  // the model of by_group
  for (const auto& e : events) {
    const std::string g = "g" + std::to_string(e.n % 400);
    sums[g] += e.n;
    records.push_back({e.key, R"({"n":)" + std::to_string(e.n) + R"(,"g":")" + g + "\"}", e.ts});
  }
  const spec per_minute{k_minute, k_minute, k_minute, 60 * k_minute};

  auto dir = temp_dir("sbagg");
  const std::vector<kstate_process::view> views{
      {"by_group", topic, "json", "", "string", "kind: sum, group_by: {json: g}, value: n, repartition_partitions: 6"},
      {"per_minute", topic, "json", "", "string",
       "kind: count, window: {type: tumbling, size: 1m, grace: 1m, retention: 1h}"},
      // A grace longer than any event is behind, a retention longer than the stream:
      // no event is late and no session expires.
      {"sessions", topic, "json", "", "string",
       "kind: count, window: {type: session, inactivity_gap: 10s, grace: 2h, retention: 1d}"}};
  const std::string extra = "standby_replicas: 1\nprocessing_guarantee: exactly_once\n";
  kstate_process a(app, views, dir + "/a", extra);
  kstate_process b(app, views, dir + "/b", extra);
  a.start();
  a.wait_ready();
  b.start();
  b.wait_ready();
  auto both_own = [&] {
    return cluster_settled(a.port(), 2, partitions + repartitions) && owners(a.port()).size() == 2;
  };
  for (int i = 0; i < 600 && !both_own(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(both_own());
  // The instance killed later ("B") owns partitions of both store topics; the other
  // ("A") keeps the standby copies of them.
  auto covers_both = [&](const std::set<std::pair<std::string, int>>& parts) {
    std::set<std::string> topics;
    for (const auto& p : parts) topics.insert(p.first);
    return topics.size() == 2;
  };
  const auto split = owners(a.port());
  kstate_process& victim = covers_both(split.at(b.endpoint())) ? b : a;
  kstate_process& survivor = &victim == &b ? a : b;
  const auto b_parts = split.at(victim.endpoint());
  REQUIRE(covers_both(b_parts));
  MESSAGE("the instance killed later owns " << b_parts.size() << " partitions");

  // The data comes while B owns its partitions: on A only the standby copies can have
  // it (A owned none of them, or owned them empty before the other instance joined).
  auto where = produce_bytes(topic, records);
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];
  const auto windows = recount(events, per_minute, false);
  REQUIRE(windows.late > 0);
  // Sessions: with nothing late or expired, the runs of a key's event times whose
  // neighbours are at most the gap apart, (key, start) -> (last, count).
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, int64_t>> sessions;
  {
    std::map<std::string, std::vector<int64_t>> times;
    for (const auto& e : events) times[e.key].push_back(e.ts);
    for (auto& [key, ts] : times) {
      std::sort(ts.begin(), ts.end());
      int64_t start = ts[0], last = ts[0], n = 0;
      for (int64_t t : ts) {
        if (t - last > 10'000) {
          sessions[{key, start}] = {last, n};
          start = t;
          n = 0;
        }
        last = t;
        ++n;
      }
      sessions[{key, start}] = {last, n};
    }
  }

  // The owners' answers equal the models.
  std::map<std::string, json> sums_json(sums.begin(), sums.end());
  // The number of stale pages when the store equals the model; -1 when it does not.
  auto sums_equal = [&](uint16_t port, const std::string& query) {
    auto got = read_pages(port, "by_group", query);
    return got && got->first == sums_json ? got->second : -1;
  };
  auto sessions_equal = [&](uint16_t port) {
    http_client c(port);
    std::map<std::pair<std::string, int64_t>, std::pair<int64_t, int64_t>> got;
    std::string cursor;
    for (;;) {
      auto r = c.get("/v1/stores/sessions/windows?from=0&limit=200" + (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
      if (!r || r->status != 200) return false;
      const json body = r->body_json();
      for (const auto& w : body["data"])
        got[{w["key"].get<std::string>(), w["start"].get<int64_t>()}] = {w["end"].get<int64_t>() - 1,
                                                                         w["value"].get<int64_t>()};
      if (body["metadata"]["next"].is_null()) break;
      cursor = body["metadata"]["next"].get<std::string>();
    }
    return got == sessions;
  };
  auto windows_equal = [&](uint16_t port) {
    if (!sessions_equal(port)) return false;
    http_client c(port);
    std::map<std::pair<std::string, int64_t>, int64_t> got;
    for (int k = 0; k < 60; ++k) {
      const std::string key = "user-" + std::to_string(k);
      auto r = c.get("/v1/stores/per_minute/windows/" + key + "?from=0");
      if (!r || r->status != 200) return false;
      const json body = r->body_json();
      for (const auto& w : body["data"]) got[{key, w["start"].get<int64_t>()}] = w["value"].get<int64_t>();
    }
    return got == windows.values;
  };
  bool owners_done = false;
  for (int i = 0; i < 600 && !owners_done; ++i) {
    owners_done = sums_equal(survivor.port(), "") >= 0 && windows_equal(survivor.port());
    if (!owners_done) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE(owners_done);

  // What a restore without the copies would read at least: one changelog record per
  // key (group, or key and window) of B's partitions.
  size_t b_groups = 0, b_windows = 0, b_sessions = 0;
  {
    http_client c(survivor.port());
    for (const auto& [g, v] : sums) {
      auto m = c.get("/v1/stores/by_group/keys/" + g + "/metadata");
      REQUIRE(m);
      REQUIRE(m->status == 200);
      if (m->body_json()["active_owner"] == victim.endpoint()) ++b_groups;
    }
    std::map<std::string, int32_t> partition_of;
    for (const auto& e : events) partition_of[e.key] = e.partition;
    for (const auto& [kw, v] : windows.values)
      if (b_parts.count({topic, partition_of.at(kw.first)})) ++b_windows;
    for (const auto& [ks, v] : sessions)
      if (b_parts.count({topic, partition_of.at(ks.first)})) ++b_sessions;
  }
  REQUIRE(b_groups > 40);
  REQUIRE(b_windows > 40);
  REQUIRE(b_sessions > 40);

  // The copies follow the changelogs on their own: give them a moment to reach the end.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double restored_sums = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"by_group\"");
  const double restored_windows = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"per_minute\"");
  const double restored_sessions = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"sessions\"");

  victim.kill9();
  // Until the session timeout B is the owner on record but does not answer: the
  // allow_stale pages read B's partitions from A's copy, and equal the model.
  const int stale_pages = sums_equal(survivor.port(), "&allow_stale=true");
  MESSAGE(stale_pages << " stale pages of by_group from the standby copy");
  CHECK(stale_pages > 0);
  {
    // Key lookups of B's groups: from the copy, marked stale, with the model's value.
    http_client c(survivor.port());
    size_t stale = 0;
    for (const auto& [g, v] : sums) {
      auto r = c.get("/v1/stores/by_group/keys/" + g + "?allow_stale=true");
      REQUIRE(r);
      CHECK_MESSAGE(r->status == 200, r->body);
      if (r->status != 200) continue;
      auto body = r->body_json();
      CHECK(body["value"] == v);
      if (body.value("stale", false)) ++stale;
    }
    MESSAGE(stale << " stale key answers of " << b_groups << " groups of B's partitions");
    CHECK(stale > 0);
  }

  // A takes everything over: the restores read only what the copies had not applied.
  bool alone = false;
  for (int i = 0; i < 300 && !alone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    alone = cluster_settled(survivor.port(), 1, partitions + repartitions);
  }
  REQUIRE(alone);
  const double sums_after = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"by_group\"");
  const double windows_after = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"per_minute\"");
  const double sessions_after = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"sessions\"");
  MESSAGE("fail-over restored " << sums_after - restored_sums << " changelog records of by_group (" << b_groups
                                << " groups in B's partitions) and " << windows_after - restored_windows
                                << " of per_minute (" << b_windows << " windows) and "
                                << sessions_after - restored_sessions << " of sessions (" << b_sessions
                                << " sessions)");
  CHECK((sums_after - restored_sums) * 10 < static_cast<double>(b_groups));
  CHECK((windows_after - restored_windows) * 10 < static_cast<double>(b_windows));
  CHECK((sessions_after - restored_sessions) * 10 < static_cast<double>(b_sessions));
  // Every answer now comes from the survivor's own partitions (not stale).
  bool served = false;
  for (int i = 0; i < 300 && !served; ++i) {
    served = sums_equal(survivor.port(), "") == 0 && windows_equal(survivor.port());
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK(served);
  CHECK(survivor.terminate() == 0);
}

TEST_CASE("a standby copy of a join view keeps both sides: stale reads, and a fail-over that restores nothing") {
  const int partitions = 4;
  auto left = unique_name("sbj-orders"), right = unique_name("sbj-customers");
  create_topic(left, partitions);
  create_topic(right, partitions);
  auto app = unique_name("sbj-app");
  const std::string store_topic = app + "-j-repartition";
  const std::vector<kstate_process::view> views{
      {"j", left, "json", "", "string",
       "kind: join, join: {type: left, right: " + right + ", left_name: order, right_name: customer}"}};
  auto dir = temp_dir("sbj");
  const std::string extra = "standby_replicas: 1\nprocessing_guarantee: exactly_once\n";
  kstate_process a(app, views, dir + "/a", extra);
  kstate_process b(app, views, dir + "/b", extra);
  a.start();
  a.wait_ready();
  b.start();
  b.wait_ready();
  // 12 partitions (both inputs and the repartition topic, the store topic).
  auto both_own = [&] { return cluster_settled(a.port(), 2, 3 * partitions) && owners(a.port()).size() == 2; };
  for (int i = 0; i < 600 && !both_own(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(both_own());
  // The instance killed later ("B") is the one owning more of the store topic.
  auto store_parts = [&](const std::set<std::pair<std::string, int>>& parts) {
    std::set<int> out;
    for (const auto& [t, p] : parts)
      if (t == store_topic) out.insert(p);
    return out;
  };
  const auto split = owners(a.port());
  kstate_process& victim =
      store_parts(split.at(b.endpoint())).size() >= store_parts(split.at(a.endpoint())).size() ? b : a;
  kstate_process& survivor = &victim == &b ? a : b;
  const auto b_parts = store_parts(split.at(victim.endpoint()));
  REQUIRE(!b_parts.empty());

  // Orders and customers over 400 keys, about one in six a tombstone; the model keeps
  // each side's latest value, and a left join has a row for every key with an order.
  std::mt19937 rng(20261207);
  std::uniform_int_distribution<int> key(0, 399), amount(1, 1000), six(0, 5);
  std::vector<produced> orders, customers;
  for (int i = 0; i < 3000; ++i) {
    auto k = "k" + std::to_string(key(rng));
    if (six(rng) == 0) orders.push_back({k, std::nullopt});
    else orders.push_back({k, json{{"amount", amount(rng)}, {"n", i}}.dump()});
    k = "k" + std::to_string(key(rng));
    if (six(rng) == 0) customers.push_back({k, std::nullopt});
    else customers.push_back({k, json{{"name", "c" + std::to_string(i)}}.dump()});
  }
  auto at_left = produce_bytes(left, orders);
  auto at_right = produce_bytes(right, customers);
  table_model lm, rm;
  std::set<std::string> b_keys;  // keys of B's partitions (a join keeps partition numbers)
  for (size_t i = 0; i < orders.size(); ++i) {
    apply_record(lm, orders[i]);
    if (b_parts.count(at_left[i].first)) b_keys.insert(*orders[i].key);
  }
  for (size_t i = 0; i < customers.size(); ++i) {
    apply_record(rm, customers[i]);
    if (b_parts.count(at_right[i].first)) b_keys.insert(*customers[i].key);
  }
  std::map<std::string, json> model;
  for (const auto& [k, v] : lm) {
    auto c = rm.find(k);
    model[k] = {{"order", json::parse(v)}, {"customer", c == rm.end() ? json() : json::parse(c->second)}};
  }
  REQUIRE(b_keys.size() > 40);

  bool owners_done = false;
  for (int i = 0; i < 600 && !owners_done; ++i) {
    auto got = read_pages(survivor.port(), "j", "");
    owners_done = got && got->first == model;
    if (!owners_done) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE(owners_done);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double restored_before = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"j\"");

  victim.kill9();
  auto stale = read_pages(survivor.port(), "j", "&allow_stale=true");
  REQUIRE(stale);
  CHECK(stale->first == model);
  MESSAGE(stale->second << " stale pages of j from the standby copy");
  CHECK(stale->second > 0);

  bool alone = false;
  for (int i = 0; i < 300 && !alone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    alone = cluster_settled(survivor.port(), 1, 3 * partitions);
  }
  REQUIRE(alone);
  const double restored = metric_with(survivor.port(), "kstate_restore_records_total", "store=\"j\"") - restored_before;
  MESSAGE("fail-over restored " << restored << " changelog records of j (" << b_keys.size()
                                << " keys in B's partitions)");
  CHECK(restored * 10 < static_cast<double>(b_keys.size()));
  // Every answer now comes from the survivor's own partitions (not stale).
  std::string why;
  bool served = false;
  for (int i = 0; i < 300 && !served; ++i) {
    auto after = read_pages(survivor.port(), "j", "", &why);
    served = after && after->first == model && after->second == 0;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK_MESSAGE(served, why);
  CHECK(survivor.terminate() == 0);
}
