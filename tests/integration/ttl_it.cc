// Time to live of table views against the real broker (docs/configuration.md#time-to-live):
// keys expire by their record timestamps or by when they were applied, every read agrees
// before any compaction, and expired keys stay expired across a restart, a rebuild from
// an empty state directory and a copy to another instance, whose answers for the whole
// store agree.
#include <doctest/doctest.h>

#include <filesystem>
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

// The keys every read of `store` answers, each read on its own: point lookups and one
// batchGet of `candidates`, a range page, a prefix page, an NDJSON scan, and the exact count.
void check_reads(http_client& c, const std::string& store, const std::set<std::string>& candidates,
                 const std::set<std::string>& want) {
  CAPTURE(store);
  std::set<std::string> looked_up;
  json req = {{"keys", json::array()}};
  for (const auto& k : candidates) {
    auto a = c.get("/v1/stores/" + store + "/keys/" + pct(k));
    REQUIRE(a);
    REQUIRE_MESSAGE((a->status == 200 || a->status == 404), a->body);
    if (a->status == 200) looked_up.insert(k);
    req["keys"].push_back(k);
  }
  CHECK(looked_up == want);

  auto b = c.post("/v1/stores/" + store + "/keys:batchGet", "application/json", req.dump());
  REQUIRE(b);
  REQUIRE_MESSAGE(b->status == 200, b->body);
  std::set<std::string> found;
  const auto batch = b->body_json();  // named: a temporary would die before the loop body
  for (const auto& e : batch["data"]) found.insert(e["key"].get<std::string>());
  CHECK(found == want);

  auto page = c.get("/v1/stores/" + store + "/keys?limit=1000");
  REQUIRE(page);
  REQUIRE(page->status == 200);
  std::set<std::string> ranged;
  const auto ranged_body = page->body_json();
  for (const auto& e : ranged_body["data"]) ranged.insert(e["key"].get<std::string>());
  CHECK(ranged == want);

  auto prefixed = c.get("/v1/stores/" + store + "/keys?prefix=new-&limit=1000");
  REQUIRE(prefixed);
  std::set<std::string> with_prefix, want_prefix;
  const auto prefixed_body = prefixed->body_json();
  for (const auto& e : prefixed_body["data"]) with_prefix.insert(e["key"].get<std::string>());
  for (const auto& k : want)
    if (k.rfind("new-", 0) == 0) want_prefix.insert(k);
  CHECK(with_prefix == want_prefix);

  auto scan = c.get("/v1/stores/" + store + "/keys", {{"Accept", "application/x-ndjson"}});
  REQUIRE(scan);
  REQUIRE(scan->status == 200);
  std::set<std::string> scanned;
  std::istringstream in(scan->body);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) scanned.insert(json::parse(line)["key"].get<std::string>());
  CHECK(scanned == want);

  auto count = c.get("/v1/stores/" + store + "/count");
  REQUIRE(count);
  REQUIRE(count->status == 200);
  CHECK(count->body_json()["exact"] == true);
  CHECK(count->body_json()["count"] == want.size());
}

std::vector<produced> records(const std::string& prefix, int n, int64_t timestamp) {
  std::vector<produced> out;
  for (int i = 0; i < n; ++i)
    out.push_back({prefix + std::to_string(i), R"({"n":)" + std::to_string(i) + "}", timestamp});
  return out;
}

std::set<std::string> keys(const std::vector<std::vector<produced>>& groups) {
  std::set<std::string> out;
  for (const auto& g : groups)
    for (const auto& r : g) out.insert(*r.key);
  return out;
}

}  // namespace

TEST_CASE("keys expire by record time or ingest time, in every read, and stay expired across restart and rebuild") {
  constexpr int64_t ttl = 8000;
  auto a_topic = unique_name("ttl-a"), b_topic = unique_name("ttl-b");
  create_topic(a_topic, 3);
  create_topic(b_topic, 3);
  // a: by record time (and a view without ttl, the control); b: by ingest time.
  const std::string ttl_rt = "ttl: {after: " + std::to_string(ttl) + "ms}";
  const std::string ttl_it = "ttl: {after: " + std::to_string(ttl) + "ms, clock: ingest_time}";
  std::vector<kstate_process::view> views{{"by_record", a_topic, "json", "", "string", ttl_rt},
                                          {"forever", a_topic},
                                          {"by_ingest", b_topic, "json", "", "string", ttl_it}};
  const auto app = unique_name("ttl-app");
  const auto dir = temp_dir("ttl");

  // Written a minute ago, before kstate starts: applied while catching up, expired in
  // both views from the start (by ingest time they count from their timestamps).
  const int64_t t0 = now_ms();
  auto old_a = records("old-", 15, t0 - 60'000), old_b = old_a;
  produce_bytes(a_topic, old_a);
  produce_bytes(b_topic, old_b);

  kstate_process x(app, views, dir + "/state");
  x.start();
  x.wait_ready();

  // Applied live: new records (timestamp now), a backfill (timestamps a minute old) and,
  // on a only, records stamped two minutes ahead.
  const int64_t t1 = now_ms();
  auto fresh = records("new-", 15, t1), backfill = records("back-", 15, t1 - 60'000),
       ahead = records("ahead-", 10, t1 + 120'000);
  std::vector<produced> to_a = fresh, to_b = fresh;
  to_a.insert(to_a.end(), backfill.begin(), backfill.end());
  to_a.insert(to_a.end(), ahead.begin(), ahead.end());
  to_b.insert(to_b.end(), backfill.begin(), backfill.end());
  produce_bytes(a_topic, to_a);
  produce_bytes(b_topic, to_b);
  const int64_t total_a = 15 + 40, total_b = 15 + 30;
  auto applied = [&] { return x.position_sum("by_record") == total_a && x.position_sum("by_ingest") == total_b; };
  for (int i = 0; i < 200 && !applied(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(applied());
  const int64_t t_applied = now_ms();  // every live record was applied in [t1, t_applied]

  const auto candidates_a = keys({old_a, fresh, backfill, ahead}), candidates_b = keys({old_b, fresh, backfill});
  const auto all_a = candidates_a;
  http_client c(x.port());
  {
    // Before t1 + ttl: by record time, what is younger than ttl by its timestamp; by
    // ingest time, everything applied live (the backfill too).
    check_reads(c, "by_record", candidates_a, keys({fresh, ahead}));
    check_reads(c, "by_ingest", candidates_b, keys({fresh, backfill}));
    check_reads(c, "forever", candidates_a, all_a);
    REQUIRE_MESSAGE(now_ms() < t1 + ttl, "the first reads took longer than the ttl: the model cannot tell");
  }

  // Past every live record's time + ttl: only the records stamped ahead are left.
  const auto left_a = keys({ahead});
  const std::set<std::string> none;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(0, t_applied + ttl + 300 - now_ms())));
  check_reads(c, "by_record", candidates_a, left_a);
  check_reads(c, "by_ingest", candidates_b, none);
  check_reads(c, "forever", candidates_a, all_a);

  // Restart: the stored times are kept.
  REQUIRE(x.terminate() == 0);
  x.start();
  x.wait_ready();
  check_reads(c, "by_record", candidates_a, left_a);
  check_reads(c, "by_ingest", candidates_b, none);
  REQUIRE(x.terminate() == 0);

  // Rebuild from an empty state directory: every record is applied again, long after it
  // was first applied, and what had expired stays expired in both clock modes.
  std::filesystem::remove_all(dir + "/state");
  x.start();
  x.wait_ready();
  REQUIRE(x.position_sum("forever") == total_a);
  REQUIRE(x.position_sum("by_ingest") == total_b);
  http_client c2(x.port());
  check_reads(c2, "by_record", candidates_a, left_a);
  check_reads(c2, "by_ingest", candidates_b, none);
  check_reads(c2, "forever", candidates_a, all_a);

  // A second instance takes partitions over by copying them from x (bootstrap), and
  // either instance answers for the whole store, gathering each owner's filtered part.
  kstate_process y(app, views, dir + "/y", "peer_bootstrap: {min_offsets: 1}\n");
  y.start();
  y.wait_ready();
  std::string why;
  bool settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({x.port(), y.port()}, 6, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);
  CHECK(y.metric_sum("kstate_bootstrap_copies_total") > 0);
  for (uint16_t port : {x.port(), y.port()}) {
    CAPTURE(port);
    http_client c3(port);
    check_reads(c3, "by_record", candidates_a, left_a);
    check_reads(c3, "by_ingest", candidates_b, none);
    check_reads(c3, "forever", candidates_a, all_a);
  }
  REQUIRE(y.terminate() == 0);
  REQUIRE(x.terminate() == 0);
}
