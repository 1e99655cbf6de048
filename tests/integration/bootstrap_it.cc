// Bootstrapping from a copy: an instance that takes partitions over without their state
// copies them from the instance that held them (docs/cluster.md#bootstrap), then reads
// from Kafka only what came after the copy. A copy that arrives damaged, or a receiver
// killed in the middle of one, ends in a correct store all the same (rebuilt from Kafka,
// or copied again).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "agg_common.h"
#include "support.h"

using namespace kstate::testing;

namespace {

// A TCP proxy in front of one instance, advertised as that instance's endpoint: what
// the other instances send it reaches the instance, and the snapshot pages it passes
// back can be held for a while or damaged (one byte flipped in the body).
class tampering_proxy {
 public:
  std::atomic<bool> corrupt{false};
  std::atomic<int> delay_ms{0};
  std::atomic<int> pages{0};  // snapshot pages passed back

  // Passes connections on to `target` (set_target() sets it later).
  explicit tampering_proxy(uint16_t target = 0) : target_(target) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    REQUIRE(::listen(listen_fd_, 64) == 0);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~tampering_proxy() {
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    acceptor_.join();
    {
      std::lock_guard lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : threads_) t.join();
    for (int fd : fds_) ::close(fd);
  }
  uint16_t port() const { return port_; }
  void set_target(uint16_t target) { target_ = target; }

 private:
  void accept_loop() {
    for (;;) {
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) return;
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_);
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(s);
        continue;
      }
      std::lock_guard lock(mu_);
      if (stopping_) {
        ::close(c);
        ::close(s);
        return;
      }
      fds_.push_back(c);
      fds_.push_back(s);
      threads_.emplace_back([c, s] { pipe_raw(c, s); });
      threads_.emplace_back([this, c, s] { pipe_responses(s, c); });
    }
  }

  static bool send_all(int fd, const char* p, size_t n) {
    while (n > 0) {
      auto w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  static void pipe_raw(int from, int to) {
    char buf[65536];
    for (;;) {
      auto n = ::recv(from, buf, sizeof buf, 0);
      if (n <= 0 || !send_all(to, buf, static_cast<size_t>(n))) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  // Responses one at a time (Content-Length framing, as every answer between instances
  // has); anything else is passed on untouched.
  void pipe_responses(int from, int to) {
    std::string buf;
    char chunk[65536];
    auto fill = [&]() {
      auto n = ::recv(from, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buf.append(chunk, static_cast<size_t>(n));
      return true;
    };
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos)
        if (!fill()) return (void)::shutdown(to, SHUT_WR);
      std::string head = buf.substr(0, end + 4);
      std::string lower = head;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      auto cl = lower.find("content-length:");
      if (cl == std::string::npos) {  // not framed by length: pass everything on as it comes
        send_all(to, buf.data(), buf.size());
        return pipe_raw(from, to);
      }
      size_t body_len = std::stoul(lower.substr(cl + 15));
      while (buf.size() < end + 4 + body_len)
        if (!fill()) return (void)::shutdown(to, SHUT_WR);
      std::string body = buf.substr(end + 4, body_len);
      buf.erase(0, end + 4 + body_len);
      if (lower.find("application/vnd.kstate.snapshot") != std::string::npos) {
        if (int d = delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
        if (corrupt && body.size() > 16) body[body.size() / 2] = static_cast<char>(body[body.size() / 2] ^ 0x20);
        ++pages;
      }
      if (!send_all(to, head.data(), head.size()) || !send_all(to, body.data(), body.size())) return;
    }
  }

  std::atomic<uint16_t> target_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// What store `s` answers for every key through one instance, page by page.
std::map<std::string, std::string> read_all(uint16_t port) {
  http_client h(port);
  std::map<std::string, std::string> out;
  std::string cursor;
  for (;;) {
    auto a = h.get("/v1/stores/s/keys?limit=1000" + (cursor.empty() ? "" : "&cursor=" + cursor));
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, a->body);
    auto body = a->body_json();
    for (const auto& e : body["data"]) out[e["key"].get<std::string>()] = e["value"].dump();
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

// The model as the API renders it (JSON values, compact).
std::map<std::string, std::string> rendered(const table_model& m) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m) out[k] = json::parse(v).dump();
  return out;
}

std::string log_of(const kstate_process& p) {
  std::ifstream in(p.log_path());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Both instances ready, every partition held once, and every record produced applied.
void settle(kstate_process& a, kstate_process& b, int partitions, int64_t records) {
  std::string why;
  bool ok = false;
  for (int i = 0; i < 1200 && !ok; ++i) {
    ok = group_settled({a.port(), b.port()}, partitions, &why) && a.position_sum("s") + b.position_sum("s") == records;
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(ok, why);
}

std::vector<produced> records_for(int keys, int version, size_t pad) {
  std::vector<produced> out;
  for (int k = 0; k < keys; ++k)
    out.push_back({"key-" + std::to_string(k), R"({"k":)" + std::to_string(k) + R"(,"v":)" + std::to_string(version) +
                                                   R"(,"pad":")" + std::string(pad, 'x') + "\"}"});
  return out;
}

const char* const boot_yaml = "peer_bootstrap: {min_offsets: 1000}\n";

}  // namespace

TEST_CASE("a new instance copies the partitions it takes over from the instance that held them, under writes") {
  const int keys = 40'000;
  auto topic = unique_name("boot");
  create_topic(topic, 4);
  table_model model;
  auto first = records_for(keys, 1, 0);
  auto second = records_for(keys, 2, 0);
  first.insert(first.end(), second.begin(), second.end());
  produce(topic, first);
  for (const auto& r : first) apply_record(model, r);
  int64_t produced_count = static_cast<int64_t>(first.size());

  auto dir = temp_dir("boot");
  auto app = unique_name("boot-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a", boot_yaml);
  kstate_process b(app, {{"s", topic}}, dir + "/b", boot_yaml);
  a.start();
  a.wait_ready();
  for (int i = 0; i < 600 && a.position_sum("s") < produced_count; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a.position_sum("s") == produced_count);

  // Writes go on while B joins and copies: updates of random keys and deletions.
  std::atomic<bool> writing{true};
  std::vector<produced> during;
  std::thread writer([&] {
    std::mt19937 rng(11);
    for (int round = 0; writing || round < 2; ++round) {
      std::vector<produced> batch;
      for (int i = 0; i < 2000; ++i) {
        auto k = "key-" + std::to_string(rng() % keys);
        if (i % 10 == 0) batch.push_back({k, std::nullopt});
        else batch.push_back({k, R"({"round":)" + std::to_string(round) + R"(,"i":)" + std::to_string(i) + "}"});
      }
      produce(topic, batch);
      during.insert(during.end(), batch.begin(), batch.end());
    }
  });
  b.start();
  std::string why;
  bool joined = false;
  for (int i = 0; i < 1200 && !joined; ++i) {
    joined = group_settled({a.port(), b.port()}, 4, &why);
    if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  writing = false;
  writer.join();
  REQUIRE_MESSAGE(joined, why);
  for (const auto& r : during) apply_record(model, r);
  produced_count += static_cast<int64_t>(during.size());
  settle(a, b, 4, produced_count);

  // B's partitions came from copies: it read from Kafka only what followed them, never
  // the 80,000 records written before it started.
  const auto copies = b.metric_sum("kstate_bootstrap_copies_total");
  CHECK(copies >= 1);
  CHECK(log_of(b).find("installed a copy from http://127.0.0.1:" + std::to_string(a.port())) != std::string::npos);
  const double consumed = b.metric_sum("kstate_ingest_records_consumed_total");
  CHECK_MESSAGE(consumed <= static_cast<double>(during.size()), "B consumed " << consumed);
  CHECK(b.metric_sum("kstate_bootstrap_entries_total") > 0);

  // Every answer, through either instance, is the model's.
  const auto want = rendered(model);
  CHECK(read_all(b.port()) == want);
  CHECK(read_all(a.port()) == want);

  // A restart of B resumes from what it holds: nothing is copied again.
  CHECK(b.terminate() == 0);
  b.start();
  settle(a, b, 4, produced_count);
  CHECK(b.metric_sum("kstate_bootstrap_copies_total") == 0);
  CHECK(read_all(b.port()) == want);
}

TEST_CASE("a copy damaged on the way is refused, and the partition is rebuilt from Kafka") {
  const int keys = 20'000;
  auto topic = unique_name("boot-bad");
  create_topic(topic, 2);
  table_model model;
  auto recs = records_for(keys, 1, 40);
  produce(topic, recs);
  for (const auto& r : recs) apply_record(model, r);

  auto dir = temp_dir("boot-bad");
  auto app = unique_name("boot-bad-app");
  // A is reached through the proxy: what B copies from it passes there, damaged.
  tampering_proxy proxy;
  proxy.corrupt = true;
  kstate_process a(
      app, {{"s", topic}}, dir + "/a",
      std::string(boot_yaml) + "advertised_endpoint: http://127.0.0.1:" + std::to_string(proxy.port()) + "\n");
  proxy.set_target(a.port());
  kstate_process b(app, {{"s", topic}}, dir + "/b", boot_yaml);
  a.start();
  a.wait_ready();
  for (int i = 0; i < 600 && a.position_sum("s") < keys; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a.position_sum("s") == keys);
  b.start();
  settle(a, b, 2, keys);

  CHECK(proxy.pages > 0);
  CHECK(b.metric_sum("kstate_bootstrap_entries_total") == 0);
  const auto log = log_of(b);
  CHECK(log.find("rebuilding it from Kafka instead") != std::string::npos);
  CHECK(log.find("installed a copy") == std::string::npos);
  // B read its partitions from Kafka instead: every record of them.
  CHECK(b.metric_sum("kstate_ingest_records_consumed_total") == static_cast<double>(b.position_sum("s")));
  const auto want = rendered(model);
  CHECK(read_all(b.port()) == want);
  CHECK(read_all(a.port()) == want);
}

TEST_CASE("a receiver killed in the middle of a copy ends with a correct store") {
  // Values of 1 KiB: each partition's copy takes several pages, held a while each.
  const int keys = 24'000;
  auto topic = unique_name("boot-kill");
  create_topic(topic, 2);
  table_model model;
  auto recs = records_for(keys, 1, 1000);
  produce(topic, recs);
  for (const auto& r : recs) apply_record(model, r);

  auto dir = temp_dir("boot-kill");
  auto app = unique_name("boot-kill-app");
  tampering_proxy proxy;
  proxy.delay_ms = 1500;
  kstate_process a(
      app, {{"s", topic}}, dir + "/a",
      std::string(boot_yaml) + "advertised_endpoint: http://127.0.0.1:" + std::to_string(proxy.port()) + "\n");
  proxy.set_target(a.port());
  kstate_process b(app, {{"s", topic}}, dir + "/b", boot_yaml);
  a.start();
  a.wait_ready();
  for (int i = 0; i < 600 && a.position_sum("s") < keys; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a.position_sum("s") == keys);
  b.start();
  for (int i = 0; i < 1200 && proxy.pages < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(proxy.pages >= 1);
  b.kill9();
  // What the killed copy left: files of a load that never committed.
  proxy.delay_ms = 0;
  b.start();
  settle(a, b, 2, keys);
  const auto want = rendered(model);
  CHECK(read_all(b.port()) == want);
  CHECK(read_all(a.port()) == want);
  // The restarted receiver copied again (its partitions had no state) and left nothing behind.
  CHECK(log_of(b).find("installed a copy") != std::string::npos);
  CHECK((!std::filesystem::exists(dir + "/b/bootstrap") || std::filesystem::is_empty(dir + "/b/bootstrap")));
}

TEST_CASE("a sender killed in the middle of a copy: the receiver rebuilds from Kafka, nothing is lost") {
  const int keys = 24'000;
  auto topic = unique_name("boot-sender");
  create_topic(topic, 2);
  table_model model;
  auto recs = records_for(keys, 1, 1000);
  produce(topic, recs);
  for (const auto& r : recs) apply_record(model, r);

  auto dir = temp_dir("boot-sender");
  auto app = unique_name("boot-sender-app");
  tampering_proxy proxy;
  proxy.delay_ms = 1500;
  kstate_process a(
      app, {{"s", topic}}, dir + "/a",
      std::string(boot_yaml) + "advertised_endpoint: http://127.0.0.1:" + std::to_string(proxy.port()) + "\n");
  proxy.set_target(a.port());
  kstate_process b(app, {{"s", topic}}, dir + "/b", boot_yaml);
  a.start();
  a.wait_ready();
  for (int i = 0; i < 600 && a.position_sum("s") < keys; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(a.position_sum("s") == keys);
  b.start();
  for (int i = 0; i < 1200 && proxy.pages < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(proxy.pages >= 1);
  a.kill9();
  // B alone, once A's session expired: every partition, rebuilt from Kafka.
  std::string why;
  bool alone = false;
  for (int i = 0; i < 1200 && !alone; ++i) {
    alone = group_settled(std::vector<uint16_t>{b.port()}, 2, &why) && b.position_sum("s") == keys;
    if (!alone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(alone, why);
  CHECK(log_of(b).find("rebuilding it from Kafka instead") != std::string::npos);
  const auto want = rendered(model);
  CHECK(read_all(b.port()) == want);
  // A comes back with what it held: both answer the model.
  a.start();
  settle(a, b, 2, keys);
  CHECK(read_all(a.port()) == want);
  CHECK(read_all(b.port()) == want);
}

TEST_CASE("an aggregate's partitions are copied with their changelog positions: no changelog restore, exact counts") {
  // A count by the record key: the store's partitions are the topic's, two per instance.
  auto topic = unique_name("boot-counts");
  create_topic(topic, 4);
  std::vector<produced> recs;
  std::map<std::string, int64_t> counts;
  std::mt19937 rng(3);
  for (int i = 0; i < 60'000; ++i) {
    auto k = "key-" + std::to_string(rng() % 5'000);
    recs.push_back({k, R"({"i":)" + std::to_string(i) + "}"});
    ++counts[k];
  }
  produce(topic, recs);
  auto dir = temp_dir("boot-agg");
  auto app = unique_name("boot-agg-app");
  const kstate_process::view per_key{"per_key", topic, "json", "", "string", "kind: count"};
  kstate_process a(app, {per_key}, dir + "/a", boot_yaml);
  kstate_process b(app, {per_key}, dir + "/b", boot_yaml);
  a.start();
  a.wait_ready();
  REQUIRE(wait_total(a.port(), "per_key", 60'000, std::chrono::seconds(240)) == 60'000);
  b.start();
  std::string why;
  bool settled = false;
  for (int i = 0; i < 1200 && !settled; ++i) {
    settled = group_settled({a.port(), b.port()}, 4, &why);
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(settled, why);
  const auto log = log_of(b);
  CHECK(log.find("store per_key partition") != std::string::npos);
  CHECK(log.find("installed a copy") != std::string::npos);
  // The copies carry the changelog positions: nothing is restored from the changelog.
  CHECK(b.metric_sum("kstate_restore_records_total") == 0);
  CHECK(log.find("catching up from changelog") == std::string::npos);
  // Every count, read through B (its own partitions and A's), equals the recount.
  auto all = read_store(b.port(), "per_key");
  CHECK(all.size() == counts.size());
  size_t wrong = 0;
  for (const auto& [k, n] : counts)
    if (all[k] != n) ++wrong;
  CHECK(wrong == 0);
}
