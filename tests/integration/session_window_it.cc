// Session windows against the real broker: events with chosen timestamps (out of order,
// later than grace, and a late record that bridges two sessions) are counted and summed
// per session; every session read over HTTP (per key and in cluster-wide pages) equals
// sessions recomputed here from the events by the documented rules; and a restore from
// the changelog alone (state directory deleted) gives the same sessions, the merged-away
// ones absent.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "agg_common.h"
#include "support.h"
#include "window_common.h"

using namespace kstate::testing;

namespace {

constexpr int64_t k_gap = 5 * k_minute;
constexpr int64_t k_grace = k_minute;

struct session {
  int64_t start, last, count, sum;
  bool operator==(const session&) const = default;
};
using sessions_by_key = std::map<std::string, std::vector<session>>;

struct session_model {
  sessions_by_key live;  // sessions of the accepted records, by key, ascending
  std::map<int32_t, int64_t> stream_time;
  int64_t late = 0;
};

// The sessions of a key's records by definition: sorted by time, a new session wherever
// two neighbours are more than the gap apart.
std::vector<session> sessions_of(std::vector<const event*> records) {
  std::sort(records.begin(), records.end(), [](const event* a, const event* b) { return a->ts < b->ts; });
  std::vector<session> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const event& e = *records[i];
    if (i == 0 || e.ts - records[i - 1]->ts > k_gap) out.push_back(session{e.ts, e.ts, 0, 0});
    out.back().last = e.ts;
    ++out.back().count;
    out.back().sum += e.n;
  }
  return out;
}

// Per partition in offset order, stream time = largest event time so far. A record is
// late when the session it would be part of (among the accepted records of its key and
// itself) has last + gap + grace < stream time; otherwise it is accepted.
session_model recount_sessions(const std::vector<event>& events) {
  std::vector<const event*> order;
  for (const auto& e : events) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const event* a, const event* b) {
    return std::tie(a->partition, a->offset) < std::tie(b->partition, b->offset);
  });
  session_model m;
  std::map<std::string, std::vector<const event*>> accepted;
  for (const event* e : order) {
    auto& st = m.stream_time.try_emplace(e->partition, -1).first->second;
    st = std::max(st, e->ts);
    auto with = accepted[e->key];
    with.push_back(e);
    bool late = false;
    for (const auto& s : sessions_of(with))
      if (e->ts >= s.start && e->ts <= s.last) late = s.last + k_gap + k_grace < st;
    if (late) ++m.late;
    else accepted[e->key].push_back(e);
  }
  for (const auto& [key, records] : accepted) m.live[key] = sessions_of(records);
  return m;
}

// With a retention short enough for sessions to expire: the sessions answered at the
// end, and the late records. Kept as a list of sessions per key, since a record never
// joins an expired session (docs/windows.md): per partition in offset order, a record
// joins every unexpired session with start - gap <= t <= last + gap; the merged session
// is late when last + gap + grace < stream time; sessions with last + retention < the
// final stream time are not answered.
struct retention_model {
  sessions_by_key answered;
  int64_t late = 0;
  size_t expired = 0;
};
retention_model recount_with_retention(const std::vector<event>& events, int64_t retention) {
  std::vector<const event*> order;
  for (const auto& e : events) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const event* a, const event* b) {
    return std::tie(a->partition, a->offset) < std::tie(b->partition, b->offset);
  });
  std::map<int32_t, int64_t> stream_time;
  std::map<int32_t, std::set<std::string>> keys_of;
  sessions_by_key all;
  retention_model m;
  for (const event* e : order) {
    auto& st = stream_time.try_emplace(e->partition, -1).first->second;
    st = std::max(st, e->ts);
    keys_of[e->partition].insert(e->key);
    auto& list = all[e->key];
    session merged{e->ts, e->ts, 1, e->n};
    std::vector<size_t> joined;
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& s = list[i];
      if (s.last + retention < st) continue;  // expired: never joined
      if (s.start - k_gap <= e->ts && e->ts <= s.last + k_gap) joined.push_back(i);
    }
    for (size_t i : joined) {
      merged.start = std::min(merged.start, list[i].start);
      merged.last = std::max(merged.last, list[i].last);
      merged.count += list[i].count;
      merged.sum += list[i].sum;
    }
    if (merged.last + k_gap + k_grace < st) {
      ++m.late;
      continue;
    }
    for (auto it = joined.rbegin(); it != joined.rend(); ++it) list.erase(list.begin() + static_cast<long>(*it));
    list.push_back(merged);
    std::sort(list.begin(), list.end(), [](const session& a, const session& b) { return a.start < b.start; });
  }
  for (const auto& [p, keys] : keys_of)
    for (const auto& key : keys)
      for (const auto& s : all[key]) {
        if (s.last + retention < stream_time.at(p)) {
          ++m.expired;
          continue;
        }
        m.answered[key].push_back(session{s.start, s.last, s.count, 0});
      }
  return m;
}

// Keys "user-0".."user-11" active in turns: every 6 minutes of event time a random half
// of them are quiet (longer than the gap, so their sessions end); 20% of events are up
// to 40 s out of order, 3% are 8-15 min behind (late unless their key's session still
// reaches back that far). Then, for key "bridge": sessions [E-3m, E-2m] and [E+4m,
// E+5m], 6 min apart, bridged by a record at E+1m that arrives last, and one record at
// E-20m, past grace.
std::vector<event> make_session_events(uint64_t seed, int64_t& bridge_end, int steps = 4'000) {
  std::mt19937_64 rng(seed);
  std::vector<event> events;
  int64_t clock = k_base;
  std::set<int> quiet;
  int64_t phase = -1;
  for (int i = 0; i < steps; ++i) {
    clock += static_cast<int64_t>(rng() % 1'600);
    if ((clock - k_base) / (6 * k_minute) != phase) {
      phase = (clock - k_base) / (6 * k_minute);
      quiet.clear();
      while (quiet.size() < 6) quiet.insert(static_cast<int>(rng() % 12));
    }
    int k = static_cast<int>(rng() % 12);
    if (quiet.count(k)) continue;
    event e;
    e.key = "user-" + std::to_string(k);
    e.ts = clock;
    const auto dice = rng() % 100;
    if (dice < 20) e.ts = clock - static_cast<int64_t>(rng() % 40'000);
    else if (dice < 23) e.ts = clock - 8 * k_minute - static_cast<int64_t>(rng() % (7 * k_minute));
    e.n = static_cast<int64_t>(rng() % 1000);
    events.push_back(std::move(e));
  }
  const int64_t end = clock;
  for (int64_t at : {end - 3 * k_minute, end - 2 * k_minute, end + 4 * k_minute, end + 5 * k_minute, end + k_minute,
                     end - 20 * k_minute})
    events.push_back(event{"bridge", at, 1});
  bridge_end = end;
  return events;
}

// The records, with a group field "g" ("g0".."g6") for the re-keyed view.
std::vector<produced> with_group(const std::vector<event>& events) {
  std::vector<produced> records;
  for (const auto& e : events)
    records.push_back({e.key, json{{"n", e.n}, {"g", "g" + std::to_string(e.n % 7)}}.dump(), e.ts});
  return records;
}

// Sessions of the re-keyed view (group_by g, grace 2h): no record is late whatever order
// the repartition topic gives them, so they are the sessions of each group's records.
sessions_by_key group_sessions(const std::vector<event>& events) {
  std::map<std::string, std::vector<const event*>> groups;
  for (const auto& e : events) groups["g" + std::to_string(e.n % 7)].push_back(&e);
  sessions_by_key out;
  for (const auto& [g, records] : groups)
    for (const auto& s : sessions_of(records)) out[g].push_back(session{s.start, s.last, s.count, 0});
  return out;
}

// Every session of `store` read page by page from /windows (limit 7 to cross pages).
sessions_by_key read_pages(http_client& http, const std::string& store) {
  sessions_by_key out;
  std::string cursor;
  for (;;) {
    auto a =
        http.get("/v1/stores/" + store + "/windows?from=0&limit=7" + (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
    REQUIRE(a);
    REQUIRE(a->status == 200);
    auto body = a->body_json();
    for (const auto& w : body["data"]) {
      const auto& v = w["value"];
      const int64_t n = v.is_object() ? v["count"].get<int64_t>() : v.get<int64_t>();
      const int64_t sum = v.is_object() ? v["sum"].get<int64_t>() : 0;
      out[w["key"].get<std::string>()].push_back(
          session{w["start"].get<int64_t>(), w["end"].get<int64_t>() - 1, n, sum});
    }
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

// read_pages once it equals `want`, or after 60 s (the repartition topic's records are
// applied after the source's: positions of the source do not say they are in).
sessions_by_key wait_pages(http_client& http, const std::string& store, const sessions_by_key& want) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto got = read_pages(http, store);
  while (got != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    got = read_pages(http, store);
  }
  return got;
}

// The sessions of `key` overlapping [from, to), from /windows/{key}.
std::vector<session> read_key(http_client& http, const std::string& store, const std::string& key, int64_t from,
                              int64_t to, int64_t* stream_time = nullptr) {
  auto a = http.get("/v1/stores/" + store + "/windows/" + key + "?from=" + std::to_string(from) +
                    "&to=" + std::to_string(to));
  REQUIRE(a);
  REQUIRE(a->status == 200);
  auto body = a->body_json();
  if (stream_time) *stream_time = body["stream_time"].get<int64_t>();
  std::vector<session> out;
  for (const auto& w : body["data"]) {
    const auto& v = w["value"];
    out.push_back(session{w["start"].get<int64_t>(), w["end"].get<int64_t>() - 1,
                          v.is_object() ? v["count"].get<int64_t>() : v.get<int64_t>(),
                          v.is_object() ? v["sum"].get<int64_t>() : 0});
  }
  return out;
}

void wait_applied(kstate_process& ks, const std::vector<std::string>& stores, int64_t total) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  auto done = [&] {
    for (const auto& s : stores)
      if (ks.position_sum(s) < total) return false;
    return true;
  };
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const auto& s : stores) REQUIRE(ks.position_sum(s) == total);
}

// The checks both cases make, against the model: every key's sessions per key and in
// pages, an interval query, and the bridged sessions merged.
void check_sessions(http_client& http, const session_model& m, const std::vector<event>& events, int64_t bridge_end) {
  // Count view: {count} only; aggregate view: count and sum.
  sessions_by_key want_count, want_stats;
  for (const auto& [key, list] : m.live)
    for (const auto& s : list) {
      want_count[key].push_back(session{s.start, s.last, s.count, 0});
      want_stats[key].push_back(s);
    }
  CHECK(read_pages(http, "session_count") == want_count);
  CHECK(read_pages(http, "session_stats") == want_stats);
  size_t n = 0;
  for (const auto& [key, list] : want_count) {
    int64_t st = -1;
    CAPTURE(key);
    CHECK(read_key(http, "session_count", key, 0, INT64_MAX, &st) == list);
    int32_t p = -1;
    for (const auto& e : events)
      if (e.key == key) p = e.partition;
    CHECK(st == m.stream_time.at(p));
    n += list.size();
  }
  // An interval selects the sessions overlapping it: start < to and last + 1 > from.
  const int64_t from = k_base + 10 * k_minute, to = k_base + 25 * k_minute;
  size_t selected = 0;
  for (const auto& [key, list] : want_count) {
    std::vector<session> in;
    for (const auto& s : list)
      if (s.start < to && s.last + 1 > from) in.push_back(s);
    CAPTURE(key);
    CHECK(read_key(http, "session_count", key, from, to) == in);
    selected += in.size();
  }
  CHECK(selected > 0);
  CHECK(selected < n);
  // The bridge: one session of 5 records; the record past grace is not in it.
  const std::vector<session> bridged{{bridge_end - 3 * k_minute, bridge_end + 5 * k_minute, 5, 0}};
  CHECK(read_key(http, "session_count", "bridge", 0, INT64_MAX) == bridged);
  MESSAGE(n << " sessions equal the recount; " << m.late << " late records");
}

void run_case(const std::string& name, const std::string& extra_yaml, const std::string& view_extra, bool kill) {
  const std::string topic = unique_name(name);
  create_topic(topic, 3);
  int64_t bridge_end = 0;
  auto events = make_session_events(20261207, bridge_end);
  auto where = produce_bytes(topic, with_group(events));
  for (size_t i = 0; i < events.size(); ++i) std::tie(events[i].partition, events[i].offset) = where[i];
  const auto m = recount_sessions(events);
  REQUIRE(m.late > 5);
  size_t sessions = 0;
  for (const auto& [k, l] : m.live) sessions += l.size();
  REQUIRE(sessions > m.live.size());  // keys with several sessions

  // Retention 10 min: the sessions of the first hour expire by the end.
  const auto recent = recount_with_retention(events, 10 * k_minute);
  REQUIRE(recent.expired > 0);
  REQUIRE(!recent.answered.empty());
  const std::string window = "window: {type: session, inactivity_gap: 5m, grace: 1m}";
  const std::vector<kstate_process::view> views{
      {"session_count", topic, "json", "", "string", "kind: count, " + window + view_extra},
      {"session_stats", topic, "json", "", "string",
       "kind: aggregate, fields: [count, sum], value: n, " + window + view_extra},
      {"session_recent", topic, "json", "", "string",
       "kind: count, window: {type: session, inactivity_gap: 5m, grace: 1m, retention: 10m}" + view_extra},
      // Re-keyed through the repartition topic.
      {"session_by_group", topic, "json", "", "string",
       "kind: count, group_by: {json: g}, window: {type: session, inactivity_gap: 5m, grace: 2h}" + view_extra}};
  const auto groups = group_sessions(events);
  const std::vector<std::string> stores{"session_count", "session_stats", "session_recent"};
  const std::string app = unique_name(name);
  const std::string dir = temp_dir("kstate-" + name);
  const auto total = static_cast<int64_t>(events.size());
  {
    kstate_process ks(app, views, dir + "/state", extra_yaml);
    ks.start();
    ks.wait_ready();
    wait_applied(ks, stores, total);
    CHECK(ks.metric_sum("kstate_ingest_late_records_total") == static_cast<double>(2 * m.late + recent.late));
    http_client http(ks.port());
    check_sessions(http, m, events, bridge_end);
    CHECK(read_pages(http, "session_recent") == recent.answered);
    CHECK(wait_pages(http, "session_by_group", groups) == groups);
    if (kill) ks.kill9();
    else CHECK(ks.terminate() == 0);
  }
  // The state directory gone: every partition is restored from the changelogs, whose
  // tombstones delete the merged-away sessions.
  std::filesystem::remove_all(dir + "/state");
  kstate_process ks(app, views, dir + "/state", extra_yaml);
  ks.start();
  ks.wait_ready();
  wait_applied(ks, stores, total);
  CHECK(ks.metric_sum("kstate_restore_records_total") > 0);
  http_client http(ks.port());
  check_sessions(http, m, events, bridge_end);
  // The stream time restored from the changelog keeps the expired sessions hidden.
  CHECK(read_pages(http, "session_recent") == recent.answered);
  CHECK(wait_pages(http, "session_by_group", groups) == groups);
  MESSAGE(recent.expired << " sessions expired and not answered");
  CHECK(ks.terminate() == 0);
}

}  // namespace

TEST_CASE("session counts and sums equal a recount; a late record bridges two sessions; restore agrees") {
  run_case("sessions", "", "", false);
}

TEST_CASE(
    "exactly_once, one changelog record per update: kill -9, state deleted, the restore gives the same sessions") {
  run_case("sessions-eos", "processing_guarantee: exactly_once\n", ", cache: false", true);
}

TEST_CASE(
    "exactly_once: kill -9 at random moments during ingest; the sessions equal the recount, and after a restore") {
  const std::string topic = unique_name("sessions-crash");
  create_topic(topic, 3);
  int64_t bridge_end = 0;
  // About 6,000 events over 80 minutes of event time, produced in chunks while kstate is
  // killed and restarted.
  auto events = make_session_events(20261208, bridge_end, 12'000);
  auto records = to_records(events);
  const std::string window = "window: {type: session, inactivity_gap: 5m, grace: 1m}";
  const std::vector<kstate_process::view> views{
      {"session_count", topic, "json", "", "string", "kind: count, " + window},
      {"session_stats", topic, "json", "", "string", "kind: aggregate, fields: [count, sum], value: n, " + window}};
  const auto app = unique_name("sessions-crash");
  const auto dir = temp_dir("sessions-crash");
  kstate_process ks(app, views, dir + "/state", "processing_guarantee: exactly_once\n");
  ks.extra_args({"-X", "group.instance.id=" + app + "-0"});

  const int chunks = 6;
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
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> delay_ms(100, 1500);
  while (produced_chunks < chunks || kills < 8) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ks.kill9();
    ++kills;
  }
  producer.join();
  const auto m = recount_sessions(events);
  REQUIRE(m.late > 5);

  const auto total = static_cast<int64_t>(events.size());
  ks.start();
  ks.wait_ready();
  wait_applied(ks, {"session_count", "session_stats"}, total);
  {
    http_client http(ks.port());
    check_sessions(http, m, events, bridge_end);
  }
  MESSAGE(kills << " kills");
  REQUIRE(ks.terminate() == 0);
  std::filesystem::remove_all(dir + "/state");
  ks.start();
  ks.wait_ready();
  wait_applied(ks, {"session_count", "session_stats"}, total);
  http_client http(ks.port());
  check_sessions(http, m, events, bridge_end);
  CHECK(ks.terminate() == 0);
}
