// Versioned table views against the real broker (docs/configuration.md#versioned-tables):
// out-of-order records and tombstones are placed by timestamp, as-of lookups, version
// lists, as-of range pages, batches and counts agree with a model through either of two instances, a
// record older than the history is dropped and counted, and an instance rebuilt from
// the topic (state deleted), or one that copied its partitions from a peer, answers the
// same.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Per key, its versions by timestamp (nullopt: a tombstone); per partition, stream time.
struct version_model {
  std::map<std::string, std::map<int64_t, std::optional<std::string>>> versions;
  std::map<int32_t, int64_t> stream;
  int64_t history = 0;
  int late = 0;

  void apply(const produced& r, int32_t partition) {
    auto st = stream.find(partition);
    if (st != stream.end() && *r.timestamp < st->second - history) {
      ++late;
      return;
    }
    stream[partition] = st == stream.end() ? *r.timestamp : std::max(st->second, *r.timestamp);
    versions[*r.key][*r.timestamp] = r.value;
  }
  struct answer {
    int64_t from;
    std::optional<int64_t> to;
    std::optional<std::string> value;
  };
  std::optional<answer> at(const std::string& key, int64_t t) const {
    auto it = versions.find(key);
    if (it == versions.end()) return std::nullopt;
    auto v = it->second.upper_bound(t);
    if (v == it->second.begin()) return std::nullopt;
    std::optional<int64_t> to;
    if (v != it->second.end()) to = v->first;
    --v;
    return answer{v->first, to, v->second};
  }
};

std::string url_time(int64_t t) { return std::to_string(t); }

// Every check of the versioned store through one instance.
void check_all(uint16_t port, const version_model& m, int64_t lo, int64_t hi) {
  CAPTURE(port);
  http_client c(port);
  std::mt19937 rng(static_cast<unsigned>(port));
  std::uniform_int_distribution<int64_t> when(lo, hi);

  // As-of lookups: at random times and at every version's edges.
  for (const auto& [key, versions] : m.versions) {
    std::vector<int64_t> times;
    for (int i = 0; i < 6; ++i) times.push_back(when(rng));
    for (const auto& [ts, v] : versions) {
      times.push_back(ts);
      times.push_back(ts - 1);
    }
    for (int64_t t : times) {
      CAPTURE(key);
      CAPTURE(t);
      auto a = c.get("/v1/stores/prices/keys/" + pct(key) + "?as_of=" + url_time(t));
      REQUIRE(a);
      auto want = m.at(key, t);
      if (!want || !want->value) {
        CHECK_MESSAGE(a->status == 404, a->body);
        continue;
      }
      REQUIRE_MESSAGE(a->status == 200, a->body);
      auto j = a->body_json();
      CHECK(j["value"] == *want->value);
      CHECK(j["valid_from"] == want->from);
      if (want->to) CHECK(j["valid_to"] == *want->to);
      else CHECK(j["valid_to"].is_null());
      CHECK(j.contains("served_by"));
      CHECK(j.contains("position"));
    }
  }

  // Version lists: whole, newest first; then by pages of 2 following metadata.next.
  for (const auto& [key, versions] : m.versions) {
    CAPTURE(key);
    std::vector<std::pair<int64_t, std::optional<std::string>>> want(versions.rbegin(), versions.rend());
    auto a = c.get("/v1/stores/prices/keys/" + pct(key) + "/versions?limit=1000");
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, a->body);
    auto j = a->body_json();
    REQUIRE(j["data"].size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const auto& e = j["data"][i];
      CHECK(e["valid_from"] == want[i].first);
      if (i == 0) CHECK(e["valid_to"].is_null());
      else CHECK(e["valid_to"] == want[i - 1].first);
      CHECK(e["deleted"] == !want[i].second.has_value());
      if (want[i].second) CHECK(e["value"] == *want[i].second);
    }
    CHECK(j["metadata"]["next"].is_null());
    std::vector<int64_t> paged;
    std::string to;
    for (int page = 0; page < 100; ++page) {
      auto p = c.get("/v1/stores/prices/keys/" + pct(key) + "/versions?limit=2" + (to.empty() ? "" : "&to=" + to));
      REQUIRE(p);
      REQUIRE_MESSAGE(p->status == 200, p->body);
      auto pj = p->body_json();
      for (const auto& e : pj["data"]) paged.push_back(e["valid_from"].get<int64_t>());
      if (pj["metadata"]["next"].is_null()) break;
      to = std::to_string(pj["metadata"]["next"].get<int64_t>());
    }
    std::vector<int64_t> want_from;
    for (const auto& [ts, v] : want) want_from.push_back(ts);
    CHECK(paged == want_from);
  }

  // As-of range pages across partitions and instances, in pages of 3 with the cursor.
  for (int i = 0; i < 8; ++i) {
    const int64_t t = i == 0 ? hi : when(rng);
    CAPTURE(t);
    std::vector<std::pair<std::string, std::string>> want;
    for (const auto& [key, versions] : m.versions)
      if (auto a = m.at(key, t); a && a->value) want.emplace_back(key, *a->value);
    std::vector<std::pair<std::string, std::string>> got;
    std::string cursor;
    for (int page = 0; page < 100; ++page) {
      auto p =
          c.get("/v1/stores/prices/keys?limit=3&as_of=" + url_time(t) + (cursor.empty() ? "" : "&cursor=" + cursor));
      REQUIRE(p);
      REQUIRE_MESSAGE(p->status == 200, p->body);
      auto pj = p->body_json();
      for (const auto& e : pj["data"]) got.emplace_back(e["key"].get<std::string>(), e["value"].get<std::string>());
      if (pj["metadata"]["next"].is_null()) break;
      cursor = pj["metadata"]["next"].get<std::string>();
    }
    CHECK(got == want);
    // A cursor is bound to its as_of: another time refuses it.
    if (!cursor.empty()) {
      auto other = c.get("/v1/stores/prices/keys?limit=3&as_of=" + url_time(t + 1) + "&cursor=" + cursor);
      REQUIRE(other);
      CHECK(other->status == 400);
    }
    // A prefix page as of the same time.
    auto p = c.get("/v1/stores/prices/keys?limit=1000&prefix=k1&as_of=" + url_time(t));
    REQUIRE(p);
    REQUIRE(p->status == 200);
    std::vector<std::pair<std::string, std::string>> got_prefix, want_prefix;
    const auto prefixed = p->body_json();  // named: a temporary would die before the loop body
    for (const auto& e : prefixed["data"])
      got_prefix.emplace_back(e["key"].get<std::string>(), e["value"].get<std::string>());
    for (const auto& kv : want)
      if (kv.first.rfind("k1", 0) == 0) want_prefix.push_back(kv);
    CHECK(got_prefix == want_prefix);
  }

  // Batches and counts as of a time: every key (and one never written) in one batch,
  // so the keys of the other instance's partitions are asked of it; the count sums
  // both instances' partitions.
  nlohmann::json batch{{"keys", nlohmann::json::array()}};
  for (const auto& [key, versions] : m.versions) batch["keys"].push_back(key);
  batch["keys"].push_back("never-written");
  for (int i = 0; i < 8; ++i) {
    const int64_t t = i == 0 ? hi : i == 1 ? lo : when(rng);
    CAPTURE(t);
    std::map<std::string, std::string> want;
    for (const auto& [key, versions] : m.versions)
      if (auto a = m.at(key, t); a && a->value) want.emplace(key, *a->value);
    auto b = c.post("/v1/stores/prices/keys:batchGet?as_of=" + url_time(t), "application/json", batch.dump());
    REQUIRE(b);
    REQUIRE_MESSAGE(b->status == 200, b->body);
    auto bj = b->body_json();
    std::map<std::string, std::string> got;
    for (const auto& e : bj["data"]) got.emplace(e["key"].get<std::string>(), e["value"].get<std::string>());
    CHECK(got == want);
    std::set<std::string> missing, want_missing{"never-written"};
    for (const auto& k : bj["missing"]) missing.insert(k.get<std::string>());
    for (const auto& [key, versions] : m.versions)
      if (!want.count(key)) want_missing.insert(key);
    CHECK(missing == want_missing);
    CHECK(bj["metadata"]["position"].size() == 3);  // the keys span every partition

    auto n = c.get("/v1/stores/prices/count?as_of=" + url_time(t));
    REQUIRE(n);
    REQUIRE_MESSAGE(n->status == 200, n->body);
    auto nj = n->body_json();
    CHECK(nj["count"] == want.size());
    CHECK(nj["exact"] == true);
    CHECK(nj["metadata"]["position"].size() == 3);
  }

  // Before the history kept: unknown (410), not absent; on a store without versions: 400.
  for (const std::string where : {"keys:batchGet", "count"}) {
    CAPTURE(where);
    const std::string before = "?as_of=" + url_time(lo - 3 * 3600 * 1000);
    auto g = where == "count" ? c.get("/v1/stores/prices/count" + before)
                              : c.post("/v1/stores/prices/keys:batchGet" + before, "application/json", batch.dump());
    REQUIRE(g);
    CHECK_MESSAGE(g->status == 410, g->body);
    CHECK(g->body_json()["error_code"] == 41002);
    const std::string at = "?as_of=" + url_time(hi);
    auto p = where == "count" ? c.get("/v1/stores/plain/count" + at)
                              : c.post("/v1/stores/plain/keys:batchGet" + at, "application/json", batch.dump());
    REQUIRE(p);
    CHECK(p->status == 400);
    CHECK(p->body.find("versioned") != std::string::npos);
  }
  auto gone = c.get("/v1/stores/prices/keys/k00?as_of=" + url_time(lo - 3 * 3600 * 1000));
  REQUIRE(gone);
  CHECK(gone->status == 410);
  CHECK(gone->body_json()["error_code"] == 41002);
  auto page_gone = c.get("/v1/stores/prices/keys?as_of=" + url_time(lo - 3 * 3600 * 1000));
  REQUIRE(page_gone);
  CHECK(page_gone->status == 410);
  auto plain = c.get("/v1/stores/plain/keys/k00?as_of=" + url_time(hi));
  REQUIRE(plain);
  CHECK(plain->status == 400);
  CHECK(plain->body.find("versioned") != std::string::npos);
}

bool all_applied(kstate_process& x, kstate_process& y, int64_t total) {
  return x.position_sum("prices") + y.position_sum("prices") == total;
}

}  // namespace

TEST_CASE("versioned table: out-of-order versions answered as of any time by either instance, and after a rebuild") {
  const int64_t history = 3600 * 1000;
  auto topic = unique_name("versioned");
  create_topic(topic, 3);
  std::vector<kstate_process::view> views{
      {"prices", topic, "string", "", "string", "versioned: {history: " + std::to_string(history) + "ms}"},
      {"plain", topic, "string"}};
  const auto app = unique_name("versioned-app");
  const auto dir = temp_dir("versioned");
  kstate_process x(app, views, dir + "/x"), y(app, views, dir + "/y");
  x.start();
  y.start();
  x.wait_ready();
  y.wait_ready();
  std::string why;
  bool settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({x.port(), y.port()}, 3, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);

  // Twelve keys, each with versions at shuffled timestamps in [t0, t0 + 100 s]: many
  // arrive after a newer one; some are tombstones; a few repeat a timestamp.
  const int64_t t0 = now_ms() - 10 * 60 * 1000;
  std::mt19937 rng(17);
  std::vector<produced> records;
  for (int k = 0; k < 12; ++k) {
    const std::string key = (k < 10 ? "k0" : "k") + std::to_string(k);
    for (int v = 0; v < 8; ++v) {
      const int64_t ts = t0 + static_cast<int64_t>(rng() % 100) * 1000;
      std::optional<std::string> value;
      if (rng() % 6 != 0) value = key + "@" + std::to_string(v);
      records.push_back({key, value, ts});
    }
  }
  std::shuffle(records.begin(), records.end(), rng);
  // Too late: two hours before everything else, after its partition's stream time moved.
  records.push_back({std::string("k03"), std::string("too-late"), t0 - 2 * 3600 * 1000});
  const auto placed = produce_bytes(topic, records);
  version_model m;
  m.history = history;
  for (size_t i = 0; i < records.size(); ++i) m.apply(records[i], placed[i].first);
  REQUIRE(m.late == 1);

  const auto total = static_cast<int64_t>(records.size());
  for (int i = 0; i < 300 && !all_applied(x, y, total); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(all_applied(x, y, total));
  CHECK(x.metric_sum("kstate_store_late_records_total") + y.metric_sum("kstate_store_late_records_total") == 1);

  const int64_t lo = t0 - 1000, hi = t0 + 101'000;
  check_all(x.port(), m, lo, hi);
  check_all(y.port(), m, lo, hi);

  // y loses its state and rebuilds its partitions from the topic: the same answers.
  REQUIRE(y.terminate() == 0);
  std::filesystem::remove_all(dir + "/y");
  y.start();
  y.wait_ready();
  settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({x.port(), y.port()}, 3, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);
  for (int i = 0; i < 300 && !all_applied(x, y, total); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(all_applied(x, y, total));
  check_all(x.port(), m, lo, hi);
  check_all(y.port(), m, lo, hi);

  // A third instance copies the partitions it takes from the others (peer bootstrap):
  // the copies carry the versions and the stream time.
  kstate_process z(app, views, dir + "/z", "peer_bootstrap: {min_offsets: 1}\n");
  z.start();
  z.wait_ready();
  settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({x.port(), y.port(), z.port()}, 3, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);
  // Copies of the versioned store were installed, none failed (a failure rebuilds from
  // Kafka, which would hide a copy that lost the versions).
  http_client zc(z.port());
  auto metrics = zc.get("/metrics");
  REQUIRE(metrics);
  int installed = 0, failed = 0;
  std::istringstream lines(metrics->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("kstate_bootstrap_copies_total{", 0) != 0 || line.find("store=\"prices\"") == std::string::npos)
      continue;
    const int n = static_cast<int>(std::stod(line.substr(line.rfind(' ') + 1)));
    if (line.find("result=\"installed\"") != std::string::npos) installed += n;
    else failed += n;
  }
  CHECK(installed > 0);
  CHECK(failed == 0);
  check_all(z.port(), m, lo, hi);
  check_all(x.port(), m, lo, hi);
  REQUIRE(z.terminate() == 0);
  REQUIRE(y.terminate() == 0);
  REQUIRE(x.terminate() == 0);
}
