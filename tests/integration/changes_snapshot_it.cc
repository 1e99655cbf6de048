// Change subscriptions that begin with a snapshot (snapshot=true), and the changes of
// aggregate and windowed views (read from their changelogs). Each subscriber's events
// are checked against a model of what was produced: a key's snapshot entry and the
// changes after it must be exactly the end of that key's history, none repeated, none
// missing.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "agg_common.h"
#include "sse_client.h"
#include "support.h"

using namespace kstate::testing;

namespace {

// One record of a key's history: its offset and value (nullopt: a deletion).
struct step {
  int64_t offset;
  std::optional<json> value;
  bool operator==(const step&) const = default;
};

// The first difference of two maps of windows, for a failure's message.
std::string first_difference(const std::map<std::pair<std::string, int64_t>, int64_t>& got,
                             const std::map<std::pair<std::string, int64_t>, int64_t>& want) {
  for (const auto& [id, n] : want) {
    auto it = got.find(id);
    if (it == got.end()) return id.first + "@" + std::to_string(id.second) + " missing, want " + std::to_string(n);
    if (it->second != n)
      return id.first + "@" + std::to_string(id.second) + " is " + std::to_string(it->second) + ", want " +
             std::to_string(n);
  }
  for (const auto& [id, n] : got)
    if (!want.count(id)) return id.first + "@" + std::to_string(id.second) + " is not in the model";
  return "none";
}

// Polls `ok` every 100 ms until it holds or `timeout` passes.
template <typename Pred>
bool wait_for(Pred ok, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return ok();
}

// "0:12,3:40" -> {0: 12, 3: 40}.
std::map<int32_t, int64_t> parse_position_text(const std::string& text) {
  std::map<int32_t, int64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    auto colon = text.find(':', at), comma = text.find(',', at);
    out[std::stoi(text.substr(at, colon - at))] = std::stoll(text.substr(colon + 1, comma - colon - 1));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("snapshot=true on a table: the current entries from every owner, in pages, then every later change once") {
  auto topic = unique_name("snap");
  create_topic(topic, 4);
  auto dir = temp_dir("snap");
  auto app = unique_name("snap-app");
  // Pages of 7 entries: the snapshot of the prefix takes many pages, each read at its
  // own position while records keep coming.
  const std::string limits = "query:\n  default_limit: 5\n  max_limit: 7\n";
  kstate_process a(app, {{"t", topic}}, dir + "/a", limits);
  kstate_process b(app, {{"t", topic}}, dir + "/b", limits);
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  REQUIRE(wait_for([&] { return group_settled({a.port(), b.port()}, 4); }, std::chrono::seconds(90)));

  // The model: each key's history (accepted records of the prefix, in offset order),
  // and the end of each partition.
  std::map<std::string, std::vector<step>> history;
  std::map<int32_t, int64_t> ends;
  std::mt19937 rng(11);
  auto produce_round = [&](int round, int n) {
    std::vector<produced> recs;
    for (int i = 0; i < n; ++i) {
      const bool user = rng() % 3 != 0;
      produced rec{std::string(user ? "user-" : "item-") + std::to_string(rng() % 120), std::nullopt};
      const auto roll = rng() % 20;
      if (roll == 0) rec.value = "{not json";  // rejected: no change
      else if (roll != 1) rec.value = R"({"r":)" + std::to_string(round) + R"(,"i":)" + std::to_string(i) + "}";
      recs.push_back(std::move(rec));
    }
    auto where = produce_bytes(topic, recs);
    for (size_t i = 0; i < recs.size(); ++i) {
      ends[where[i].first] = std::max(ends[where[i].first], where[i].second + 1);
      if (recs[i].key->rfind("user-", 0) != 0 || (recs[i].value && recs[i].value->rfind("{not", 0) == 0)) continue;
      history[*recs[i].key].push_back(
          {where[i].second, recs[i].value ? std::optional<json>(json::parse(*recs[i].value)) : std::nullopt});
    }
  };
  produce_round(0, 600);
  REQUIRE(wait_for([&] { return a.position_sum("t") + b.position_sum("t") >= 600; }, std::chrono::seconds(60)));

  // Subscribe on b while more rounds are produced.
  sse_stream s(b.port(), "/v1/stores/t/changes?prefix=user-&snapshot=true", "");
  std::thread producer([&] {
    for (int r = 1; r <= 4; ++r) {
      produce_round(r, 400);
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
  });
  // Until a position event shows every record produced was read.
  std::map<int32_t, int64_t> final_ends;
  bool produced_all = false;
  auto events = read_until(
      s,
      [&](const std::vector<event>& ev) {
        if (ev.back().type != "position" || !produced_all) return false;
        auto pos = parse_position_text(ev.back().id);
        for (const auto& [p, end] : final_ends)
          if (pos[p] < end) return false;
        return true;
      },
      std::chrono::seconds(5));  // the snapshot and the first changes
  producer.join();
  final_ends = ends;
  produced_all = true;
  auto more = read_until(
      s,
      [&](const std::vector<event>& ev) {
        if (ev.back().type != "position") return false;
        auto pos = parse_position_text(ev.back().id);
        for (const auto& [p, end] : final_ends)
          if (pos[p] < end) return false;
        return true;
      },
      std::chrono::seconds(60));
  events.insert(events.end(), more.begin(), more.end());
  REQUIRE(s.status() == 200);

  // The stream: snapshot events (empty ids), then start, then changes.
  std::map<std::string, step> snapshot;
  std::map<std::string, std::vector<step>> changes;
  std::map<int32_t, int64_t> last_offset;
  bool started = false;
  for (const auto& e : events) {
    if (e.type == "snapshot") {
      CHECK_FALSE(started);
      CHECK(e.id.empty());
      const auto key = e.data["key"].get<std::string>();
      CHECK(snapshot.count(key) == 0);
      snapshot[key] = {e.data["offset"].get<int64_t>(), e.data["value"]};
    } else if (e.type == "start") {
      CHECK_FALSE(started);
      started = true;
      CHECK(e.data["topic"] == topic);
    } else if (e.type == "change") {
      REQUIRE(started);
      const auto p = e.data["partition"].get<int32_t>();
      const auto o = e.data["offset"].get<int64_t>();
      if (last_offset.count(p)) CHECK(o > last_offset[p]);  // each partition in order, once
      last_offset[p] = o;
      changes[e.data["key"].get<std::string>()].push_back(
          {o, e.data["value"].is_null() ? std::nullopt : std::optional<json>(e.data["value"])});
    } else {
      CHECK(e.type == "position");
    }
  }
  REQUIRE(started);
  CHECK(snapshot.size() > 20);  // many pages of 7

  // Per key: the snapshot entry and the changes after it are exactly the end of the
  // key's history; a key absent from the snapshot was absent then (never written, or
  // deleted last), and its changes are everything after that.
  std::set<std::string> keys;
  for (const auto& [k, h] : history) keys.insert(k);
  for (const auto& [k, c] : changes) keys.insert(k);
  for (const auto& [k, s] : snapshot) keys.insert(k);
  for (const auto& k : keys) {
    CAPTURE(k);
    const auto& h = history[k];
    const auto& got = changes[k];
    if (auto it = snapshot.find(k); it != snapshot.end()) {
      auto at = std::find_if(h.begin(), h.end(), [&](const step& x) { return x.offset == it->second.offset; });
      REQUIRE(at != h.end());
      CHECK(at->value == it->second.value);
      CHECK(std::vector<step>(at + 1, h.end()) == got);
    } else {
      // The changes are a suffix of the history that starts after a deletion (or at the
      // beginning).
      REQUIRE(got.size() <= h.size());
      const size_t from = h.size() - got.size();
      CHECK(std::vector<step>(h.begin() + static_cast<std::ptrdiff_t>(from), h.end()) == got);
      if (from > 0) CHECK_FALSE(h[from - 1].value.has_value());
    }
  }

  // The same for chosen keys (one batch) from the other instance, and a resumption whose
  // history is there does not take a snapshot.
  sse_stream k(a.port(), "/v1/stores/t/changes?key=user-1&key=user-2&snapshot=true", "");
  auto first = read_until(
      k, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(30));
  std::map<std::string, json> snap;
  for (const auto& e : first)
    if (e.type == "snapshot") snap[e.data["key"].get<std::string>()] = e.data["value"];
  for (std::string key : {"user-1", "user-2"}) {
    const auto& h = history[key];
    if (!h.empty() && h.back().value) CHECK(snap[key] == *h.back().value);
    else CHECK(snap.count(key) == 0);
  }
  REQUIRE(!first.empty());
  sse_stream r(a.port(), "/v1/stores/t/changes?key=user-1&key=user-2&snapshot=true", first.back().id);
  auto resumed = read_until(
      r, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(30));
  REQUIRE(!resumed.empty());
  CHECK(resumed.size() == 1);  // no snapshot events: the history after the id is there
  CHECK(resumed.back().id == first.back().id);
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}

TEST_CASE("an aggregate's changes come from its changelog: counts and windows, snapshot then follow, exactly once") {
  auto topic = unique_name("snap-agg");
  create_topic(topic, 3);
  auto dir = temp_dir("snap-agg");
  kstate_process ks(
      unique_name("snap-agg-app"),
      {{"counts", topic, "json", "", "string", "kind: count"},
       {"per_minute", topic, "json", "", "string", "kind: count, window: {type: tumbling, size: 1m, grace: 1h}"}},
      dir, "processing_guarantee: exactly_once\n");
  ks.start();
  ks.wait_ready();

  // Records of 30 users over 5 minutes of event time, out of order (a grace of an hour
  // takes them all).
  const int64_t t0 =
      (std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
           .count() /
       60'000 * 60'000) -
      10 * 60'000;
  std::map<std::string, int64_t> counts;
  std::map<std::pair<std::string, int64_t>, int64_t> windows;
  std::mt19937 rng(3);
  int64_t total = 0;
  auto produce_round = [&](int n) {
    std::vector<produced> recs;
    for (int i = 0; i < n; ++i) {
      const auto key = "u" + std::to_string(rng() % 30);
      const int64_t ts = t0 + static_cast<int64_t>(rng() % (5 * 60'000));
      recs.push_back({key, "{}", ts});
      ++counts[key];
      ++windows[{key, ts / 60'000 * 60'000}];
      ++total;
    }
    produce_bytes(topic, recs);
  };
  produce_round(500);
  REQUIRE(wait_total(ks.port(), "counts", total, std::chrono::seconds(60)) == total);

  // A count of the prefix u1 (u1, u10..u19), snapshot then follow, while more come.
  sse_stream s(ks.port(), "/v1/stores/counts/changes?prefix=u1&snapshot=true", "");
  // Every window update of every key from the changelog's beginning.
  sse_stream w(ks.port(), "/v1/stores/per_minute/changes?from_position=0:0,1:0,2:0", "");
  for (int r = 0; r < 3; ++r) {
    produce_round(300);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE(wait_total(ks.port(), "counts", total, std::chrono::seconds(60)) == total);

  // Counts: the snapshot value, then strictly growing values, ending at the model's.
  std::map<std::string, int64_t> want;
  for (const auto& [k, n] : counts)
    if (k.rfind("u1", 0) == 0) want[k] = n;
  std::map<std::string, int64_t> state;
  std::map<std::string, std::vector<int64_t>> seen;
  bool started = false;
  auto events = read_until(
      s,
      [&](const std::vector<event>& ev) {
        const auto& e = ev.back();
        if (e.type == "start") {
          started = true;
          CHECK(e.data["topic"].get<std::string>().find("-counts-changelog") != std::string::npos);
        }
        if (e.type == "snapshot" || e.type == "change") {
          CHECK(e.data.contains("changelog_offset"));
          const auto k = e.data["key"].get<std::string>();
          state[k] = e.data["value"].get<int64_t>();
          seen[k].push_back(state[k]);
        }
        return state == want;
      },
      std::chrono::seconds(60));
  CHECK(started);
  CHECK(state == want);
  for (const auto& [k, values] : seen) {
    CAPTURE(k);
    for (size_t i = 1; i < values.size(); ++i) CHECK(values[i] > values[i - 1]);  // no update twice
  }

  // Windows: each window's updates grow strictly and end at the model's count.
  std::map<std::pair<std::string, int64_t>, int64_t> wstate;
  std::map<std::pair<std::string, int64_t>, int64_t> wlast;
  auto wevents = read_until(
      w,
      [&](const std::vector<event>& ev) {
        const auto& e = ev.back();
        if (e.type != "change") return false;
        std::pair<std::string, int64_t> id{e.data["key"].get<std::string>(), e.data["start"].get<int64_t>()};
        CHECK(e.data["end"].get<int64_t>() == id.second + 60'000);
        const auto v = e.data["value"].get<int64_t>();
        if (wlast.count(id)) CHECK(v > wlast[id]);
        wlast[id] = v;
        wstate[id] = v;
        return wstate == windows;
      },
      std::chrono::seconds(60));
  INFO("events read: " << wevents.size());
  CAPTURE(wstate.size());
  CAPTURE(windows.size());
  INFO(first_difference(wstate, windows));
  CHECK(wstate == windows);

  // A snapshot of the windowed view: every window, at its count, then start.
  sse_stream ws(ks.port(), "/v1/stores/per_minute/changes?snapshot=true", "");
  std::map<std::pair<std::string, int64_t>, int64_t> snap;
  auto first = read_until(
      ws, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(60));
  for (const auto& e : first)
    if (e.type == "snapshot")
      snap[{e.data["key"].get<std::string>(), e.data["start"].get<int64_t>()}] = e.data["value"];
  INFO(first_difference(snap, windows));
  CHECK(snap == windows);
  CHECK(ks.terminate() == 0);
}

TEST_CASE("a join's changes are its joined values, a session view's its sessions, merges as deletions") {
  auto left = unique_name("snap-left"), right = unique_name("snap-right"), clicks = unique_name("snap-clicks");
  create_topic(left, 3);
  create_topic(right, 3);
  create_topic(clicks, 2);
  auto dir = temp_dir("snap-join");
  kstate_process ks(
      unique_name("snap-join-app"),
      {{"j", left, "json", "", "string", "kind: join, join: {type: left, right: " + right + "}"},
       {"s", clicks, "json", "", "string", "kind: count, window: {type: session, inactivity_gap: 10s, grace: 1h}"}},
      dir, "processing_guarantee: exactly_once\n");
  ks.start();
  ks.wait_ready();

  // The model of a left join: each left key with its value and the right value of the
  // same key (null when none).
  std::map<std::string, json> lefts, rights;
  auto model = [&] {
    std::map<std::string, json> out;
    for (const auto& [k, l] : lefts) out[k] = json{{"left", l}, {"right", rights.count(k) ? rights[k] : json()}};
    return out;
  };
  const int64_t t0 =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      600'000;
  std::vector<produced> l1, r1;
  for (int i = 0; i < 20; ++i) {
    const auto k = "k" + std::to_string(i);
    lefts[k] = json{{"n", i}};
    l1.push_back({k, lefts[k].dump(), t0});
    if (i % 2 == 0) {
      rights[k] = json{{"r", i}};
      r1.push_back({k, rights[k].dump()});
    }
  }
  // Sessions of "a": t0, t0+1s, t0+2s (out of order): one session of 3. "b": t0 and
  // t0+20s: two sessions, bridged later.
  std::vector<produced> c1{
      {"a", "{}", t0 + 1'000}, {"a", "{}", t0 + 2'000}, {"a", "{}", t0}, {"b", "{}", t0}, {"b", "{}", t0 + 20'000}};
  produce_bytes(left, l1);
  produce_bytes(right, r1);
  produce_bytes(clicks, c1);
  auto joined = [&] { return read_store(ks.port(), "j"); };
  REQUIRE(wait_for([&] { return joined() == model(); }, std::chrono::seconds(60)));

  // The join: its snapshot is the model, then its changes keep it so.
  sse_stream j(ks.port(), "/v1/stores/j/changes?snapshot=true", "");
  std::map<std::string, json> state;
  auto apply = [&](const event& e) {
    const auto k = e.data["key"].get<std::string>();
    if (e.data["deleted"].get<bool>()) state.erase(k);
    else state[k] = e.data["value"];
  };
  auto first = read_until(
      j, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(60));
  for (const auto& e : first)
    if (e.type == "snapshot") apply(e);
  CHECK(state == model());
  // The session view's snapshot: a's one session and b's two, each [start, last + 1).
  sse_stream s(ks.port(), "/v1/stores/s/changes?snapshot=true", "");
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, int64_t>> sessions;  // (key, start) -> (end, count)
  auto apply_session = [&](const event& e) {
    std::pair<std::string, int64_t> id{e.data["key"].get<std::string>(), e.data["start"].get<int64_t>()};
    if (e.data["deleted"].get<bool>()) sessions.erase(id);
    else sessions[id] = {e.data["end"].get<int64_t>(), e.data["value"].get<int64_t>()};
  };
  auto sfirst = read_until(
      s, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(60));
  for (const auto& e : sfirst)
    if (e.type == "snapshot") apply_session(e);
  using session_map = std::map<std::pair<std::string, int64_t>, std::pair<int64_t, int64_t>>;
  session_map want_sessions{
      {{"a", t0}, {t0 + 2'001, 3}}, {{"b", t0}, {t0 + 1, 1}}, {{"b", t0 + 20'000}, {t0 + 20'001, 1}}};
  CHECK(sessions == want_sessions);

  // Changes on both sides (a right value for an odd key, a right deletion, a left
  // deletion), and a click of b at t0+10s, which bridges its two sessions.
  rights["k1"] = json{{"r", 100}};
  rights.erase("k2");
  lefts.erase("k3");
  produce_bytes(right, {{"k1", rights["k1"].dump()}, {"k2", std::nullopt}});
  produce_bytes(left, {{"k3", std::nullopt}});
  produce_bytes(clicks, {{"b", "{}", t0 + 10'000}});
  read_until(
      j,
      [&](const std::vector<event>& ev) {
        if (ev.back().type == "change") apply(ev.back());
        return state == model();
      },
      std::chrono::seconds(60));
  CHECK(state == model());
  want_sessions.erase({"b", t0 + 20'000});
  want_sessions[{"b", t0}] = {t0 + 20'001, 3};
  read_until(
      s,
      [&](const std::vector<event>& ev) {
        if (ev.back().type == "change") apply_session(ev.back());
        return sessions == want_sessions;
      },
      std::chrono::seconds(60));
  auto describe = [&](const session_map& m) {
    std::string out;
    for (const auto& [id, v] : m)
      out += id.first + "@" + std::to_string(id.second - t0) + ":" + std::to_string(v.first - t0) + "=" +
             std::to_string(v.second) + " ";
    return out;
  };
  INFO("got " << describe(sessions));
  INFO("want " << describe(want_sessions));
  CHECK(sessions == want_sessions);
  CHECK(ks.terminate() == 0);
}
