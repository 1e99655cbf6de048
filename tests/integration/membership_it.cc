// membership_watcher against the real broker: partition -> owner endpoint comes from
// the consumer group's own description, agrees with what each engine holds and with
// what Kafka's kafka-consumer-groups tool prints, and follows members that leave or die.
//
// Members run in this process (two ingest::engine, each with its own RocksDB), except
// the one killed with SIGKILL, which is this same executable re-run in "member mode"
// (see main()) so that the kill is a real crash: no LeaveGroup, only the session
// timeout tells the coordinator.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/membership.h"
#include "core/ownership.h"
#include "ingest/engine.h"
#include "ingest/membership.h"
#include "storage/db.h"
#include "support.h"

using namespace kstate;
using namespace kstate::testing;
using namespace std::chrono_literals;

namespace {

constexpr int partitions = 6;
const auto session_timeout = 6s;  // session.timeout.ms below
const std::string client_id = "kstate it;\xC3\xBC";

ingest::ingest_config member_config(const std::string& group, const std::string& endpoint) {
  ingest::ingest_config cfg;
  cfg.bootstrap_servers = bootstrap();
  cfg.application_id = group;
  // Characters that encode_member_client_id must escape, to show that the broker keeps
  // the escaped form intact as well.
  cfg.client_id = client_id;
  cfg.advertised_endpoint = endpoint;
  cfg.kafka = {{"session.timeout.ms", "6000"}, {"heartbeat.interval.ms", "1000"}};
  return cfg;
}

// One kstate instance without HTTP: a RocksDB, its ownership registry and an engine.
struct member {
  std::unique_ptr<storage::db> db;
  ownership_registry ownership;
  std::unique_ptr<ingest::engine> engine;
};

std::unique_ptr<member> start_member(const std::string& group, const std::string& topic, const std::string& endpoint,
                                     const std::string& state_dir, std::function<void()> on_rebalance) {
  auto m = std::make_unique<member>();
  storage::db_options opts;
  opts.path = state_dir;
  opts.block_cache_bytes = 8 << 20;
  auto db = storage::db::open(opts, {"t"});
  if (!db.ok()) FAIL("opening RocksDB: " << db.error().to_string());
  m->db = std::move(db.value());
  auto cfg = member_config(group, endpoint);
  cfg.on_rebalance = std::move(on_rebalance);
  view_def v;
  v.name = "t";
  v.topic = topic;
  m->engine = std::make_unique<ingest::engine>(cfg, std::vector<view_def>{v}, *m->db, m->ownership, nullptr);
  auto s = m->engine->start();
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return m;
}

// Partitions of `topic` each owner holds, by endpoint, from a snapshot.
std::map<std::string, std::set<int32_t>> by_endpoint(const cluster_snapshot& s, const std::string& topic) {
  std::map<std::string, std::set<int32_t>> out;
  for (const auto& m : s.members)
    for (const auto& [t, p] : m.partitions)
      if (t == topic) out[m.endpoint].insert(p);
  return out;
}

int claims(const cluster_snapshot& s, const std::string& topic, int32_t partition) {
  int n = 0;
  for (const auto& m : s.members)
    for (const auto& [t, p] : m.partitions) n += t == topic && p == partition;
  return n;
}

// Stable, with `members` members, and every partition of `topic` assigned exactly once.
bool settled(const cluster_snapshot& s, const std::string& topic, size_t members) {
  if (s.group_state != "Stable" || s.members.size() != members) return false;
  for (int32_t p = 0; p < partitions; ++p)
    if (claims(s, topic, p) != 1) return false;
  return true;
}

std::shared_ptr<const cluster_snapshot> wait_for(const membership_registry& r, std::chrono::milliseconds timeout,
                                                 const std::function<bool(const cluster_snapshot&)>& pred) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto s = r.current();
    if (pred(*s) || std::chrono::steady_clock::now() > deadline) return s;
    std::this_thread::sleep_for(50ms);
  }
}

std::set<int32_t> held(const ownership_registry& o, const std::string& topic) {
  std::set<int32_t> out;
  if (auto t = o.topic(topic))
    for (const auto& [p, st] : t->partitions)
      if (st.assigned) out.insert(p);
  return out;
}

bool wait_held(const ownership_registry& o, const std::string& topic, const std::set<int32_t>& expected,
               std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (held(o, topic) != expected) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

std::string describe(const cluster_snapshot& s) {
  std::ostringstream out;
  out << "v" << s.version << " " << s.group_state << ":";
  for (const auto& m : s.members) {
    out << " [" << m.member_id << " endpoint=" << m.endpoint << " parts=";
    for (const auto& [t, p] : m.partitions) out << p << ",";
    out << "]";
  }
  return out.str();
}

// One member row of `kafka-consumer-groups --describe --members --verbose`.
struct tool_member {
  std::string client_id;
  std::string host;
  std::set<std::pair<std::string, int32_t>> partitions;
};

// Parses the tool's member table. Columns are found by their header names (Kafka 4
// adds some); ASSIGNMENT is the last column and is written differently by each line of
// the tool: "topic(0,1,2)" (the older Scala tool), "(0,1,2)" with the topic name
// missing (Kafka 3.9.2, seen here), "topic:0,1,2" (4.x), several topics separated by
// ',' or ';', "-" when empty. An entry without a topic name is reported under
// `default_topic` (the test groups consume a single topic, so that is unambiguous).
std::map<std::string, tool_member> parse_tool_members(const std::string& out, const std::string& default_topic) {
  std::map<std::string, tool_member> members;
  std::map<std::string, size_t> col;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream cols(line);
    std::vector<std::string> f;
    for (std::string w; cols >> w;) f.push_back(w);
    if (f.empty()) continue;
    if (f[0] == "GROUP") {
      for (size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
      for (const char* name : {"CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"})
        REQUIRE_MESSAGE(col.count(name), "no column " << name << " in: " << line);
      REQUIRE_MESSAGE(col["ASSIGNMENT"] == f.size() - 1, line);
      continue;
    }
    if (col.empty()) continue;
    size_t first_assignment = col["ASSIGNMENT"];
    REQUIRE_MESSAGE(f.size() >= first_assignment + 1, line);
    tool_member m;
    m.host = f[col["HOST"]];
    m.client_id = f[col["CLIENT-ID"]];
    std::string a;
    for (size_t i = first_assignment; i < f.size(); ++i) a += f[i];  // "t1(0), t2(1)" had a space
    auto add = [&](std::string topic, const std::string& list) {
      if (topic.empty()) topic = default_topic;
      std::istringstream ps(list);
      for (std::string p; std::getline(ps, p, ',');)
        if (!p.empty()) m.partitions.emplace(topic, std::stoi(p));
    };
    if (a != "-" && a.find('(') != std::string::npos) {
      size_t pos = 0;
      while (pos < a.size()) {
        auto open = a.find('(', pos), close = a.find(')', open);
        REQUIRE_MESSAGE((open != std::string::npos && close != std::string::npos), a);
        add(a.substr(pos, open - pos), a.substr(open + 1, close - open - 1));
        pos = close + 1;
        if (pos < a.size() && (a[pos] == ',' || a[pos] == ';')) ++pos;
      }
    } else if (a != "-" && !a.empty()) {
      // topic:0,1,2[;topic2:3]: a ':' starts a topic's list.
      std::istringstream ts(a);
      for (std::string entry; std::getline(ts, entry, ';');) {
        auto colon = entry.find(':');
        REQUIRE_MESSAGE(colon != std::string::npos, a);
        add(entry.substr(0, colon), entry.substr(colon + 1));
      }
    }
    CHECK(std::stoul(f[col["#PARTITIONS"]]) == m.partitions.size());
    members[f[col["CONSUMER-ID"]]] = std::move(m);
  }
  CHECK_MESSAGE(!col.empty(), out);
  return members;
}

// Member mode: join the group and wait to be killed. Parameters come in the environment.
int run_member_process() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  const auto env = [](const char* k) { return std::string(std::getenv(k)); };
  storage::db_options opts;
  opts.path = env("KSTATE_IT_STATE");
  auto db = storage::db::open(opts, {"t"});
  if (!db.ok()) return 2;
  ownership_registry ownership;
  view_def v;
  v.name = "t";
  v.topic = env("KSTATE_IT_TOPIC");
  auto cfg = member_config(env("KSTATE_IT_GROUP"), env("KSTATE_IT_ENDPOINT"));
  ingest::engine e(cfg, {v}, *db.value(), ownership, nullptr);
  if (!e.start().ok()) return 3;
  for (;;) std::this_thread::sleep_for(1h);
}

pid_t spawn_member(const std::string& group, const std::string& topic, const std::string& endpoint,
                   const std::string& state_dir) {
  std::fflush(nullptr);  // or the child would write the parent's buffered output again
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("KSTATE_IT_MEMBER", "1", 1);
    ::setenv("KSTATE_IT_GROUP", group.c_str(), 1);
    ::setenv("KSTATE_IT_TOPIC", topic.c_str(), 1);
    ::setenv("KSTATE_IT_ENDPOINT", endpoint.c_str(), 1);
    ::setenv("KSTATE_IT_STATE", state_dir.c_str(), 1);
    ::setenv("KSTATE_BOOTSTRAP", bootstrap().c_str(), 1);
    ::execl("/proc/self/exe", "membership_it", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  return pid;
}

}  // namespace

TEST_CASE("two members: each partition has one owner, named by its advertised endpoint, as Kafka's tool says") {
  auto topic = unique_name("members");
  auto group = unique_name("members-app");
  create_topic(topic, partitions);
  // Some records, so the engines have something to apply while the group settles.
  std::vector<produced> recs;
  for (int i = 0; i < 600; ++i) recs.push_back({"k" + std::to_string(i), R"({"i":)" + std::to_string(i) + "}"});
  produce(topic, recs);
  auto dir = temp_dir("membership");

  const std::string ep_a = "http://127.0.0.1:1111", ep_b = "http://127.0.0.1:2222";
  membership_registry registry;
  // A long period: the updates below must come from the rebalance hook (refresh_soon)
  // and the unsettled re-polls, not from the periodic refresh.
  ingest::membership_config mcfg;
  mcfg.refresh_interval = 60s;
  ingest::membership_watcher watcher(member_config(group, ""), mcfg, registry);
  REQUIRE(watcher.start().ok());
  auto hook = [&watcher] { watcher.refresh_soon(); };

  auto a = start_member(group, topic, ep_a, dir + "/a", hook);
  auto s = wait_for(registry, 30s, [&](const cluster_snapshot& x) { return settled(x, topic, 1); });
  REQUIRE_MESSAGE(settled(*s, topic, 1), describe(*s));
  CHECK(by_endpoint(*s, topic) == std::map<std::string, std::set<int32_t>>{{ep_a, {0, 1, 2, 3, 4, 5}}});
  auto one_member_version = s->version;

  auto b = start_member(group, topic, ep_b, dir + "/b", hook);
  s = wait_for(registry, 30s, [&](const cluster_snapshot& x) { return settled(x, topic, 2); });
  REQUIRE_MESSAGE(settled(*s, topic, 2), describe(*s));
  CHECK(s->version > one_member_version);
  CHECK(s->read_at > std::chrono::system_clock::now() - 60s);

  // Every partition has exactly one owner; the owners are exactly the two endpoints,
  // with the cooperative-sticky balance of 3 + 3.
  auto owners = by_endpoint(*s, topic);
  REQUIRE(owners.size() == 2);
  REQUIRE(owners.count(ep_a) == 1);
  REQUIRE(owners.count(ep_b) == 1);
  CHECK(owners[ep_a].size() == 3);
  CHECK(owners[ep_b].size() == 3);
  for (int32_t p = 0; p < partitions; ++p) {
    auto o = s->owner(topic, p);
    REQUIRE(o);
    CHECK(*o == (owners[ep_a].count(p) ? ep_a : ep_b));
  }
  CHECK_FALSE(s->owner(topic, partitions));
  // The coordinator hands back the client.id exactly as the member set it.
  for (const auto& m : s->members) {
    CHECK(m.client_id == ingest::encode_member_client_id(client_id, m.endpoint));
    CHECK(m.client_id.rfind("kstate%20it%3B%C3%BC;endpoint=http://127.0.0.1:", 0) == 0);
    CHECK(m.member_id.rfind(m.client_id + "-", 0) == 0);  // the broker's member id: client id + "-" + uuid
  }

  // Each engine holds what the group description says it holds.
  CHECK_MESSAGE(wait_held(a->ownership, topic, owners[ep_a], 10s), "a holds ", held(a->ownership, topic).size());
  CHECK_MESSAGE(wait_held(b->ownership, topic, owners[ep_b], 10s), "b holds ", held(b->ownership, topic).size());

  // Kafka's own tool describes the same group the same way.
  auto out = kafka("consumer-groups --describe --group " + group + " --members --verbose");
  MESSAGE(out);
  auto tool = parse_tool_members(out, topic);
  auto now = registry.current();
  REQUIRE_MESSAGE(now->version == s->version, describe(*now));  // nothing changed meanwhile
  REQUIRE(tool.size() == s->members.size());
  for (const auto& m : s->members) {
    REQUIRE_MESSAGE(tool.count(m.member_id) == 1, m.member_id);
    const auto& t = tool[m.member_id];
    CHECK(t.client_id == m.client_id);
    CHECK(t.host == m.host);
    CHECK(t.partitions == std::set<std::pair<std::string, int32_t>>(m.partitions.begin(), m.partitions.end()));
  }

  // b leaves (clean shutdown: LeaveGroup). a takes over every partition within the
  // session timeout plus a few seconds, and the snapshot says so.
  auto left_at = std::chrono::steady_clock::now();
  b->engine->stop();
  s = wait_for(registry, session_timeout + 10s, [&](const cluster_snapshot& x) { return settled(x, topic, 1); });
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - left_at);
  REQUIRE_MESSAGE(settled(*s, topic, 1), describe(*s));
  MESSAGE("survivor owned all partitions after " << took.count() << " ms (clean leave)");
  CHECK(by_endpoint(*s, topic) == std::map<std::string, std::set<int32_t>>{{ep_a, {0, 1, 2, 3, 4, 5}}});
  CHECK(wait_held(a->ownership, topic, {0, 1, 2, 3, 4, 5}, 10s));
  CHECK(held(b->ownership, topic).empty());

  a->engine->stop();
  watcher.stop();
  watcher.stop();  // idempotent
  std::filesystem::remove_all(dir);
}

TEST_CASE("a member killed with SIGKILL loses its partitions to the survivor within the session timeout") {
  auto topic = unique_name("members-kill");
  auto group = unique_name("members-kill-app");
  create_topic(topic, partitions);
  auto dir = temp_dir("membership-kill");
  const std::string ep_a = "http://127.0.0.1:1111", ep_b = "http://127.0.0.1:2222";

  membership_registry registry;
  ingest::membership_config mcfg;
  mcfg.refresh_interval = 1s;  // the dead member's departure is noticed by the periodic refresh too
  ingest::membership_watcher watcher(member_config(group, ""), mcfg, registry);
  REQUIRE(watcher.start().ok());
  auto a = start_member(group, topic, ep_a, dir + "/a", [&watcher] { watcher.refresh_soon(); });
  pid_t b = spawn_member(group, topic, ep_b, dir + "/b");

  auto s = wait_for(registry, 60s, [&](const cluster_snapshot& x) { return settled(x, topic, 2); });
  REQUIRE_MESSAGE(settled(*s, topic, 2), describe(*s));
  auto owners = by_endpoint(*s, topic);
  REQUIRE(owners.size() == 2);
  REQUIRE(owners.count(ep_b) == 1);
  CHECK(wait_held(a->ownership, topic, owners[ep_a], 10s));

  REQUIRE(::kill(b, SIGKILL) == 0);
  auto killed_at = std::chrono::steady_clock::now();
  int st = 0;
  REQUIRE(::waitpid(b, &st, 0) == b);
  CHECK(WIFSIGNALED(st));

  // Until the coordinator notices, the dead member still "owns" its partitions: the
  // snapshot never names a wrong owner, it names a dead one (whose endpoint refuses
  // connections, so routing answers 503 rather than anything wrong).
  s = wait_for(registry, session_timeout + 10s, [&](const cluster_snapshot& x) { return settled(x, topic, 1); });
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  REQUIRE_MESSAGE(settled(*s, topic, 1), describe(*s));
  MESSAGE("survivor owned all partitions " << took.count() << " ms after kill -9 (session timeout 6000 ms)");
  CHECK(took <= session_timeout + 10s);
  CHECK(by_endpoint(*s, topic) == std::map<std::string, std::set<int32_t>>{{ep_a, {0, 1, 2, 3, 4, 5}}});
  CHECK(wait_held(a->ownership, topic, {0, 1, 2, 3, 4, 5}, 10s));

  a->engine->stop();
  watcher.stop();
  std::filesystem::remove_all(dir);
}

TEST_CASE("an unreachable broker is retried quietly; stop() is prompt") {
  membership_registry registry;
  auto cfg = member_config(unique_name("nobody"), "");
  cfg.bootstrap_servers = "127.0.0.1:1";  // nothing listens there
  ingest::membership_config mcfg;
  mcfg.refresh_interval = 200ms;
  mcfg.request_timeout = 300ms;
  ingest::membership_watcher watcher(cfg, mcfg, registry);
  REQUIRE(watcher.start().ok());
  std::this_thread::sleep_for(2s);
  auto t0 = std::chrono::steady_clock::now();
  watcher.stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  // Failed, retried at the tick (not in a tight loop), and published nothing made up.
  CHECK(watcher.failed_refreshes() >= 2);
  CHECK(watcher.failed_refreshes() <= 8);
  CHECK(registry.current()->version == 0);
  CHECK(registry.current()->members.empty());
}

TEST_CASE("a bad librdkafka property is named by start()") {
  membership_registry registry;
  auto cfg = member_config("g", "");
  cfg.kafka["no.such.property"] = "1";
  ingest::membership_watcher watcher(cfg, {}, registry);
  auto s = watcher.start();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("no.such.property") != std::string::npos);
}

int main(int argc, char** argv) {
  if (std::getenv("KSTATE_IT_MEMBER")) return run_member_process();
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
