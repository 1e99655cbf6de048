// Network partitions (docs/reliability.md, scenario 9 of the fault matrix), Jepsen-style:
// the broker and two kstate instances are separate hosts (network namespaces on one
// bridge, netns_lab.h) and the links between them are cut, degraded and flapped while a
// table view and an exactly-once count re-keyed through a repartition topic ingest and
// lookups go through both instances. Every answer is checked against the acknowledged
// records (the value the key had at the position the answer claims), then every key and
// every count against the model: nothing lost, nothing counted twice.
//
// The test runs a broker of its own inside the broker's namespace (scripts/kafka with
// KSTATE_KAFKA_HOST and KSTATE_KAFKA_NETNS): the suite's broker, on loopback, cannot be
// cut off from anyone. It needs root (namespaces, tc). KSTATE_FAULT_SCALE=long
// (scripts/chaos) runs the long versions; each case prints one summary line.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "agg_common.h"
#include "fault_common.h"
#include "netns_lab.h"
#include "support.h"

using namespace kstate::testing;
using clock_type = std::chrono::steady_clock;

namespace {

// The hosts and the broker, shared by every case of this process (a broker start takes
// 10 to 20 s), removed at exit; a run that died leaves namespaces behind, which the next
// one removes first.
struct network {
  netns_lab lab{{"broker", "a", "b"}};
  std::string kafka_run, bootstrap;

  network() {
    // The broker of a run that died was killed with its namespace; its data goes too.
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
      if (e.path().filename().string().rfind("kstate-it-partition-kafka-", 0) == 0) {
        std::error_code ec;
        std::filesystem::remove_all(e.path(), ec);
      }
    kafka_run = temp_dir("partition-kafka");
    const auto& b = lab.at("broker");
    auto out =
        sh("KSTATE_KAFKA_RUN='" + kafka_run + "' KSTATE_KAFKA_HOST=" + b.address + " KSTATE_KAFKA_NETNS=" + b.netns +
           " KSTATE_KAFKA_HEAP=512m " + KSTATE_SOURCE_DIR + "/scripts/kafka start");
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    bootstrap = out;
    // From here on, create_topic, produce_bytes and friends talk to this broker.
    ::setenv("KSTATE_KAFKA_RUN", kafka_run.c_str(), 1);
    ::setenv("KSTATE_BOOTSTRAP", bootstrap.c_str(), 1);
  }
  ~network() {
    (void)std::system(("KSTATE_KAFKA_RUN='" + kafka_run + "' " + KSTATE_SOURCE_DIR + "/scripts/kafka stop").c_str());
    std::error_code ec;
    std::filesystem::remove_all(kafka_run, ec);
  }

  // An instance on `host` with the table view "t" and, when `counting`, the count "c".
  kstate_process instance(const std::string& host, const std::string& app, const std::string& dir,
                          const std::string& table_topic, const std::string& count_topic, bool counting) {
    const auto& h = lab.at(host);
    std::vector<kstate_process::view> views{{"t", table_topic}};
    if (counting) views.push_back({"c", count_topic, "json", "", "string", "kind: count, group_by: {json: acct}"});
    return kstate_process(app, views, dir + "/" + host, "processing_guarantee: exactly_once\n",
                          {h.netns, h.address, bootstrap});
  }
};

network& net() {
  REQUIRE_MESSAGE(::geteuid() == 0, "the network-partition scenarios need root (network namespaces, tc)");
  static network n;
  return n;
}

http_address address_of(const kstate_process& ks) { return {ks.host(), ks.port()}; }

// Lookups of `keys` at one instance from `threads` connections until stopped; every
// answer kept (for check_answers) with its latency and whether it was served there.
class prober {
 public:
  prober(http_address at, std::vector<std::string> keys, int threads, std::string self)
      : at_(std::move(at)), keys_(std::move(keys)), self_(std::move(self)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { run(i); });
  }
  ~prober() { finish(); }
  void finish() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  // Answers given while `on` was true.
  void mark(bool on) { marked_ = on; }

  std::vector<observation> seen;
  int64_t failed = 0;          // no answer at all (connection refused or reset)
  int64_t max_ms = 0;          // slowest answer
  int64_t max_marked_ms = 0;   // slowest answer while marked
  int64_t marked_served = 0;   // 200/404 served by `self` while marked
  int64_t marked_refused = 0;  // 503 while marked
  int64_t marked_other = 0;    // answers served elsewhere while marked
  int64_t bare_503 = 0;        // 503s without Retry-After or a problem+json body: not retryable as documented

 private:
  void run(int seed) {
    http_client c(at_.host, at_.port);
    std::mt19937 rng(static_cast<uint32_t>(seed) + 77);
    while (!stop_) {
      const auto& key = keys_[rng() % keys_.size()];
      const bool marked = marked_;
      const auto t0 = clock_type::now();
      auto a = c.get("/v1/stores/t/keys/" + key);
      const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
      std::unique_lock lock(mu_);
      max_ms = std::max(max_ms, ms);
      if (marked) max_marked_ms = std::max(max_marked_ms, ms);
      if (!a) {
        ++failed;
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      observation o{key, a->status, json::parse(a->body, nullptr, false)};
      if (marked && a->status == 503) ++marked_refused;
      if (a->status == 503 && (!a->headers.count("retry-after") ||
                               a->headers["content-type"] != "application/problem+json" || !o.body.is_object()))
        ++bare_503;
      if (marked && (a->status == 200 || a->status == 404) && o.body.is_object() &&
          o.body.value("served_by", "") == self_)
        ++marked_served;
      else if (marked && a->status != 503) ++marked_other;
      seen.push_back(std::move(o));
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  http_address at_;
  std::vector<std::string> keys_;
  std::string self_;
  std::mutex mu_;
  std::atomic<bool> stop_{false}, marked_{false};
  std::vector<std::thread> threads_;
};

// The keys `ks` serves itself and those it forwards, by the `served_by` of its answers
// (a 404 names its server too).
std::pair<std::vector<std::string>, std::vector<std::string>> split_keys(const kstate_process& ks, int keys) {
  http_client c(ks.host(), ks.port());
  std::vector<std::string> local, remote;
  for (int i = 0; i < keys; ++i) {
    auto key = "key-" + std::to_string(i);
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    REQUIRE_MESSAGE((a->status == 200 || a->status == 404), a->body);
    (a->body_json()["served_by"] == ks.endpoint() ? local : remote).push_back(key);
  }
  return {local, remote};
}

// Topics of 4 partitions, and instances a and b of one application on hosts a and b,
// settled. With `counting`, the count view re-keyed through a repartition topic too.
struct two_instances {
  std::string table_topic = unique_name("part-t"), count_topic = unique_name("part-acct");
  bool created = (create_topic(table_topic, 4), create_topic(count_topic, 4), true);
  bool counting;
  std::string dir, app;
  kstate_process a, b;
  two_instances(network& n, const std::string& name, bool with_count)
      : counting(with_count),
        dir(temp_dir(name)),
        app(unique_name(name + "-app")),
        a(n.instance("a", app, dir, table_topic, count_topic, counting)),
        b(n.instance("b", app, dir, table_topic, count_topic, counting)) {
    a.start();
    b.start();
    settle();
  }
  // Table, count source and repartition topic: 3 x 4 partitions; the table alone: 4.
  void settle() { wait_settled({&a, &b}, counting ? 12 : 4, std::chrono::seconds(180)); }
};

// The end of every case: two more batches after the last fault, the load stopped, the
// group settled and both instances caught up; then every answer given, every key
// (through each instance) and every count checked.
void finish_and_check(two_instances& s, load& l, int keys, std::vector<observation> seen, tally& t) {
  const int after = l.batches + 2;
  while (l.batches < after) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  l.finish();
  s.settle();
  auto& a = s.a;
  auto& b = s.b;
  const auto total = static_cast<int64_t>(l.table_log.size());
  const auto deadline = clock_type::now() + std::chrono::seconds(180);
  while (a.position_sum("t") + b.position_sum("t") < total && clock_type::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE_MESSAGE(a.position_sum("t") + b.position_sum("t") == total,
                  "the table did not catch up; see " << a.log_path() << " and " << b.log_path());
  if (s.counting)
    CHECK_MESSAGE(wait_total(a.host(), a.port(), "c", l.accounts_total, std::chrono::seconds(120)) == l.accounts_total,
                  "the count did not catch up; see " << a.log_path() << " and " << b.log_path());
  check_answers(seen, l.table_log, t);
  const auto model = l.table_log.model();
  check_final(a.host(), a.port(), "t", model, keys, t);
  check_final(b.host(), b.port(), "t", model, keys, t);
  if (s.counting) check_counts(b.host(), b.port(), "c", l.per_account, t);
  t.notes = std::to_string(total) + " table records" +
            (s.counting ? ", " + std::to_string(l.accounts_total) + " counted" : std::string()) +
            (t.notes.empty() ? "" : ", " + t.notes);
  t.report();
}

void append(std::vector<observation>& to, const std::vector<observation>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

TEST_CASE("an instance cut off from the broker longer than the group session: answers correct or 503, it rejoins") {
  auto& n = net();
  healed_on_exit heal{n.lab};
  const int keys = 2000;
  const auto cut_for = std::chrono::seconds(long_run() ? 60 : 12);
  const int cuts = long_run() ? 2 : 1;
  tally t{"partition: instance cut off from the broker"};
  two_instances s(n, "part-broker", true);

  load l(s.table_topic, s.count_topic, keys);
  l.start(1000);
  while (l.batches < 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // The instance cut off is one that holds table partitions (the assignor balances the
  // 12 partitions, not each topic's): a, unless b holds them all.
  auto [local, remote] = split_keys(s.a, keys);
  const bool a_cut = !local.empty();
  auto& x = a_cut ? s.a : s.b;
  const std::string x_host = a_cut ? "a" : "b";
  if (!a_cut) local = remote;
  reader r(keys, "t", {address_of(s.a), address_of(s.b)});
  // Its own keys, asked of it: served from its store while it is cut off.
  prober mine(address_of(x), local, 1, x.endpoint());
  int64_t dropped = 0;
  for (int i = 0; i < cuts; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    MESSAGE("cutting " << x_host << " off the broker for " << cut_for.count() << " s, records acknowledged so far "
                       << l.table_log.size());
    const auto before = n.lab.dropped(x_host) + n.lab.dropped("broker");
    n.lab.cut(x_host, "broker");
    mine.mark(true);
    ++t.runs;
    std::this_thread::sleep_for(cut_for);
    REQUIRE_MESSAGE(::kill(x.pid(), 0) == 0, x_host << " exited while cut off; see " << x.log_path());
    {
      auto live = http_client(x.host(), x.port()).get("/livez");
      REQUIRE(live);
      CHECK(live->status == 200);
    }
    mine.mark(false);
    dropped += n.lab.dropped(x_host) + n.lab.dropped("broker") - before;
    n.lab.heal();
    // It rejoins: the group settles with both instances again.
    s.settle();
  }
  CHECK(dropped > 0);  // the cut did act
  r.finish();
  mine.finish();
  // The cut-off instance kept answering its own keys from its store, with positions
  // (check_answers checks each against them), until its session ended.
  CHECK(mine.marked_served > 0);
  CHECK(mine.failed == 0);
  CHECK(mine.bare_503 == 0);
  auto seen = r.seen;
  append(seen, mine.seen);
  t.notes = x_host + " answered " + std::to_string(mine.marked_served) + " of its own keys itself while cut off, " +
            std::to_string(mine.marked_refused) + " 503, " + std::to_string(dropped) + " packets dropped";
  finish_and_check(s, l, keys, std::move(seen), t);
  CHECK(s.a.terminate() == 0);
  CHECK(s.b.terminate() == 0);
}

TEST_CASE(
    "two instances cut off from each other: forwarded lookups end with 503 within the deadline, then work again") {
  auto& n = net();
  healed_on_exit heal{n.lab};
  const int keys = 2000;
  const auto cut_for = std::chrono::seconds(long_run() ? 30 : 8);
  tally t{"partition: instances cut off from each other"};
  // The table alone: its 4 partitions are split 2 and 2, so a forwards half the keys.
  two_instances s(n, "part-peers", false);

  load l(s.table_topic, s.count_topic, keys);
  l.start(1000);
  while (l.batches < 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto [local, remote] = split_keys(s.a, keys);
  REQUIRE(!local.empty());
  REQUIRE(!remote.empty());
  prober fwd(address_of(s.a), remote, 3, s.a.endpoint());
  prober loc(address_of(s.a), local, 1, s.a.endpoint());
  std::this_thread::sleep_for(std::chrono::seconds(2));

  MESSAGE("cutting a off b for " << cut_for.count() << " s");
  n.lab.cut("a", "b");
  fwd.mark(true);
  loc.mark(true);
  ++t.runs;
  std::this_thread::sleep_for(cut_for / 2);
  // The cut acts: from a's host, b does not answer at all.
  CHECK(sh("ip netns exec " + n.lab.at("a").netns + " curl -s -m 2 -o /dev/null -w '%{http_code}' " + s.b.endpoint() +
           "/livez; true") == "000");
  std::this_thread::sleep_for(cut_for / 2);
  fwd.mark(false);
  loc.mark(false);
  n.lab.heal();
  // Healed: forwarding works again, every key of b answered through a by b.
  {
    http_client c(s.a.host(), s.a.port());
    size_t next = 0;
    const auto deadline = clock_type::now() + std::chrono::seconds(60);
    while (next < remote.size() && clock_type::now() < deadline) {
      auto a = c.get("/v1/stores/t/keys/" + remote[next]);
      REQUIRE(a);
      if ((a->status == 200 || a->status == 404) && a->body_json()["served_by"] == s.b.endpoint()) ++next;
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK_MESSAGE(next == remote.size(), "forwarding to b did not recover; see " << s.a.log_path());
  }
  fwd.finish();
  loc.finish();
  // (A lookup sent just before the heal may still be answered by b: no check on them.)
  MESSAGE("forwarded during the cut: slowest " << fwd.max_marked_ms << " ms, " << fwd.marked_other << " answered, "
                                               << fwd.marked_refused << " 503; local: slowest " << loc.max_marked_ms
                                               << " ms, " << loc.marked_served << " answered");
  // The forwarding deadline (5 s) bounds every forwarded lookup, and a local one never
  // waits behind them.
  CHECK(fwd.max_marked_ms < 5000 + 2000);
  CHECK(loc.max_marked_ms < 2000);
  CHECK(fwd.marked_refused > 0);
  CHECK(loc.marked_served > 0);
  CHECK(fwd.failed == 0);
  CHECK(loc.failed == 0);
  CHECK(fwd.bare_503 == 0);
  CHECK(loc.bare_503 == 0);
  auto seen = fwd.seen;
  append(seen, loc.seen);
  t.notes = "forwarded lookups during the cut: slowest " + std::to_string(fwd.max_marked_ms) + " ms; local: slowest " +
            std::to_string(loc.max_marked_ms) + " ms, " + std::to_string(loc.marked_served) + " answered";
  finish_and_check(s, l, keys, std::move(seen), t);
  CHECK(s.a.terminate() == 0);
  CHECK(s.b.terminate() == 0);
}

TEST_CASE("a degraded, flapping link (delay, jitter, loss, reordering, down/up) during ingest and lookups") {
  auto& n = net();
  healed_on_exit heal{n.lab};
  const int keys = 2000;
  const auto period = std::chrono::seconds(long_run() ? 120 : 18);
  tally t{"partition: degraded and flapping link"};
  two_instances s(n, "part-flap", true);

  load l(s.table_topic, s.count_topic, keys);
  l.start(1000);
  while (l.batches < 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  reader r(keys, "t", {address_of(s.a), address_of(s.b)});
  std::this_thread::sleep_for(std::chrono::seconds(2));
  MESSAGE("degrading a's link for " << period.count() << " s, down now and then");
  n.lab.degrade("a");
  std::mt19937 rng(17);
  const auto end = clock_type::now() + period;
  while (clock_type::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000 + rng() % 3000));
    n.lab.link("a", false);
    ++t.runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(500 + rng() % 2500));
    n.lab.link("a", true);
    REQUIRE_MESSAGE(::kill(s.a.pid(), 0) == 0, "a exited; see " << s.a.log_path());
  }
  const auto dropped = n.lab.dropped("a"), slowed = n.lab.slowed("a");
  n.lab.heal();
  CHECK(dropped > 0);
  CHECK(slowed > 0);
  r.finish();
  t.notes = std::to_string(t.runs) + " link drops; into a, " + std::to_string(slowed) + " packets slowed, " +
            std::to_string(dropped) + " dropped";
  finish_and_check(s, l, keys, r.seen, t);
  CHECK(s.a.terminate() == 0);
  CHECK(s.b.terminate() == 0);
}
