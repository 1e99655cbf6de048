// Join views against the real broker: two tables with random updates and tombstones on
// both sides, every join type, each key's answer (get, and range pages across two
// instances) against a model computed here; kill -9 during the input, and the same
// check after restart (exactly once: nothing lost, nothing stale); a store that moves
// to an instance without its state is restored from the changelog, or copied from a
// peer with its sides (and goes on joining); inputs that are not co-partitioned are
// refused at start.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "agg_common.h"

using namespace kstate::testing;

namespace {

// The three views of every test: one per join type, with both value layouts.
std::vector<kstate_process::view> join_views(const std::string& left, const std::string& right) {
  return {{"j_inner", left, "json", "", "string", "kind: join, join: {type: inner, right: " + right + "}"},
          {"j_left", left, "json", "", "string",
           "kind: join, join: {type: left, right: " + right + ", left_name: order, right_name: customer}"},
          {"j_outer", left, "json", "", "string",
           "kind: join, join: {type: outer, right: " + right +
               ", select: [{side: left, field: amount}, {side: right, field: address.city, as: city}]}"}};
}

struct sides_model {
  table_model left, right;
};

// What each view must hold, from the latest value of each side (the documented rules).
std::map<std::string, json> expected(const sides_model& m, const std::string& view) {
  std::set<std::string> keys;
  for (const auto& [k, v] : m.left) keys.insert(k);
  for (const auto& [k, v] : m.right) keys.insert(k);
  std::map<std::string, json> out;
  for (const auto& k : keys) {
    auto l = m.left.find(k), r = m.right.find(k);
    const bool has_l = l != m.left.end(), has_r = r != m.right.end();
    json lv = has_l ? json::parse(l->second) : json(), rv = has_r ? json::parse(r->second) : json();
    if (view == "j_inner" && has_l && has_r) out[k] = {{"left", lv}, {"right", rv}};
    if (view == "j_left" && has_l) out[k] = {{"order", lv}, {"customer", rv}};
    if (view == "j_outer") {
      json city;
      if (has_r && rv.contains("address") && rv["address"].contains("city")) city = rv["address"]["city"];
      out[k] = {{"amount", has_l && lv.contains("amount") ? lv["amount"] : json()}, {"city", city}};
    }
  }
  return out;
}

// Random orders (left) and customers (right) over `keys` keys, about one in six a
// tombstone; some customers lack the projected field. `pad` characters of filler in
// every order make the writes heavier.
void make_input(uint32_t seed, int records, int keys, std::vector<produced>& left, std::vector<produced>& right,
                size_t pad = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> key(0, keys - 1), amount(1, 1000), six(0, 5);
  for (int i = 0; i < records; ++i) {
    auto k = "k" + std::to_string(key(rng));
    if (six(rng) == 0) left.push_back({k, std::nullopt});
    else left.push_back({k, json{{"amount", amount(rng)}, {"n", i}, {"pad", std::string(pad, 'x')}}.dump()});
    k = "k" + std::to_string(key(rng));
    if (six(rng) == 0) right.push_back({k, std::nullopt});
    else if (six(rng) == 1) right.push_back({k, json{{"name", "c" + std::to_string(i)}}.dump()});
    else
      right.push_back(
          {k, json{{"name", "c" + std::to_string(i)}, {"address", {{"city", "city" + std::to_string(amount(rng))}}}}
                  .dump()});
  }
}

// Waits until every view, read in range pages from `host:port` (the instance gathers
// from the others), equals the model; returns the views that do not.
std::vector<std::string> wait_equal(uint16_t port, const sides_model& m, std::chrono::seconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> wrong;
  for (;;) {
    wrong.clear();
    for (const auto* view : {"j_inner", "j_left", "j_outer"})
      if (read_store(port, view) != expected(m, view)) wrong.push_back(view);
    if (wrong.empty() || std::chrono::steady_clock::now() > until) return wrong;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// Every key of the key space (present or not) looked up on `port`: the model's value,
// or 404 when the view holds no row for it. Returns the number of wrong answers.
size_t check_gets(uint16_t port, const sides_model& m, int keys) {
  http_client h(port);
  size_t wrong = 0;
  for (const auto* view : {"j_inner", "j_left", "j_outer"}) {
    auto want = expected(m, view);
    for (int i = 0; i < keys; ++i) {
      auto k = "k" + std::to_string(i);
      auto a = h.get(std::string("/v1/stores/") + view + "/keys/" + k);
      REQUIRE(a);
      auto it = want.find(k);
      bool ok = it == want.end() ? a->status == 404 : a->status == 200 && a->body_json()["value"] == it->second;
      if (!ok) {
        ++wrong;
        MESSAGE(view << "/" << k << ": " << a->status << " " << a->body
                     << "; model: " << (it == want.end() ? std::string("none") : it->second.dump()));
      }
    }
  }
  return wrong;
}

}  // namespace

TEST_CASE(
    "inner, left and outer joins equal the model on two instances; a moved store is restored from its changelog") {
  auto left = unique_name("orders"), right = unique_name("customers");
  create_topic(left, 4);
  create_topic(right, 4);
  const int keys = 150;
  std::vector<produced> lrec, rrec;
  make_input(11, 2000, keys, lrec, rrec);
  sides_model m;
  for (const auto& r : lrec) apply_record(m.left, r);
  for (const auto& r : rrec) apply_record(m.right, r);

  auto app = unique_name("join-app");
  auto dir = temp_dir("join");
  kstate_process a(app, join_views(left, right), dir + "/a");
  kstate_process b(app, join_views(left, right), dir + "/b");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  // Half of each side before, half after both instances run.
  produce(left, std::vector<produced>(lrec.begin(), lrec.begin() + 1000));
  produce(right, std::vector<produced>(rrec.begin(), rrec.begin() + 1000));
  produce(left, std::vector<produced>(lrec.begin() + 1000, lrec.end()));
  produce(right, std::vector<produced>(rrec.begin() + 1000, rrec.end()));

  auto started = std::chrono::steady_clock::now();
  auto wrong = wait_equal(a.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model; see " << a.log_path() << ", " << b.log_path());
  CHECK(wrong.empty());
  MESSAGE("joined in ~" << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  // Every key's answer, from each instance (one serves, or forwards to the owner).
  CHECK(check_gets(a.port(), m, keys) == 0);
  CHECK(check_gets(b.port(), m, keys) == 0);
  // Range pages of 7 across both instances equal the model too.
  {
    http_client h(b.port());
    std::map<std::string, json> paged;
    std::string cursor;
    for (int pages = 0; pages < 1000; ++pages) {
      auto r = h.get("/v1/stores/j_left/keys?limit=7" + (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
      REQUIRE(r);
      REQUIRE(r->status == 200);
      auto body = r->body_json();
      for (const auto& e : body["data"]) paged[e["key"].get<std::string>()] = e["value"];
      if (body["metadata"]["next"].is_null()) break;
      cursor = body["metadata"]["next"].get<std::string>();
    }
    CHECK(paged == expected(m, "j_left"));
  }
  // Count, batchGet and prefix answers across both instances equal the model too.
  {
    http_client h(a.port());
    for (const auto* view : {"j_inner", "j_left", "j_outer"}) {
      CAPTURE(view);
      const auto want = expected(m, view);
      auto count = h.get(std::string("/v1/stores/") + view + "/count");
      REQUIRE(count);
      REQUIRE(count->status == 200);
      CHECK(count->body_json()["count"] == want.size());
      json req = {{"keys", json::array()}};
      for (int i = 0; i < keys; i += 3) req["keys"].push_back("k" + std::to_string(i));
      auto b = h.post(std::string("/v1/stores/") + view + "/keys:batchGet", "application/json", req.dump());
      REQUIRE(b);
      REQUIRE_MESSAGE(b->status == 200, b->body);
      const auto batch = b->body_json();  // named: the loops below read into it
      std::set<std::string> missing;
      for (const auto& k : batch["missing"]) missing.insert(k.get<std::string>());
      for (const auto& e : batch["data"]) {
        auto it = want.find(e["key"].get<std::string>());
        REQUIRE(it != want.end());
        CHECK(e["value"] == it->second);
      }
      for (int i = 0; i < keys; i += 3) {
        auto k = "k" + std::to_string(i);
        CHECK(missing.count(k) == (want.count(k) ? 0u : 1u));
      }
      auto p = h.get(std::string("/v1/stores/") + view + "/keys?prefix=k1&limit=1000");
      REQUIRE(p);
      REQUIRE(p->status == 200);
      const auto page = p->body_json();
      std::map<std::string, json> got, want_prefix;
      for (const auto& e : page["data"]) got[e["key"].get<std::string>()] = e["value"];
      for (const auto& [k, v] : want)
        if (k.rfind("k1", 0) == 0) want_prefix[k] = v;
      CHECK(got == want_prefix);
    }
  }
  // The store describes itself.
  {
    http_client h(a.port());
    auto info = h.get("/v1/stores/j_outer");
    REQUIRE(info);
    auto body = info->body_json();
    CHECK(body["kind"] == "join");
    CHECK(body["join"]["type"] == "outer");
    CHECK(body["join"]["right"] == right);
    CHECK(body["repartition_topic"] == app + "-j_outer-repartition");
    CHECK(body["changelog_topic"] == app + "-j_outer-changelog");
  }
  CHECK(a.metric_sum("kstate_ingest_records_invalid_total") == 0);

  // B leaves: A takes its partitions over without their state and restores them from
  // the changelogs; then more updates on both sides.
  CHECK(b.terminate() == 0);
  std::vector<produced> lmore, rmore;
  make_input(12, 300, keys, lmore, rmore);
  produce(left, lmore);
  produce(right, rmore);
  for (const auto& r : lmore) apply_record(m.left, r);
  for (const auto& r : rmore) apply_record(m.right, r);
  a.wait_ready();
  wrong = wait_equal(a.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model after the move; see " << a.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(a.port(), m, keys) == 0);
  CHECK(a.terminate() == 0);
}

TEST_CASE("a join partition copied from a peer carries its sides: the new owner serves and goes on joining") {
  auto left = unique_name("orders"), right = unique_name("customers");
  create_topic(left, 4);
  create_topic(right, 4);
  const int keys = 150;
  std::vector<produced> lrec, rrec;
  make_input(21, 1500, keys, lrec, rrec);
  sides_model m;
  for (const auto& r : lrec) apply_record(m.left, r);
  for (const auto& r : rrec) apply_record(m.right, r);

  auto app = unique_name("join-copy-app");
  auto dir = temp_dir("join-copy");
  const std::string copies = "peer_bootstrap: {min_offsets: 1}\n";
  kstate_process a(app, join_views(left, right), dir + "/a", copies);
  a.start();
  a.wait_ready();
  produce(left, lrec);
  produce(right, rrec);
  auto wrong = wait_equal(a.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model; see " << a.log_path());
  REQUIRE(wrong.empty());
  // Every partition a holds alone (inputs and repartition topics), which the two
  // instances then share.
  int partitions = 0;
  {
    http_client h(a.port());
    auto ready = h.get("/readyz");
    REQUIRE(ready);
    partitions = static_cast<int>(ready->body_json()["partitions"].size());
  }

  // c joins without state: the join partitions it takes are copied from a.
  kstate_process c(app, join_views(left, right), dir + "/c", copies);
  c.start();
  c.wait_ready();
  // Settled: both ready, each holding some of the partitions and together all of them.
  auto held = [](uint16_t port) {
    http_client h(port);
    auto ready = h.get("/readyz");
    return ready && ready->status == 200 ? static_cast<int>(ready->body_json()["partitions"].size()) : -1;
  };
  bool settled = false;
  for (int i = 0; i < 300 && !settled; ++i) {
    const int at_a = held(a.port()), at_c = held(c.port());
    settled = at_a > 0 && at_c > 0 && at_a + at_c == partitions;
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(settled);
  // Every join partition c took was copied: a copy installed per partition of each
  // view's repartition topic that c holds, none failed (a failure, or a copy skipped,
  // restores from the changelog, which would hide copies without sides).
  {
    http_client h(c.port());
    std::map<std::string, int> held_by_c;  // view -> its partitions held by c
    auto ready = h.get("/readyz");
    REQUIRE(ready);
    const auto readiness = ready->body_json();  // named: a temporary would die before the loop's body
    for (const auto& p : readiness["partitions"])
      for (const std::string view : {"j_inner", "j_left", "j_outer"})
        if (p["topic"] == app + "-" + view + "-repartition") ++held_by_c[view];
    auto metrics = h.get("/metrics");
    REQUIRE(metrics);
    std::map<std::string, int> installed, failed;
    std::istringstream lines(metrics->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("kstate_bootstrap_copies_total{", 0) != 0) continue;
      auto at = line.find("store=\"");
      REQUIRE(at != std::string::npos);
      auto store = line.substr(at + 7, line.find('"', at + 7) - at - 7);
      const int n = static_cast<int>(std::stod(line.substr(line.rfind(' ') + 1)));
      if (line.find("result=\"installed\"") != std::string::npos) installed[store] += n;
      else failed[store] += n;
    }
    int copied = 0;
    for (const std::string view : {"j_inner", "j_left", "j_outer"}) {
      CAPTURE(view);
      CHECK(installed[view] == held_by_c[view]);
      CHECK(failed[view] == 0);
      copied += installed[view];
    }
    CHECK_MESSAGE(copied > 0, "see ", c.log_path());
  }
  // The copied partitions answer as the model says, on either instance.
  CHECK(check_gets(c.port(), m, keys) == 0);
  CHECK(check_gets(a.port(), m, keys) == 0);

  // More updates of both sides: a key updated on one side only is joined with the other
  // side as the copy brought it.
  std::vector<produced> lmore, rmore;
  make_input(22, 300, keys, lmore, rmore);
  produce(left, lmore);
  produce(right, rmore);
  for (const auto& r : lmore) apply_record(m.left, r);
  for (const auto& r : rmore) apply_record(m.right, r);
  wrong = wait_equal(c.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong)
    MESSAGE(v << " differs from the model after the copy; see " << a.log_path() << ", " << c.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(c.port(), m, keys) == 0);
  CHECK(check_gets(a.port(), m, keys) == 0);
  CHECK(c.terminate() == 0);
  CHECK(a.terminate() == 0);
}

TEST_CASE("kill -9 during the input: after restart every join equals the model (nothing lost, nothing stale)") {
  auto left = unique_name("orders"), right = unique_name("customers");
  create_topic(left, 3);
  create_topic(right, 3);
  const int keys = 100;
  std::vector<produced> lrec, rrec;
  make_input(21, 4000, keys, lrec, rrec);
  sides_model m;
  for (const auto& r : lrec) apply_record(m.left, r);
  for (const auto& r : rrec) apply_record(m.right, r);

  auto app = unique_name("join-crash");
  auto dir = temp_dir("join-crash");
  kstate_process ks(app, join_views(left, right), dir + "/state", "ingest: {max_batch_records: 200}\n");
  // Static membership: the restarted instance takes its partitions back at once.
  ks.extra_args({"-X", "group.instance.id=" + app + "-0"});
  const int chunks = 8;
  std::atomic<int> produced_chunks{0};
  std::thread producer([&] {
    for (int c = 0; c < chunks; ++c) {
      auto slice = [&](const std::vector<produced>& all) {
        size_t n = all.size() / chunks;
        return std::vector<produced>(all.begin() + c * n, c == chunks - 1 ? all.end() : all.begin() + (c + 1) * n);
      };
      produce(left, slice(lrec));
      produce(right, slice(rrec));
      ++produced_chunks;
    }
  });
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> delay_ms(200, 1500);
  int kills = 0;
  while (produced_chunks < chunks || kills < 6) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ks.kill9();
    ++kills;
  }
  producer.join();
  ks.start();
  ks.wait_ready();
  auto wrong = wait_equal(ks.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong)
    MESSAGE(v << " differs from the model after " << kills << " kills; see " << ks.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(ks.port(), m, keys) == 0);
  MESSAGE(kills << " kills");
  CHECK(ks.terminate() == 0);
}

TEST_CASE("kill -9 with committed batches not yet written: the sides come back from the changelog tail") {
  // Each join batch is committed in Kafka before the writer thread writes it to RocksDB
  // (docs/exactly-once.md, crash point 5): a kill then leaves the store behind the
  // committed offsets, and the restart applies the changelog tail (sides) to catch up.
  // A small writer queue and small memtables keep the writer behind; each kill comes
  // the moment /metrics shows batches waiting for it.
  auto left = unique_name("orders"), right = unique_name("customers");
  create_topic(left, 3);
  create_topic(right, 3);
  const int keys = 2000;
  std::vector<produced> lrec, rrec;
  make_input(31, 20'000, keys, lrec, rrec, 3000);
  sides_model m;
  for (const auto& r : lrec) apply_record(m.left, r);
  for (const auto& r : rrec) apply_record(m.right, r);
  produce(left, lrec);
  produce(right, rrec);

  auto app = unique_name("join-writer");
  auto dir = temp_dir("join-writer");
  kstate_process ks(app, join_views(left, right), dir + "/state");
  ks.extra_args({"--set", "ingest.max_queued_mb=1", "--set", "kafka.group.instance.id=" + app, "--set",
                 "rocksdb.write_buffer_mb=1", "--set", "ingest.max_batch_records=500"});
  auto scrape = [&](const std::string& metric) {
    http_client c(ks.port());
    auto a = c.get("/metrics");
    if (!a || a->status != 200) return -1.0;
    std::istringstream in(a->body);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(metric + " ", 0) == 0) return std::stod(line.substr(metric.size() + 1));
    return -1.0;
  };
  // Changelog records the starts so far restored (the log keeps every start's lines).
  auto restored_records = [&] {
    std::ifstream log(ks.log_path());
    int64_t restored = 0;
    for (std::string line; std::getline(log, line);) {
      auto at = line.find("] restored ");
      if (at != std::string::npos && line.find("-changelog-") != std::string::npos)
        restored += std::stoll(line.substr(at + 11));
    }
    return restored;
  };
  // A batch waiting for the writer may not be committed yet (then it is read again from
  // the input, not restored): kills go on until a start restored a tail.
  int kills_pending = 0;
  for (int attempt = 0; attempt < 30 && (kills_pending < 8 || restored_records() == 0); ++attempt) {
    ks.start();
    // Once the joins have gone further than at the last kill (stage 2 commits batches),
    // the moment batches wait for the writer.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ks.position_sum("j_outer") < 1500 * (attempt + 1) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    double pending = 0;
    while ((pending = scrape("kstate_ingest_write_queue_bytes")) <= 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ks.kill9();
    if (pending > 0) ++kills_pending;
    if (pending <= 0) break;  // caught up: nothing left to interrupt
  }
  MESSAGE(kills_pending << " kills with batches waiting for the writer");
  ks.extra_args({"--set", "kafka.group.instance.id=" + app});
  ks.start();
  ks.wait_ready(std::chrono::seconds(180));
  auto wrong = wait_equal(ks.port(), m, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model; see " << ks.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(ks.port(), m, 300) == 0);
  // The restarts caught up from changelog tails: the path this test is for was taken.
  const int64_t restored = restored_records();
  MESSAGE(restored << " changelog records restored over the restarts");
  CHECK(kills_pending > 0);
  CHECK(restored > 0);
  CHECK(ks.terminate() == 0);
}

TEST_CASE("inputs that are not co-partitioned are refused at start, with the reason") {
  auto left = unique_name("orders"), right = unique_name("customers");
  create_topic(left, 4);
  create_topic(right, 3);
  auto dir = temp_dir("join-copart");
  kstate_process ks(unique_name("join-copart"),
                    {{"j", left, "json", "", "string", "kind: join, join: {type: inner, right: " + right + "}"}},
                    dir + "/state");
  ks.start();
  CHECK(ks.wait_exit(std::chrono::seconds(90)) != 0);
  std::ifstream log(ks.log_path());
  std::stringstream text;
  text << log.rdbuf();
  CHECK_MESSAGE(text.str().find("its inputs are not co-partitioned: topic '" + left + "' has 4 partitions, topic '" +
                                right + "' has 3") != std::string::npos,
                text.str());

  // The partitioners are checked when the configuration is read.
  kstate_process other(
      unique_name("join-copart"),
      {{"j", left, "json", "", "string",
        "partitioner: murmur2, kind: join, join: {right: " + right + ", right_partitioner: consistent}"}},
      dir + "/other");
  other.start();
  CHECK(other.wait_exit(std::chrono::seconds(30)) != 0);
  std::ifstream log2(other.log_path());
  std::stringstream text2;
  text2 << log2.rdbuf();
  CHECK_MESSAGE(text2.str().find("not co-partitioned") != std::string::npos, text2.str());
}
