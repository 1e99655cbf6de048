// Change subscriptions (GET /v1/stores/{store}/changes): a subscriber follows a prefix
// of a table view over Server-Sent Events while records are produced and one of two
// instances is killed (kill -9) and restarted; it reconnects with Last-Event-ID to
// whichever instance answers. The events received must be exactly the model's changes
// of that prefix (the accepted records, tombstones as deletions, the rejected ones
// not at all), each once, in each partition's order. KSTATE_FAULT_SCALE=long runs it
// with 100,000 records.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "fault_common.h"
#include "sse_client.h"
#include "support.h"

using namespace kstate::testing;

namespace {

struct change_seen {
  std::string key;
  std::optional<json> value;
};

}  // namespace

TEST_CASE("a subscriber follows a prefix through kill -9 and restart of an instance, every change exactly once") {
  const int keys = 400;
  // 12,000 records in the suite; 100,000 with KSTATE_FAULT_SCALE=long (scripts/chaos).
  const int rounds = long_run() ? 40 : 6, per_round = long_run() ? 2500 : 2000;
  auto topic = unique_name("changes");
  create_topic(topic, 4);
  auto dir = temp_dir("changes");
  auto app = unique_name("changes-app");
  kstate_process a(app, {{"t", topic}}, dir + "/a");
  kstate_process b(app, {{"t", topic}}, dir + "/b");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();

  // The model: per partition, the accepted records of the prefix, in offset order.
  std::mutex mu;
  std::map<int32_t, std::map<int64_t, change_seen>> want;
  std::atomic<bool> produced_all{false};
  std::map<int32_t, int64_t> end_offsets;
  std::thread producer([&] {
    std::mt19937 rng(5);
    for (int r = 0; r < rounds; ++r) {
      std::vector<produced> recs;
      for (int i = 0; i < per_round; ++i) {
        const bool user = rng() % 2 == 0;
        produced rec{std::string(user ? "user-" : "item-") + std::to_string(rng() % keys), std::nullopt};
        const auto roll = rng() % 50;
        if (roll == 0) rec.value = "{not json";  // rejected: no change
        else if (roll != 1) rec.value = R"({"r":)" + std::to_string(r) + R"(,"i":)" + std::to_string(i) + "}";
        recs.push_back(std::move(rec));
      }
      auto where = produce_bytes(topic, recs);
      std::lock_guard lock(mu);
      for (size_t i = 0; i < recs.size(); ++i) {
        end_offsets[where[i].first] = std::max(end_offsets[where[i].first], where[i].second + 1);
        if (recs[i].key->rfind("user-", 0) != 0 || (recs[i].value && recs[i].value->rfind("{not", 0) == 0)) continue;
        want[where[i].first][where[i].second] = {
            *recs[i].key, recs[i].value ? std::optional<json>(json::parse(*recs[i].value)) : std::nullopt};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    produced_all = true;
  });

  // The subscriber: from the beginning of the (still empty) topic, through a, then
  // whichever instance answers, resuming after the last event id.
  std::map<int32_t, std::vector<std::pair<int64_t, change_seen>>> got;
  std::string last_id = "0:0,1:0,2:0,3:0";
  int reconnects = 0, killed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<kstate_process*> nodes{&a, &b};
  size_t at = 0;
  auto caught_up = [&] {
    if (!produced_all) return false;
    std::lock_guard lock(mu);
    for (const auto& [p, end] : end_offsets) {
      auto pos = last_id.find(std::to_string(p) + ":");
      if (pos == std::string::npos) return false;
      if (std::stoll(last_id.substr(pos + std::to_string(p).size() + 1)) < end) return false;
    }
    return true;
  };
  // A killed instance comes back 3 s later.
  kstate_process* down = nullptr;
  auto restart_at = std::chrono::steady_clock::now();
  auto restart_due = [&] {
    if (down && std::chrono::steady_clock::now() >= restart_at) {
      down->start();
      down = nullptr;
    }
  };
  while (!caught_up() && std::chrono::steady_clock::now() < deadline) {
    restart_due();
    auto& node = *nodes[at % 2];
    if (!node.running()) {
      ++at;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    // The first connection names its start; the others resume as a browser's
    // EventSource does, with Last-Event-ID.
    const bool first = reconnects++ == 0;
    sse_stream s(node.port(), "/v1/stores/t/changes?prefix=user-" + (first ? "&from_position=" + last_id : ""),
                 first ? "" : last_id);
    int events_here = 0;
    while (s.open() && !caught_up()) {
      restart_due();
      auto e = s.next();
      if (!e) continue;
      REQUIRE_MESSAGE(e->type != "error", e->data.dump());
      if (e->type == "change") {
        const int32_t p = e->data["partition"].get<int32_t>();
        got[p].push_back({e->data["offset"].get<int64_t>(),
                          {e->data["key"].get<std::string>(),
                           e->data["deleted"].get<bool>() ? std::nullopt : std::optional<json>(e->data["value"])}});
        CHECK(e->data["position"] == e->id);
      }
      if (!e->id.empty()) last_id = e->id;
      // Midway, the instance serving the stream is killed, and restarted later.
      if (e->type == "change" && ++events_here == 2000 && killed < 2) {
        ++killed;
        node.kill9();
        MESSAGE("killed the instance serving the subscription after " << events_here << " events");
        down = &node;
        restart_at = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      }
    }
    if (!s.open() && s.status() != 200 && s.status() != 0) MESSAGE("answer " << s.status() << ": " << s.error_body());
    ++at;
  }
  producer.join();
  if (down) down->start();
  REQUIRE_MESSAGE(caught_up(), "the subscription did not reach the end; last id " << last_id);

  // Exactly the model's changes, per partition in offset order, each once.
  size_t total = 0, wrong = 0;
  for (const auto& [p, changes] : want) {
    const auto& seen = got[p];
    total += changes.size();
    if (seen.size() != changes.size()) {
      MESSAGE("partition " << p << ": " << seen.size() << " events, " << changes.size() << " changes");
      ++wrong;
      continue;
    }
    size_t i = 0;
    for (const auto& [offset, c] : changes) {
      const auto& [o, s] = seen[i++];
      if (o != offset || s.key != c.key || s.value != c.value) ++wrong;
    }
  }
  MESSAGE(total << " changes of the prefix, " << reconnects << " connections, " << killed << " kills");
  CHECK(wrong == 0);
  CHECK(killed >= 1);
  for (auto* n : nodes)
    if (n->running()) CHECK(n->terminate() == 0);
}

TEST_CASE("chosen keys as NDJSON, and the refusals: history gone, positions, media") {
  auto topic = unique_name("changes-keys");
  create_topic(topic, 2);
  std::vector<produced> recs;
  // Record timestamps set by the producer: each event must carry its record's.
  const int64_t t0 = 1'700'000'000'000;
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 20; ++k)
      recs.push_back({"k" + std::to_string(k), R"({"round":)" + std::to_string(round) + "}",
                      t0 + static_cast<int64_t>(recs.size())});
  recs.push_back({"k5", std::nullopt, t0 + static_cast<int64_t>(recs.size())});  // a deletion
  auto where = produce_bytes(topic, recs);
  std::map<std::pair<int32_t, int64_t>, int64_t> timestamp_at;
  for (size_t i = 0; i < recs.size(); ++i) timestamp_at[where[i]] = *recs[i].timestamp;
  std::map<int32_t, int64_t> ends;
  std::map<int32_t, std::vector<std::pair<int64_t, std::string>>> want;  // (offset, key) of k3, k5, k7
  for (size_t i = 0; i < recs.size(); ++i) {
    ends[where[i].first] = std::max(ends[where[i].first], where[i].second + 1);
    if (*recs[i].key == "k3" || *recs[i].key == "k5" || *recs[i].key == "k7")
      want[where[i].first].push_back({where[i].second, *recs[i].key});
  }
  auto dir = temp_dir("changes-keys");
  kstate_process ks(unique_name("changes-keys-app"), {{"t", topic}}, dir);
  ks.start();
  ks.wait_ready();

  // k3, k5 and k7 from the beginning, as NDJSON: their changes in each partition's
  // order, the deletion as one, and then nothing but where the feed is.
  // The stream never ends by itself: read it raw, with a deadline.
  const int fd = [&] {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(ks.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    timeval tv{1, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return s;
  }();
  const std::string req =
      "GET /v1/stores/t/changes?key=k3&keys=k5,k7&from_position=0:0,1:0 HTTP/1.1\r\nHost: x\r\nAccept: "
      "application/x-ndjson\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  std::string raw;
  std::vector<json> lines;
  bool quiet = false;  // a "position" line came after the changes
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!quiet && std::chrono::steady_clock::now() < deadline) {
    char buf[8192];
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) raw.append(buf, static_cast<size_t>(n));
    // Lines of JSON in the chunked body: every "{...}\n" between the chunk framing.
    lines.clear();
    for (size_t at = raw.find("{\"type\""); at != std::string::npos; at = raw.find("{\"type\"", at + 1)) {
      auto eol = raw.find('\n', at);
      if (eol == std::string::npos) break;
      lines.push_back(json::parse(raw.substr(at, eol - at)));
    }
    for (const auto& l : lines) quiet = quiet || l["type"] == "position";
  }
  // The subscription is counted while it streams, and no longer once it is closed (the
  // server notices when the connection closes).
  CHECK(ks.metric_sum("kstate_query_open_subscriptions") == 1);
  ::close(fd);
  for (int i = 0; i < 150 && ks.metric_sum("kstate_query_open_subscriptions") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(ks.metric_sum("kstate_query_open_subscriptions") == 0);
  CHECK(raw.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(raw.find("application/x-ndjson") != std::string::npos);
  REQUIRE(quiet);
  REQUIRE(!lines.empty());
  CHECK(lines.front()["type"] == "start");
  // The partitions of the keys, from their beginning.
  std::string start;
  for (const auto& [p, changes] : want) start += (start.empty() ? "" : ",") + std::to_string(p) + ":0";
  CHECK(lines.front()["position"] == start);
  std::map<int32_t, std::vector<std::pair<int64_t, std::string>>> got;
  for (const auto& l : lines) {
    if (l["type"] == "change") {
      got[l["partition"].get<int32_t>()].push_back({l["offset"].get<int64_t>(), l["key"].get<std::string>()});
      CHECK(l["deleted"] == (l["value"].is_null()));
      CHECK(l["timestamp"] == timestamp_at[{l["partition"].get<int32_t>(), l["offset"].get<int64_t>()}]);
    }
    if (l["type"] == "position") {
      // Every record of the keys' partitions was read by then.
      auto pos = l["position"].get<std::string>();
      for (const auto& [p, end] : ends)
        if (want.count(p)) CHECK(pos.find(std::to_string(p) + ":" + std::to_string(end)) != std::string::npos);
    }
  }
  CHECK(got == want);

  // Refusals, each a problem+json.
  http_client c(ks.port());
  auto problem_code = [&](const std::string& target, const std::vector<std::pair<std::string, std::string>>& h) {
    auto a = c.get(target, h);
    REQUIRE(a);
    CHECK(a->headers["content-type"] == "application/problem+json");
    return std::make_pair(a->status, a->body_json().value("error_code", 0));
  };
  CHECK(problem_code("/v1/stores/t/changes?from_position=0:0", {}) ==
        std::make_pair(400, 40006));  // partition 1 missing
  CHECK(problem_code("/v1/stores/t/changes?from_position=0:0,1:99999", {}) ==
        std::make_pair(400, 40006));  // past the end
  CHECK(problem_code("/v1/stores/t/changes?from_position=x", {}) == std::make_pair(400, 40006));
  CHECK(problem_code("/v1/stores/t/changes?key=k1&prefix=k", {}) == std::make_pair(400, 40001));
  CHECK(problem_code("/v1/stores/t/changes", {{"Accept", "application/json"}}) == std::make_pair(406, 40601));
  CHECK(problem_code("/v1/stores/nope/changes", {}) == std::make_pair(404, 40401));
  // The first records of partition 0 deleted from the topic: a subscription from before
  // them is told its history is gone (410), never moved ahead silently.
  const auto offsets = dir + "/delete.json";
  std::ofstream(offsets) << R"({"version":1,"partitions":[{"topic":")" << topic << R"(","partition":0,"offset":3}]})";
  kafka("java org.apache.kafka.tools.DeleteRecordsCommand --bootstrap-server " + bootstrap() + " --offset-json-file " +
        offsets + " >/dev/null");
  CHECK(problem_code("/v1/stores/t/changes?from_position=0:0,1:0", {}) == std::make_pair(410, 41001));
  CHECK(problem_code("/v1/stores/t/changes?from_position=0:2,1:0", {}) == std::make_pair(410, 41001));
  // With snapshot=true the same position begins with a snapshot instead: every key's
  // current value (k5 was deleted last), then the start.
  sse_stream snap(ks.port(), "/v1/stores/t/changes?from_position=0:0,1:0&snapshot=true", "");
  std::map<std::string, json> current;
  bool started = false;
  for (int i = 0; i < 60 && !started; ++i)
    if (auto e = snap.next()) {
      if (e->type == "snapshot") current[e->data["key"].get<std::string>()] = e->data["value"];
      started = e->type == "start";
    }
  CHECK(started);
  std::map<std::string, json> model;
  for (const auto& r : recs) {
    if (r.value) model[*r.key] = json::parse(*r.value);
    else model.erase(*r.key);
  }
  CHECK(current == model);
  CHECK(ks.terminate() == 0);
}
