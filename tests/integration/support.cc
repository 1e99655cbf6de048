#include "support.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace kstate::testing {
namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::mt19937_64& rng() {
  static std::mt19937_64 r{std::random_device{}()};
  return r;
}

}  // namespace

std::string bootstrap() {
  if (const char* b = std::getenv("KSTATE_BOOTSTRAP"); b && *b) return b;
  auto out = sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka bootstrap");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string unique_name(const std::string& base) { return base + "-" + std::to_string(rng()() % 1'000'000'000); }

std::string temp_dir(const std::string& base) {
  auto p = std::filesystem::temp_directory_path() / unique_name("kstate-it-" + base);
  std::filesystem::create_directories(p);
  return p.string();
}

std::string sh(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  REQUIRE_MESSAGE(f != nullptr, cmd);
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  int rc = ::pclose(f);
  REQUIRE_MESSAGE(rc == 0, "command failed: " << cmd);
  return out;
}

std::string kafka(const std::string& args) { return sh(std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka " + args); }

void create_topic(const std::string& topic, int partitions) {
  kafka("topics --create --topic " + quote(topic) + " --partitions " + std::to_string(partitions) + " >/dev/null");
}

void produce(const std::string& topic, const std::vector<produced>& records) {
  // A marker no generated key or value uses.
  const std::string null_marker = "__KSTATE_NULL__";
  auto file = std::filesystem::temp_directory_path() / unique_name("kstate-produce");
  {
    std::ofstream out(file, std::ios::binary);
    for (const auto& r : records) {
      out << (r.key ? *r.key : null_marker) << '\t' << (r.value ? *r.value : null_marker) << '\n';
    }
  }
  kafka("console-producer --topic " + quote(topic) +
        " --property parse.key=true --property null.marker=" + null_marker +
        " --producer-property acks=all --producer-property linger.ms=20 --producer-property batch.size=262144 < " +
        quote(file.string()));
  std::filesystem::remove(file);
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

namespace {
std::string bytes_line(const produced& r) {
  return (r.key ? hex(*r.key) : "-") + "\t" + (r.value ? hex(*r.value) : "-") +
         (r.timestamp ? "\t" + std::to_string(*r.timestamp) : std::string()) + "\n";
}
}  // namespace

std::vector<std::pair<int32_t, int64_t>> produce_bytes(const std::string& topic, const std::vector<produced>& records) {
  auto file = std::filesystem::temp_directory_path() / unique_name("kstate-produce-bytes");
  {
    std::ofstream out(file, std::ios::binary);
    for (const auto& r : records) out << bytes_line(r);
  }
  auto out = kafka("produce-bytes --topic " + quote(topic) + " < " + quote(file.string()));
  std::filesystem::remove(file);
  std::vector<std::pair<int32_t, int64_t>> where;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    where.emplace_back(std::stoi(line.substr(0, colon)), std::stoll(line.substr(colon + 1)));
  }
  REQUIRE(where.size() == records.size());
  return where;
}

interactive_producer::interactive_producer(const std::string& topic) {
  int in[2], out[2];
  REQUIRE(::pipe(in) == 0);
  REQUIRE(::pipe(out) == 0);
  auto script = std::string(KSTATE_SOURCE_DIR) + "/scripts/kafka";
  std::fflush(nullptr);  // or the child would write the parent's buffered output again
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    ::execl(script.c_str(), script.c_str(), "produce-bytes", "--topic", topic.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  to_ = in[1];
  from_ = ::fdopen(out[0], "r");
}

interactive_producer::~interactive_producer() {
  if (to_ >= 0) ::close(to_);  // end of input: the producer flushes and exits
  if (from_) std::fclose(from_);
  if (pid_ > 0) {
    int st;
    ::waitpid(pid_, &st, 0);
  }
}

std::pair<int32_t, int64_t> interactive_producer::send(const produced& r) {
  auto line = bytes_line(r);
  REQUIRE(::write(to_, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  char buf[128];
  REQUIRE(std::fgets(buf, sizeof buf, from_) != nullptr);
  std::string s(buf);
  auto colon = s.find(':');
  REQUIRE(colon != std::string::npos);
  return {std::stoi(s.substr(0, colon)), std::stoll(s.substr(colon + 1))};
}

std::vector<consumed> consume_all(const std::string& topic, size_t expected) {
  // The default formatter with these properties prints, tab-separated:
  //   Partition:P  Offset:O  headers (k:v,k:v or NO_HEADERS)  key  value
  auto out = kafka("console-consumer --topic " + quote(topic) + " --from-beginning --max-messages " +
                   std::to_string(expected) +
                   " --timeout-ms 60000 --property print.partition=true --property print.offset=true"
                   " --property print.headers=true --property print.key=true --property null.literal=__KSTATE_NULL__"
                   " 2>/dev/null");
  std::vector<consumed> records;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    size_t start = 0;
    for (;;) {
      auto tab = line.find('\t', start);
      f.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    if (f.size() < 5 || f[0].rfind("Partition:", 0) != 0) continue;
    consumed c;
    c.partition = std::stoi(f[0].substr(10));
    c.offset = std::stoll(f[1].substr(7));
    if (f[2] != "NO_HEADERS") {
      std::istringstream hs(f[2]);
      std::string h;
      while (std::getline(hs, h, ',')) {
        auto colon = h.find(':');
        if (colon != std::string::npos) c.headers[h.substr(0, colon)] = h.substr(colon + 1);
      }
    }
    if (f[3] != "__KSTATE_NULL__") c.key = f[3];
    if (f[4] != "__KSTATE_NULL__") c.value = f[4];
    records.push_back(std::move(c));
  }
  return records;
}

http_answer parse_answer_head(const std::string& head) {
  http_answer a;
  std::istringstream hs(head);
  std::string line;
  std::getline(hs, line);
  a.status = std::stoi(line.substr(9, 3));
  while (std::getline(hs, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    auto value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    a.headers[name] = value;
  }
  return a;
}

http_client::~http_client() { close(); }

bool http_client::connect() {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE_MESSAGE(::inet_pton(AF_INET, host_.c_str(), &a.sin_addr) == 1, "not an IPv4 address: " << host_);
  a.sin_port = htons(port_);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close();
    return false;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{30, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return true;
}

void http_client::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::optional<http_answer> http_client::get(const std::string& target,
                                            const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: " + host_ + "\r\nConnection: keep-alive\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  return raw(req + "\r\n");
}

std::optional<http_answer> http_client::post(const std::string& target, const std::string& content_type,
                                             const std::string& body) {
  return raw("POST " + target + " HTTP/1.1\r\nHost: " + host_ + "\r\nContent-Type: " + content_type +
             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

std::optional<http_answer> http_client::raw(const std::string& req) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (fd_ < 0 && !connect()) return std::nullopt;
    if (::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
      close();
      continue;  // the server closed an idle keep-alive connection: reconnect once
    }
    std::string buf;
    char chunk[65536];
    size_t header_end;
    bool failed = false;
    while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
      auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) {
        failed = true;
        break;
      }
      buf.append(chunk, static_cast<size_t>(n));
    }
    if (failed) {
      close();
      if (buf.empty()) continue;
      return std::nullopt;
    }
    http_answer a = parse_answer_head(buf.substr(0, header_end));
    std::string rest = buf.substr(header_end + 4);
    auto more = [&]() {
      auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      rest.append(chunk, static_cast<size_t>(n));
      return true;
    };
    if (a.headers["transfer-encoding"] == "chunked") {
      // Decode chunks until the terminating zero-size chunk.
      for (;;) {
        size_t eol;
        while ((eol = rest.find("\r\n")) == std::string::npos)
          if (!more()) {
            close();
            return std::nullopt;
          }
        size_t size = std::stoul(rest.substr(0, eol), nullptr, 16);
        while (rest.size() < eol + 2 + size + 2)
          if (!more()) {
            close();
            return std::nullopt;
          }
        a.body += rest.substr(eol + 2, size);
        rest.erase(0, eol + 2 + size + 2);
        if (size == 0) break;
      }
    } else {
      size_t length = a.headers.count("content-length") ? std::stoul(a.headers["content-length"]) : 0;
      while (rest.size() < length)
        if (!more()) {
          close();
          return std::nullopt;
        }
      a.body = rest.substr(0, length);
    }
    if (a.headers["connection"] == "close") close();
    return a;
  }
  return std::nullopt;
}

std::string pct(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

kstate_process::kstate_process(std::string application_id, std::vector<view> views, std::string state_dir,
                               std::string extra_yaml, placement where)
    : state_dir_(std::move(state_dir)), where_(std::move(where)) {
  port_ = free_port();
  // Named after the state directory: instances of one application differ by it.
  config_path_ = state_dir_ + ".yaml";
  log_ = state_dir_ + ".log";
  std::ofstream cfg(config_path_);
  cfg << "application_id: " << application_id << "\n"
      << "bootstrap_servers: " << (where_.bootstrap.empty() ? bootstrap() : where_.bootstrap) << "\n"
      << "state_dir: " << state_dir_ << "\n"
      << "http: {listen: \"" << where_.host << ":" << port_ << "\", threads: 2}\n"
      << "kafka: {session.timeout.ms: \"6000\", heartbeat.interval.ms: \"500\"}\n";
  // An `ingest:` of the caller's replaces this one (a key may appear once).
  if (extra_yaml.rfind("ingest:", 0) != 0 && extra_yaml.find("\ningest:") == std::string::npos)
    cfg << "ingest: {commit_interval_ms: 200}\n";
  cfg << extra_yaml << "views:\n";
  for (const auto& v : views) {
    cfg << "  - {name: " << v.name << ", topic: " << v.topic << ", value_format: " << v.value_format
        << ", key_format: " << v.key_format;
    if (!v.dead_letter_topic.empty()) cfg << ", dead_letter_topic: " << v.dead_letter_topic;
    if (!v.extra.empty()) cfg << ", " << v.extra;
    cfg << "}\n";
  }
}

kstate_process::~kstate_process() {
  if (pid_ > 0) kill9();
}

void kstate_process::start() {
  REQUIRE(pid_ <= 0);
  std::fflush(nullptr);  // or the child would write the parent's buffered output again
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    FILE* f = std::freopen(log_.c_str(), "a", stdout);
    if (f) ::dup2(::fileno(stdout), 2);
    std::vector<const char*> argv;
    if (!where_.netns.empty()) argv = {"/usr/sbin/ip", "netns", "exec", where_.netns.c_str()};
    for (const char* a : {KSTATE_BINARY, "--config", config_path_.c_str()}) argv.push_back(a);
    for (const auto& a : args_) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    ::execv(argv[0], const_cast<char* const*>(argv.data()));
    std::_Exit(127);
  }
}

void kstate_process::wait_ready(std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  http_client c(where_.host, port_);
  for (;;) {
    auto a = c.get("/readyz");
    if (a && a->status == 200) return;
    int st;
    if (pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL("kstate exited before becoming ready; see " << log_);
    }
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "kstate not ready in time; see " << log_);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void kstate_process::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int st;
  ::waitpid(pid_, &st, 0);
  pid_ = -1;
}

int kstate_process::terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int st = 0;
  ::waitpid(pid_, &st, 0);
  pid_ = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int kstate_process::wait_exit(std::chrono::seconds timeout) {
  if (pid_ <= 0) return -1;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (::waitpid(pid_, &st, WNOHANG) != pid_) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill9();
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

double kstate_process::metric_sum(const std::string& name) {
  http_client c(where_.host, port_);
  auto a = c.get("/metrics");
  REQUIRE(a);
  REQUIRE(a->status == 200);
  double sum = 0;
  std::istringstream in(a->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    auto rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

int64_t kstate_process::position_sum(const std::string& store) {
  http_client c(where_.host, port_);
  auto a = c.get("/v1/stores/" + store);
  if (!a || a->status != 200) return -1;
  int64_t sum = 0;
  if (std::getenv("KSTATE_IT_DEBUG")) fprintf(stderr, "GET /v1/stores/%s: %s\n", store.c_str(), a->body.c_str());
  auto body = a->body_json();  // named: a temporary would die before the loop body
  for (const auto& p : body["assigned_partitions"])
    if (!p["position"].is_null()) sum += p["position"].get<int64_t>();
  return sum;
}

bool cluster_settled(uint16_t port, size_t members, int partitions, const std::string& authorization) {
  http_client c(port);
  std::vector<std::pair<std::string, std::string>> headers;
  if (!authorization.empty()) headers.emplace_back("Authorization", authorization);
  auto a = c.get("/v1/cluster", headers);
  if (!a || a->status != 200) return false;
  auto j = a->body_json();
  if (j["group_state"] != "Stable" || j["instances"].size() != members) return false;
  if (partitions >= 0 && j["partitions"].size() != static_cast<size_t>(partitions)) return false;
  for (const auto& inst : j["instances"])
    if (inst["ready"] != true) return false;
  return true;
}

bool group_settled(const std::vector<uint16_t>& ports, int partitions, std::string* why,
                   const std::string& authorization) {
  std::vector<http_address> at;
  for (auto port : ports) at.push_back({"127.0.0.1", port});
  return group_settled(at, partitions, why, authorization);
}

bool group_settled(const std::vector<http_address>& at, int partitions, std::string* why,
                   const std::string& authorization) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (!authorization.empty()) headers.emplace_back("Authorization", authorization);
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  using held_set = std::set<std::pair<std::string, int>>;
  std::map<std::string, held_set> held;  // endpoint -> what it holds, by its /readyz
  std::vector<json> views;
  size_t total = 0;
  for (const auto& [host, port] : at) {
    http_client c(host, port);
    const auto name = host + ":" + std::to_string(port);
    auto ready = c.get("/readyz", headers);  // its partitions are shown to the cluster scope
    if (!ready || ready->status != 200) return no(name + ": /readyz not 200");
    auto cluster = c.get("/v1/cluster", headers);
    if (!cluster || cluster->status != 200) return no(name + ": /v1/cluster not 200");
    auto view = cluster->body_json();
    held_set mine;
    const auto readiness = ready->body_json();  // named: a temporary would die before the loop's body
    for (const auto& p : readiness["partitions"])
      mine.emplace(p["topic"].get<std::string>(), p["partition"].get<int>());
    total += mine.size();
    held[view["served_by"].get<std::string>()] = std::move(mine);
    views.push_back(std::move(view));
  }
  held_set every;
  for (const auto& [endpoint, parts] : held) every.insert(parts.begin(), parts.end());
  if (total != static_cast<size_t>(partitions) || every.size() != total)
    return no(std::to_string(total) + " partitions held (" + std::to_string(every.size()) + " distinct)");
  for (const auto& view : views) {
    if (view["group_state"] != "Stable") return no(view["served_by"].get<std::string>() + ": group not Stable");
    std::map<std::string, held_set> seen;
    for (const auto& inst : view["instances"]) {
      held_set parts;
      for (const auto& p : inst["partitions"]) parts.emplace(p["topic"].get<std::string>(), p["partition"].get<int>());
      seen[inst["endpoint"].get<std::string>()] = std::move(parts);
    }
    if (seen != held)
      return no(view["served_by"].get<std::string>() + " sees other holders: " + view.dump().substr(0, 600));
  }
  return true;
}

void apply_record(table_model& m, const produced& r) {
  if (!r.key) return;
  if (r.value) m[*r.key] = *r.value;
  else m.erase(*r.key);
}

std::string peer_signature(const std::string& secret, const std::string& method, const std::string& target,
                           const std::string& body, int64_t at_ms) {
  auto hex = [](const unsigned char* p, size_t n) {
    std::string out;
    char buf[3];
    for (size_t i = 0; i < n; ++i) {
      std::snprintf(buf, sizeof buf, "%02x", p[i]);
      out += buf;
    }
    return out;
  };
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest);
  const auto now =
      at_ms != 0
          ? at_ms
          : std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
  const std::string msg =
      "v1\n" + std::to_string(now) + "\n" + method + "\n" + target + "\n" + hex(digest, sizeof digest);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), mac, &len);
  return "v1;t=" + std::to_string(now) + ";s=" + hex(mac, len);
}

}  // namespace kstate::testing
