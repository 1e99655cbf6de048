// Three instances, then one killed and a fourth added, under a steady read load: every
// answer recorded by the readers is correct or a 503, never a wrong value and never a
// 404 for a key that exists.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

struct answer_log {
  std::atomic<uint64_t> correct{0}, unavailable{0}, wrong{0}, failed{0};
  std::mutex mu;
  std::vector<std::string> wrong_samples;
};

// Reads random keys through the given instances until `stop`, recording each answer.
void reader(const std::vector<uint16_t>& ports, int keys, std::atomic<bool>& stop, answer_log& log, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, keys - 1);
  std::vector<std::unique_ptr<http_client>> clients;
  for (auto p : ports) clients.push_back(std::make_unique<http_client>(p));
  size_t i = 0;
  while (!stop) {
    int k = pick(rng);
    auto& c = *clients[i++ % clients.size()];
    auto a = c.get("/v1/stores/s/keys/key-" + std::to_string(k));
    if (!a) {
      ++log.failed;
      continue;
    }
    if (a->status == 503) {
      ++log.unavailable;
      continue;
    }
    bool ok = a->status == 200 && a->body_json()["value"]["i"] == k;
    if (ok) {
      ++log.correct;
    } else {
      ++log.wrong;
      std::lock_guard lock(log.mu);
      if (log.wrong_samples.size() < 5) log.wrong_samples.push_back(std::to_string(k) + ": " + a->body);
    }
  }
}

bool all_keys_correct(uint16_t port, int keys) {
  http_client c(port);
  for (int k = 0; k < keys; ++k) {
    auto a = c.get("/v1/stores/s/keys/key-" + std::to_string(k));
    if (!a || a->status != 200 || a->body_json()["value"]["i"] != k) {
      // The first wrong answer says why: transport failure, a status, or a value.
      MESSAGE("via " << port << ", key-" << k << ": "
                     << (a ? std::to_string(a->status) + " " + a->body.substr(0, 300) : std::string("no answer")));
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("3 instances, kill -9 one, add a fourth, under read load: answers are correct or 503, never wrong") {
  const int keys = 30'000;
  auto topic = unique_name("trio");
  create_topic(topic, 6);
  std::vector<produced> recs;
  for (int k = 0; k < keys; ++k) recs.push_back({"key-" + std::to_string(k), R"({"i":)" + std::to_string(k) + "}"});
  produce(topic, recs);

  auto dir = temp_dir("trio");
  auto app = unique_name("trio-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a"), b(app, {{"s", topic}}, dir + "/b"),
      c(app, {{"s", topic}}, dir + "/c"), d(app, {{"s", topic}}, dir + "/d");
  a.start();
  b.start();
  c.start();
  for (auto* ks : {&a, &b, &c}) ks->wait_ready();
  const std::vector<uint16_t> trio{a.port(), b.port(), c.port()};
  for (int i = 0; i < 600 && !group_settled(trio, 6); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string why;
  REQUIRE_MESSAGE(group_settled(trio, 6, &why), why);

  // Every key through every instance, and the whole range through one.
  for (auto* ks : {&a, &b, &c}) CHECK_MESSAGE(all_keys_correct(ks->port(), keys), "via " << ks->port());
  {
    http_client rc(b.port());
    std::vector<std::string> got, want;
    for (int k = 0; k < keys; ++k) want.push_back("key-" + std::to_string(k));
    std::sort(want.begin(), want.end());
    std::string cursor;
    for (int guard = 0; guard < 1000; ++guard) {
      auto r = rc.get("/v1/stores/s/keys?limit=1000" + (cursor.empty() ? "" : "&cursor=" + cursor));
      REQUIRE(r);
      REQUIRE(r->status == 200);
      auto body = r->body_json();
      for (const auto& e : body["data"]) got.push_back(e["key"].get<std::string>());
      if (body["metadata"]["next"].is_null()) break;
      cursor = body["metadata"]["next"].get<std::string>();
    }
    CHECK(got == want);
  }

  // Readers on the two instances that survive.
  answer_log log;
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (unsigned t = 0; t < 2; ++t)
    readers.emplace_back([&, t] { reader({a.port(), b.port()}, keys, stop, log, 100 + t); });
  std::this_thread::sleep_for(std::chrono::seconds(1));

  c.kill9();
  auto killed_at = std::chrono::steady_clock::now();
  bool recovered = false;
  for (int i = 0; i < 120 && !recovered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    recovered = cluster_settled(a.port(), 2, 6) && all_keys_correct(a.port(), keys);
  }
  auto recovery_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  CHECK(recovered);
  uint64_t after_kill_503 = log.unavailable;

  // A fourth instance joins under the same load.
  d.start();
  d.wait_ready();
  bool joined = false;
  for (int i = 0; i < 600 && !joined; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    joined = group_settled({a.port(), b.port(), d.port()}, 6);
  }
  CHECK(joined);
  CHECK(all_keys_correct(d.port(), keys));
  CHECK(all_keys_correct(a.port(), keys));

  stop = true;
  for (auto& r : readers) r.join();
  MESSAGE("readers: " << log.correct.load() << " correct, " << log.unavailable.load() << " 503 (" << after_kill_503
                      << " by the time the survivors answered everything), " << log.wrong.load() << " wrong, "
                      << log.failed.load() << " transport failures; every key correct again " << recovery_s
                      << " s after the kill");
  for (const auto& w : log.wrong_samples) MESSAGE("wrong: " << w);
  CHECK(log.wrong == 0);
  CHECK(log.failed == 0);
  CHECK(log.correct > 1000);
  for (auto* ks : {&a, &b, &d}) CHECK(ks->terminate() == 0);
}

namespace {

// The group's committed offset of each partition of `topic`, by Kafka's own tool
// (partitions with none are left out).
std::map<int, int64_t> committed_offsets(const std::string& group, const std::string& topic) {
  std::map<int, int64_t> out;
  std::istringstream lines(kafka("consumer-groups --describe --group " + group + " 2>/dev/null"));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream cols(line);
    std::string g, t, partition, current;
    if (!(cols >> g >> t >> partition >> current) || t != topic || current == "-") continue;
    out[std::stoi(partition)] = std::stoll(current);
  }
  return out;
}

double rebalances(std::initializer_list<kstate_process*> instances) {
  double n = 0;
  for (auto* ks : instances) n += ks->metric_sum("kstate_ingest_rebalances_total");
  return n;
}

}  // namespace

TEST_CASE("a restart and a third member while commits are frequent: the group settles once, offsets follow") {
  // Group commits are only made while the group is steady. librdkafka 2.0.2 takes a
  // commit refused with ILLEGAL_GENERATION (one queued behind the member's JoinGroup) as
  // a lost assignment; made during every round, such commits kept members taking
  // partitions from one another. Commits every 10 ms, through a static member's restart
  // and a join: one settled group, and the group's offsets reach the input's end.
  auto topic = unique_name("busy-commits");
  create_topic(topic, 6);
  std::vector<produced> recs;
  for (int k = 0; k < 600; ++k) recs.push_back({"key-" + std::to_string(k), R"({"i":)" + std::to_string(k) + "}"});
  produce(topic, recs);
  auto dir = temp_dir("busy-commits");
  auto app = unique_name("busy-commits-app");
  const std::string often = "ingest: {commit_interval_ms: 10}\n";
  kstate_process a(app, {{"s", topic}}, dir + "/a", often), b(app, {{"s", topic}}, dir + "/b", often),
      c(app, {{"s", topic}}, dir + "/c", often);
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  std::string why;
  bool settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({a.port(), b.port()}, 6, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);
  // b restarts: a static member taking its partitions back without a rebalance.
  REQUIRE(b.terminate() == 0);
  b.start();
  b.wait_ready();
  settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled({a.port(), b.port()}, 6, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);

  c.start();
  c.wait_ready();
  const std::vector<uint16_t> trio{a.port(), b.port(), c.port()};
  settled = false;
  for (int i = 0; i < 300 && !(settled = group_settled(trio, 6, &why)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(settled, why);
  // Settled for good: no member sees another rebalance round in the next seconds.
  const double rounds = rebalances({&a, &b, &c});
  std::this_thread::sleep_for(std::chrono::seconds(6));
  CHECK(rebalances({&a, &b, &c}) == rounds);
  CHECK_MESSAGE(group_settled(trio, 6, &why), why);
  for (auto* ks : {&a, &b, &c}) CHECK_MESSAGE(all_keys_correct(ks->port(), 600), "via " << ks->port());

  // The group's offsets still follow what the members applied (for lag monitors): more
  // records, then every partition's committed offset is its end.
  std::vector<produced> more;
  for (int k = 600; k < 900; ++k) more.push_back({"key-" + std::to_string(k), R"({"i":)" + std::to_string(k) + "}"});
  produce(topic, more);
  for (int i = 0; i < 300 && a.position_sum("s") + b.position_sum("s") + c.position_sum("s") != 900; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a.position_sum("s") + b.position_sum("s") + c.position_sum("s") == 900);
  int64_t committed = 0;
  for (int i = 0; i < 20; ++i) {
    committed = 0;
    for (const auto& [p, o] : committed_offsets(app, topic)) committed += o;
    if (committed == 900) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  CHECK(committed == 900);
}
