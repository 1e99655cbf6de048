// Two instances compute a word count; one is killed for good. The survivor restores
// the partitions it takes over from their changelogs (it does not read their input
// again) and answers every word correctly.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "agg_common.h"

using namespace kstate::testing;

namespace {

// Sum of a metric's series for one topic partition.
double partition_metric(uint16_t port, const std::string& name, const std::string& topic, int partition) {
  http_client c(port);
  auto a = c.get("/metrics");
  REQUIRE(a);
  std::istringstream in(a->body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    if (line.find("topic=\"" + topic + "\"") == std::string::npos) continue;
    if (line.find("partition=\"" + std::to_string(partition) + "\"") == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// Partitions of `topic` that an instance's /readyz lists as assigned.
std::set<int> assigned(uint16_t port, const std::string& topic) {
  http_client c(port);
  auto a = c.get("/readyz");
  REQUIRE(a);
  std::set<int> out;
  auto body = a->body_json();  // named: a temporary would die before the loop body
  for (const auto& p : body["partitions"])
    if (p["topic"] == topic) out.insert(p["partition"].get<int>());
  return out;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

}  // namespace

TEST_CASE(
    "2 instances, one killed for good: the survivor restores from the changelog, reads no input again, answers every "
    "word") {
  auto c = make_corpus(30'000, 800, 23);
  auto lines = unique_name("restore-lines");
  create_topic(lines, 6);
  auto app = unique_name("restore-app");
  auto repartition = app + "-words-repartition", changelog = app + "-words-changelog";
  std::vector<kstate_process::view> views{{"words", lines, "json", "", "string", "kind: count, group_by: words"}};
  kstate_process x(app, views, temp_dir("restore-x") + "/state");
  kstate_process y(app, views, temp_dir("restore-y") + "/state");
  x.start();
  y.start();
  x.wait_ready();
  y.wait_ready();
  // Cooperative rebalancing moves partitions in rounds: wait until both instances
  // hold partitions and every store partition is held.
  auto settled = [&] {
    auto xs = assigned(x.port(), repartition), ys = assigned(y.port(), repartition);
    auto xl = assigned(x.port(), lines), yl = assigned(y.port(), lines);
    return cluster_settled(x.port(), 2) && xs.size() + ys.size() == 6 && xl.size() + yl.size() == 6 &&
           xs.size() + xl.size() > 0 && ys.size() + yl.size() > 0;
  };
  REQUIRE(wait_for(settled, std::chrono::seconds(90)));

  produce(lines, c.records);
  REQUIRE(wait_total(x.port(), "words", c.words, std::chrono::seconds(120)) == c.words);

  // The victim is an instance holding store partitions (the assignor may put all of
  // them on one instance); the other one survives.
  bool x_victim = !assigned(x.port(), repartition).empty();
  kstate_process& b = x_victim ? x : y;
  kstate_process& a = x_victim ? y : x;
  auto b_store = assigned(b.port(), repartition), b_source = assigned(b.port(), lines);
  MESSAGE("the victim owns " << b_store.size() << " repartition and " << b_source.size() << " source partitions");
  REQUIRE_FALSE(b_store.empty());
  double restored_before = a.metric_sum("kstate_restore_records_total");

  b.kill9();
  REQUIRE_MESSAGE(wait_for(
                      [&] {
                        return cluster_settled(a.port(), 1) && assigned(a.port(), repartition).size() == 6 &&
                               assigned(a.port(), lines).size() == 6;
                      },
                      std::chrono::seconds(90)),
                  "survivor did not take every partition; see " << a.log_path());
  a.wait_ready();

  // Restored from the changelog: the log names each partition taken over, and the
  // metric counts the records.
  std::ifstream log(a.log_path());
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  int64_t restored_logged = 0;
  for (int p : b_store) {
    std::regex re("restored (\\d+) records of " + changelog + "-" + std::to_string(p) + " ");
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(text, m, re), "no restore of partition " << p << " in " << a.log_path());
    restored_logged += std::stoll(m[1]);
  }
  double restored = a.metric_sum("kstate_restore_records_total") - restored_before;
  MESSAGE("survivor restored " << restored << " changelog records for " << b_store.size() << " partitions");
  CHECK(restored > 0);
  CHECK(restored == restored_logged);

  // The input of the partitions taken over was not read again: nothing consumed from
  // them on the survivor (b had committed everything before it died).
  for (int p : b_source)
    CHECK_MESSAGE(partition_metric(a.port(), "kstate_ingest_records_consumed_total", lines, p) == 0, p);
  for (int p : b_store)
    CHECK_MESSAGE(partition_metric(a.port(), "kstate_ingest_records_consumed_total", repartition, p) == 0, p);

  // Every word, from the survivor alone.
  http_client h(a.port());
  size_t wrong = 0;
  for (const auto& [word, n] : c.counts) {
    auto r = h.get("/v1/stores/words/keys/" + word);
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 200, word << ": " << r->body);
    if (r->body_json()["value"] != n) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(read_store(a.port(), "words").size() == c.counts.size());
  CHECK(a.terminate() == 0);
}

TEST_CASE("SIGTERM during a changelog restore stops it at once; the next start resumes it where it stopped") {
  // 300,000 keys counted once each: a changelog of one record per key, which an instance
  // with an empty state directory restores before it reads its input.
  const int keys = 300'000;
  auto topic = unique_name("restore-stop");
  create_topic(topic, 6);
  auto app = unique_name("restore-stop-app");
  const std::string changelog = app + "-counts-changelog";
  std::vector<kstate_process::view> views{{"counts", topic, "json", "", "string", "kind: count"}};
  auto dir = temp_dir("restore-stop") + "/state";
  kstate_process ks(app, views, dir);
  ks.start();
  ks.wait_ready();
  std::vector<produced> records;
  records.reserve(keys);
  for (int i = 0; i < keys; ++i) records.push_back({"k" + std::to_string(i), "1"});
  produce(topic, records);
  REQUIRE(wait_for([&] { return ks.metric_sum("kstate_ingest_records_applied_total") >= keys; },
                   std::chrono::seconds(120)));
  REQUIRE(ks.terminate() == 0);

  auto log_text = [&] {
    std::ifstream in(ks.log_path());
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Wipe the state and start again; SIGTERM once a partition shows a restore under
  // way. A restore that finished before the signal arrived is tried again.
  // Restores take well under a second here; a broker quota on the restore consumer
  // (its client id) keeps one under way long enough for the signal to find it.
  const auto client = unique_name("restore-stop-client");
  ks.extra_args({"--set", "ingest.client_id=" + client});
  struct quota_guard {
    std::string entity;
    ~quota_guard() {
      sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka java kafka.admin.ConfigCommand --bootstrap-server " +
         bootstrap() + " --alter --delete-config consumer_byte_rate " + entity + " >/dev/null 2>&1 || true");
    }
  } guard{"--entity-type clients --entity-name " + client + "-restore"};
  sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka java kafka.admin.ConfigCommand --bootstrap-server " +
     bootstrap() + " --alter --add-config consumer_byte_rate=200000 " + guard.entity + " >/dev/null");
  std::smatch stopped;
  std::string stopped_partition, stopped_at;
  for (int attempt = 0; attempt < 5 && stopped_partition.empty(); ++attempt) {
    std::filesystem::remove_all(dir);
    const size_t log_from = log_text().size();
    ks.start();
    http_client c(ks.port());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool under_way = false;
    while (!under_way && std::chrono::steady_clock::now() < deadline) {
      auto a = c.get("/readyz");
      if (!a) continue;
      auto body = a->body_json();
      for (const auto& p : body["partitions"])
        if (p.contains("restore") && p["restore"]["restored"].get<int64_t>() > 0 &&
            p["restore"]["restored"] < p["restore"]["total"])
          under_way = true;
      if (body["ready"] == true) break;
    }
    const auto signalled = std::chrono::steady_clock::now();
    CHECK(ks.terminate() == 0);
    const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
    auto text = log_text().substr(log_from);
    std::regex re("stopping: restore of " + changelog + "-(\\d+) into store counts left at offset (\\d+) of (\\d+)");
    if (std::regex_search(text, stopped, re)) {
      stopped_partition = stopped[1];
      stopped_at = stopped[2];
      CHECK(std::stoll(stopped[2]) < std::stoll(stopped[3]));
      MESSAGE("restore of partition " << stopped_partition << " stopped at offset " << stopped_at << " of "
                                      << stopped[3] << "; the process exited " << stop_s << " s after SIGTERM");
    } else {
      MESSAGE("attempt " << attempt << ": the restore finished before the signal (under way seen: " << under_way
                         << ")");
    }
  }
  REQUIRE_MESSAGE(!stopped_partition.empty(), "no restore was interrupted; see " << ks.log_path());
  sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka java kafka.admin.ConfigCommand --bootstrap-server " +
     bootstrap() + " --alter --delete-config consumer_byte_rate " + guard.entity + " >/dev/null");

  // The next start restores the rest, from where the stop left it, and every count is 1.
  const size_t log_from = log_text().size();
  ks.start();
  ks.wait_ready();
  auto text = log_text().substr(log_from);
  std::smatch resumed;
  REQUIRE_MESSAGE(
      std::regex_search(text, resumed,
                        std::regex("catching up from changelog " + changelog + "-" + stopped_partition + " at (\\d+)")),
      "partition " << stopped_partition << " not restored again; see " << ks.log_path());
  CHECK(resumed[1] == stopped_at);
  auto all = read_store(ks.port(), "counts");
  CHECK(all.size() == static_cast<size_t>(keys));
  size_t wrong = 0;
  for (const auto& [k, v] : all)
    if (v != 1) ++wrong;
  CHECK(wrong == 0);
  CHECK(ks.terminate() == 0);
}

TEST_CASE("a long changelog restore runs between polls: the group rebalances meanwhile, counts stay exact") {
  // The broker throttles the restore consumer (a quota on its client id, with small
  // fetches), so restoring takes seconds. Run inside the rebalance callback, such a
  // restore kept the member from rejoining: an instance joining meanwhile waited for the
  // whole restore (or, past max.poll.interval.ms, the restoring member was dropped).
  auto topic = unique_name("slow-restore");
  create_topic(topic, 1);
  std::vector<produced> recs;
  std::map<std::string, int64_t> counts;
  for (int i = 0; i < 12'000; ++i) {
    auto k = "key-" + std::to_string(i % 9'000);
    recs.push_back({k, "{}"});
    ++counts[k];
  }
  produce(topic, recs);
  auto app = unique_name("slow-restore-app");
  auto client = unique_name("slow-restore-client");
  auto dir = temp_dir("slow-restore");
  const kstate_process::view view{"counts", topic, "json", "", "string", "kind: count"};
  kstate_process a(app, {view}, dir + "/a");
  // Small producer batches: the changelog is many small batches, so the restore takes
  // many fetches, which the quota below spaces out.
  a.extra_args({"--set", "ingest.client_id=" + client, "--set", "kafka.batch.size=4096"});
  a.start();
  a.wait_ready();
  REQUIRE(wait_total(a.port(), "counts", 12'000, std::chrono::seconds(120)) == 12'000);
  REQUIRE(a.terminate() == 0);
  std::filesystem::remove_all(dir + "/a");

  const std::string entity = "--entity-type clients --entity-name " + client + "-restore";
  struct quota_guard {
    std::string entity;
    ~quota_guard() {
      sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka java kafka.admin.ConfigCommand --bootstrap-server " +
         bootstrap() + " --alter --delete-config consumer_byte_rate " + entity + " >/dev/null 2>&1 || true");
    }
  } guard{entity};
  sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka java kafka.admin.ConfigCommand --bootstrap-server " +
     bootstrap() + " --alter --add-config consumer_byte_rate=20000 " + entity + " >/dev/null");
  a.extra_args({"--set", "ingest.client_id=" + client, "--set", "kafka.max.partition.fetch.bytes=4096"});
  a.start();
  auto log_of_a = [&] {
    std::ifstream in(a.log_path());
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  REQUIRE(wait_for([&] { return log_of_a().find("catching up from changelog") != std::string::npos; },
                   std::chrono::seconds(60)));
  // B joins while A restores: the group settles with both, A still restoring.
  kstate_process b(app, {view}, dir + "/b");
  b.start();
  auto stable_with_both = [&] {
    auto c = http_client(b.port()).get("/v1/cluster");
    if (!c || c->status != 200) return false;
    auto j = c->body_json();
    return j["group_state"] == "Stable" && j["instances"].size() == 2;
  };
  const bool settled = wait_for(stable_with_both, std::chrono::seconds(60));
  REQUIRE(settled);
  CHECK_MESSAGE(log_of_a().find("restored 11000 records") == std::string::npos,
                "the group settled only once A's restore had ended");
  CHECK(http_client(a.port()).get("/readyz")->status == 503);

  // Then A finishes, and every count is exact through either instance.
  a.wait_ready(std::chrono::seconds(180));
  std::smatch m;
  const auto log = log_of_a();
  REQUIRE(std::regex_search(log, m, std::regex("into store counts in (\\d+) ms")));
  MESSAGE("the restore took " << m[1] << " ms");
  CHECK(log.find("maximum poll interval") == std::string::npos);
  for (auto* via : {&a, &b}) {
    auto all = read_store(via->port(), "counts");
    CHECK(all.size() == counts.size());
    size_t wrong = 0;
    for (const auto& [k, n] : counts)
      if (all[k] != n) ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE(
    "a topic feeding a table and a count: an instance taking partitions over restores the count and reads the "
    "table's records") {
  // The count restores from its changelog and resumes at its committed offset; the table
  // on the same topic has nothing there yet and must read the partition from its start.
  auto topic = unique_name("restore-mixed");
  create_topic(topic, 4);
  std::vector<produced> recs;
  std::map<std::string, std::string> last;
  std::map<std::string, int64_t> counts;
  for (int i = 0; i < 400; ++i) {
    const auto key = "k-" + std::to_string(i % 100);
    recs.push_back({key, R"({"i":)" + std::to_string(i) + "}"});
    last[key] = recs.back().value.value();
    ++counts[key];
  }
  produce(topic, recs);
  auto app = unique_name("restore-mixed-app");
  std::vector<kstate_process::view> views{{"t", topic}, {"c", topic, "json", "", "string", "kind: count"}};
  // No copies from the first instance: the newcomer restores from the changelog.
  const std::string no_copies = "peer_bootstrap: {enabled: false}\n";
  kstate_process x(app, views, temp_dir("restore-mixed-x") + "/state", no_copies);
  kstate_process y(app, views, temp_dir("restore-mixed-y") + "/state", no_copies);
  x.start();
  x.wait_ready();
  REQUIRE(wait_for([&] { return x.position_sum("t") == 400; }, std::chrono::seconds(60)));
  REQUIRE(wait_total(x.port(), "c", 400, std::chrono::seconds(60)) == 400);
  // The count's offsets are committed with its batches; give the last commit a moment.
  std::this_thread::sleep_for(std::chrono::seconds(1));

  y.start();
  y.wait_ready();
  std::string why;
  REQUIRE_MESSAGE(wait_for(
                      [&] {
                        return group_settled({x.port(), y.port()}, 4, &why);
                      },
                      std::chrono::seconds(90)),
                  why);
  y.wait_ready();
  CHECK(y.metric_sum("kstate_restore_records_total") > 0);
  for (auto* via : {&x, &y}) {
    http_client h(via->port());
    size_t wrong = 0;
    for (const auto& [key, value] : last) {
      auto t = h.get("/v1/stores/t/keys/" + key);
      auto c = h.get("/v1/stores/c/keys/" + key);
      REQUIRE(t);
      REQUIRE(c);
      if (t->status != 200 || t->body_json()["value"] != json::parse(value) || c->status != 200 ||
          c->body_json()["value"] != counts[key]) {
        if (++wrong <= 3) MESSAGE("via " << via->port() << ", " << key << ": " << t->body << " / " << c->body);
      }
    }
    CHECK(wrong == 0);
  }
  CHECK(x.terminate() == 0);
  CHECK(y.terminate() == 0);
}
