// Restarts with the default configuration: an instance is a static member of its group
// (group.instance.id from the identity kept in its state directory), so after kill -9
// or SIGTERM it takes its partitions back without a rebalance of the others, and a
// state directory copied next to the original gets an identity of its own: the two
// instances never fence each other.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

// The partitions /readyz says this instance holds.
std::set<int> held(uint16_t port) {
  std::set<int> out;
  http_client c(port);
  auto a = c.get("/readyz");
  if (!a || a->status != 200) return out;
  const auto body = a->body_json();  // named: a temporary would die before the loop's body
  for (const auto& p : body["partitions"]) out.insert(p["partition"].get<int>());
  return out;
}

// Every key answers its value through this instance.
bool all_correct(uint16_t port, const table_model& model) {
  http_client c(port);
  for (const auto& [k, v] : model) {
    auto a = c.get("/v1/stores/s/keys/" + k);
    if (!a || a->status != 200 || a->body_json()["value"] != json::parse(v)) return false;
  }
  return true;
}

// The group is stable with these instances and each of them has caught up (/readyz 200).
bool settled(const std::vector<uint16_t>& ports) {
  auto ready = [](uint16_t port) {
    http_client c(port);
    auto a = c.get("/readyz");
    return a && a->status == 200;
  };
  for (int i = 0; i < 600; ++i) {
    if (group_settled(ports, 4) && std::all_of(ports.begin(), ports.end(), ready)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The process has not exited (a zombie counts as exited).
bool alive(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a restarted instance takes its partitions back without rebalancing the others (kill -9, SIGTERM)") {
  const auto topic = unique_name("identity");
  create_topic(topic, 4);
  std::vector<produced> records;
  table_model model;
  for (int i = 0; i < 200; ++i) records.push_back({"k" + std::to_string(i), "{\"n\":" + std::to_string(i) + "}"});
  for (const auto& r : records) apply_record(model, r);
  produce(topic, records);

  const auto dir = temp_dir("identity");
  const auto app = unique_name("identity-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a"), b(app, {{"s", topic}}, dir + "/b");
  a.start();
  b.start();
  REQUIRE(settled({a.port(), b.port()}));
  const auto a_parts = held(a.port()), b_parts = held(b.port());
  REQUIRE(a_parts.size() + b_parts.size() == 4);
  const double b_rebalances = b.metric_sum("kstate_ingest_rebalances_total");

  for (const std::string how : {"kill -9", "SIGTERM"}) {
    CAPTURE(how);
    if (how == "kill -9") a.kill9();
    else CHECK(a.terminate() == 0);
    const auto stopped = std::chrono::steady_clock::now();
    a.start();
    a.wait_ready();
    const double back_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    REQUIRE(settled({a.port(), b.port()}));
    MESSAGE(how << ": the restarted instance answered again " << back_s << " s after its restart began");
    // The same partitions, and the other member was never asked to rebalance.
    CHECK(held(a.port()) == a_parts);
    CHECK(held(b.port()) == b_parts);
    CHECK(b.metric_sum("kstate_ingest_rebalances_total") == b_rebalances);
    CHECK(all_correct(a.port(), model));
    CHECK(all_correct(b.port(), model));
  }
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}

TEST_CASE(
    "with an advertised endpoint, an instance whose state directory was emptied takes its old place in the group") {
  const auto topic = unique_name("identity-empty");
  create_topic(topic, 4);
  std::vector<produced> records;
  table_model model;
  for (int i = 0; i < 200; ++i) records.push_back({"k" + std::to_string(i), "{\"n\":" + std::to_string(i) + "}"});
  for (const auto& r : records) apply_record(model, r);
  produce(topic, records);

  const auto dir = temp_dir("identity-empty");
  const auto app = unique_name("identity-empty-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a"), b(app, {{"s", topic}}, dir + "/b");
  for (auto* p : {&a, &b})
    p->extra_args({"--set", "advertised_endpoint=http://127.0.0.1:" + std::to_string(p->port())});
  a.start();
  b.start();
  REQUIRE(settled({a.port(), b.port()}));
  const auto a_parts = held(a.port()), b_parts = held(b.port());
  const double b_rebalances = b.metric_sum("kstate_ingest_rebalances_total");

  // A lost disk: the state is gone, the instance (same endpoint) comes back. It rebuilds
  // from the topic under its old group.instance.id, so the group does not wait for the
  // old member's session to time out, and the other member keeps its partitions.
  REQUIRE(a.terminate() == 0);
  std::filesystem::remove_all(dir + "/a");
  a.start();
  REQUIRE(settled({a.port(), b.port()}));
  CHECK(held(a.port()) == a_parts);
  CHECK(held(b.port()) == b_parts);
  CHECK(b.metric_sum("kstate_ingest_rebalances_total") == b_rebalances);
  CHECK(all_correct(a.port(), model));
  CHECK(all_correct(b.port(), model));
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}

TEST_CASE("a state directory copied next to the original gets its own identity: both instances run, neither fenced") {
  const auto topic = unique_name("identity-copy");
  create_topic(topic, 4);
  std::vector<produced> records;
  table_model model;
  for (int i = 0; i < 100; ++i) records.push_back({"k" + std::to_string(i), "{\"n\":" + std::to_string(i) + "}"});
  for (const auto& r : records) apply_record(model, r);
  produce(topic, records);

  const auto dir = temp_dir("identity-copy");
  const auto app = unique_name("identity-copy-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a");
  a.start();
  a.wait_ready();
  REQUIRE(all_correct(a.port(), model));
  CHECK(a.terminate() == 0);
  // A copy of a's state, as a new host restored from a backup or a second instance
  // started from the same image would have it.
  std::filesystem::copy(dir + "/a", dir + "/c", std::filesystem::copy_options::recursive);
  kstate_process c(app, {{"s", topic}}, dir + "/c");
  a.start();
  c.start();
  REQUIRE(settled({a.port(), c.port()}));
  CHECK(read_file(c.log_path()).find("was copied or moved") != std::string::npos);
  CHECK(read_file(a.log_path()).find("was copied or moved") == std::string::npos);
  // Both stay members: an instance fenced by another with its group.instance.id would
  // have stopped (exit 1).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  REQUIRE(alive(a.pid()));
  REQUIRE(alive(c.pid()));
  CHECK(held(a.port()).size() + held(c.port()).size() == 4);
  CHECK(all_correct(a.port(), model));
  CHECK(all_correct(c.port(), model));
  CHECK(a.terminate() == 0);
  CHECK(c.terminate() == 0);
}
