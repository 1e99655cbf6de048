// Operations against the real broker: metrics equal known counts and parse as
// Prometheus text; SIGTERM under load cuts off no request and costs no re-read.
//
// The SIGTERM clients behave like a load balancer: they send until a response tells
// them to reconnect (Connection: close, sent by every response once draining starts),
// then ask /readyz, and stop sending to this instance when it answers 503. Every
// request they send must get a complete answer.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

// A strict reader of the Prometheus text exposition format (version 0.0.4): every
// sample belongs to a family declared by # TYPE before it, names and labels are
// well-formed, label values properly escaped, values parse as floats, histogram
// buckets are cumulative and end with +Inf equal to _count. Returns the problems found.
std::vector<std::string> check_exposition(const std::string& text,
                                          std::map<std::string, std::vector<std::pair<std::string, double>>>& samples) {
  std::vector<std::string> problems;
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*",?)*)\})? ([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))( -?[0-9]+)?$)");
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (line.empty()) continue;
    if (line.rfind("# HELP", 0) == 0) {
      if (!std::regex_match(line, m, help)) problems.push_back("bad HELP line " + std::to_string(n));
      continue;
    }
    if (line.rfind("# TYPE", 0) == 0) {
      if (!std::regex_match(line, m, type)) problems.push_back("bad TYPE line " + std::to_string(n) + ": " + line);
      else if (!types.emplace(m[1], m[2]).second) problems.push_back("family declared twice: " + m[1].str());
      continue;
    }
    if (line[0] == '#') continue;
    if (!std::regex_match(line, m, sample)) {
      problems.push_back("bad sample line " + std::to_string(n) + ": " + line);
      continue;
    }
    std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!types.count(family) && family.size() > strlen(suffix) &&
          family.compare(family.size() - strlen(suffix), std::string::npos, suffix) == 0)
        family = family.substr(0, family.size() - strlen(suffix));
    if (!types.count(family)) problems.push_back("sample without TYPE: " + name);
    double v = m[4] == "Inf" || m[4] == "+Inf" ? INFINITY : std::stod(m[4]);
    samples[name].push_back({m[3], v});
  }
  // Histograms: cumulative buckets ending in +Inf == _count, per label set.
  for (const auto& [fam, t] : types) {
    if (t != "histogram") continue;
    std::map<std::string, std::vector<std::pair<std::string, double>>> by_series;
    for (const auto& [labels, v] : samples[fam + "_bucket"]) {
      auto le = labels.find("le=\"");
      std::string rest = labels.substr(0, le) + labels.substr(labels.find('"', le + 4) + 1);
      by_series[rest].push_back({labels.substr(le + 4, labels.find('"', le + 4) - le - 4), v});
    }
    for (const auto& [series, buckets] : by_series) {
      for (size_t i = 1; i < buckets.size(); ++i)
        if (buckets[i].second < buckets[i - 1].second) problems.push_back("non-cumulative buckets in " + fam);
      if (buckets.empty() || buckets.back().first != "+Inf") problems.push_back("no +Inf bucket in " + fam);
    }
  }
  return problems;
}

double sum_of(const std::map<std::string, std::vector<std::pair<std::string, double>>>& s, const std::string& name,
              const std::string& label_filter = {}) {
  double total = 0;
  auto it = s.find(name);
  if (it == s.end()) return 0;
  for (const auto& [labels, v] : it->second)
    if (label_filter.empty() || labels.find(label_filter) != std::string::npos) total += v;
  return total;
}

}  // namespace

TEST_CASE("metrics after a known ingest equal the known counts, lag reaches 0, and the text is well-formed") {
  auto topic = unique_name("ops");
  create_topic(topic, 3);
  std::vector<produced> recs;
  size_t invalid = 0;
  for (int i = 0; i < 5000; ++i) {
    produced r{"k" + std::to_string(i % 700), R"({"i":)" + std::to_string(i) + "}"};
    if (i % 250 == 3) {
      r.value = "not json";
      ++invalid;
    }
    recs.push_back(r);
  }
  produce(topic, recs);
  auto dir = temp_dir("ops");
  auto app_id = unique_name("ops-app");
  kstate_process ks(app_id, {{"s", topic}}, dir + "/state");
  ks.start();
  ks.wait_ready();
  http_client c(ks.port());
  for (int i = 0; i < 50; ++i) REQUIRE(c.get("/v1/stores/s/keys/k" + std::to_string(i)));

  std::map<std::string, std::vector<std::pair<std::string, double>>> s;
  std::vector<std::string> problems;
  for (int attempt = 0; attempt < 40; ++attempt) {  // lag is published about once a second
    auto m = c.get("/metrics");
    REQUIRE(m);
    REQUIRE(m->status == 200);
    CHECK(m->headers["content-type"].rfind("text/plain; version=0.0.4", 0) == 0);
    s.clear();
    problems = check_exposition(m->body, s);
    if (s.count("kstate_consumergroup_lag") && s["kstate_consumergroup_lag"].size() == 3 &&
        sum_of(s, "kstate_consumergroup_lag") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  for (const auto& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
  CHECK(sum_of(s, "kstate_ingest_records_consumed_total") == recs.size());
  CHECK(sum_of(s, "kstate_ingest_records_applied_total", "store=\"s\"") == recs.size() - invalid);
  CHECK(sum_of(s, "kstate_ingest_records_invalid_total", "store=\"s\"") == invalid);
  CHECK(sum_of(s, "kstate_consumergroup_lag", "consumergroup=\"" + app_id + "\"") == 0);
  CHECK(s["kstate_consumergroup_lag"].size() == 3);
  CHECK(sum_of(s, "kstate_partition_position") == recs.size());
  CHECK(sum_of(s, "kstate_partition_ready") == 3);
  CHECK(sum_of(s, "kstate_rocksdb_estimate_num_keys", "store=\"s\"") > 0);
  CHECK(sum_of(s, "kstate_rocksdb_block_cache_capacity_bytes") == 64.0 * 1024 * 1024);
  CHECK(sum_of(s, "kstate_build_info") == 1);
  CHECK(sum_of(s, "kstate_ingest_rebalances_total") >= 1);
  CHECK(sum_of(s, "kstate_http_request_duration_seconds_count", "route=\"/v1/stores/{store}/keys/{key}\"") >= 50);
  CHECK(sum_of(s, "kstate_http_open_connections") >= 1);
  CHECK(ks.terminate() == 0);
}

TEST_CASE("SIGTERM under load: no request is cut off, exit 0, and the restart reads nothing again") {
  auto topic = unique_name("term");
  create_topic(topic, 3);
  std::vector<produced> recs;
  for (int i = 0; i < 20000; ++i)
    recs.push_back({"k" + std::to_string(i % 1000), R"({"i":)" + std::to_string(i) + "}"});
  produce(topic, recs);
  auto dir = temp_dir("term");
  // A drain delay lets keep-alive clients move away while /readyz says 503.
  kstate_process ks(unique_name("term-app"), {{"s", topic}}, dir + "/state");
  ks.extra_args({"--set", "http.drain_delay_ms=700"});
  ks.start();
  ks.wait_ready();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, refused{0}, cut{0}, drained{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      int fd = -1;
      int i = 0;
      while (!stop) {
        if (fd < 0) {
          fd = ::socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          a.sin_port = htons(ks.port());
          if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(fd);
            fd = -1;
            ++refused;  // the listener is closed: a clean "no", never a half answer
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
          }
        }
        std::string req =
            "GET /v1/stores/s/keys/k" + std::to_string((t * 131 + i++) % 1000) + " HTTP/1.1\r\nHost: x\r\n\r\n";
        if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
          ++cut;
          ::close(fd);
          fd = -1;
          continue;
        }
        std::string buf;
        char chunk[8192];
        size_t need = std::string::npos;
        bool closed_after = false;
        for (;;) {
          auto n = ::recv(fd, chunk, sizeof chunk, 0);
          if (n <= 0) break;
          buf.append(chunk, static_cast<size_t>(n));
          auto end = buf.find("\r\n\r\n");
          if (end != std::string::npos && need == std::string::npos) {
            auto cl = buf.find("Content-Length: ");
            need = end + 4 + std::stoul(buf.substr(cl + 16));
            closed_after = buf.find("Connection: close") != std::string::npos;
          }
          if (need != std::string::npos && buf.size() >= need) break;
        }
        if (need == std::string::npos || buf.size() < need) {
          ++cut;  // sent a request, got no complete answer: what must never happen
          ::close(fd);
          fd = -1;
          continue;
        }
        ++ok;
        if (closed_after) {
          // Told to reconnect: like a load balancer, ask /readyz before sending more
          // here, and go elsewhere (stop) once it says 503 or nobody answers.
          ++drained;
          ::close(fd);
          fd = -1;
          http_client probe(ks.port());
          auto r = probe.get("/readyz");
          if (!r || r->status != 200) break;
        }
      }
      if (fd >= 0) ::close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int before = ok;
  ::kill(ks.pid(), SIGTERM);
  int rc = ks.terminate();  // waits for the exit
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& c : clients) c.join();
  MESSAGE(before << " answers before SIGTERM, " << ok.load() << " in all; " << drained.load() << " told to reconnect; "
                 << refused.load() << " refused connects; " << cut.load() << " cut off");
  CHECK(rc == 0);
  CHECK(before > 100);
  CHECK(cut == 0);

  ks.start();
  ks.wait_ready();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(ks.metric_sum("kstate_ingest_records_consumed_total") == 0);
  CHECK(ks.position_sum("s") == static_cast<int64_t>(recs.size()));
  CHECK(ks.terminate() == 0);
}
