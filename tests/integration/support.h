#pragma once
// Test support for integration tests against the real broker that scripts/kafka
// started (KSTATE_BOOTSTRAP) and the real kstate binary.
//
// Everything here drives real processes: the Java console producer and consumer
// (through scripts/kafka), and kstate itself, over HTTP on loopback.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kstate::testing {

using json = nlohmann::json;

// Bootstrap address of the test broker (KSTATE_BOOTSTRAP, else `scripts/kafka bootstrap`).
std::string bootstrap();
// A name unique to this test run, e.g. "<base>-<random>".
std::string unique_name(const std::string& base);
// A fresh empty directory under the system temp dir.
std::string temp_dir(const std::string& base);

// Runs a shell command; returns its stdout. Fails the test on a non-zero exit.
std::string sh(const std::string& cmd);
// scripts/kafka with arguments (quoted by the caller).
std::string kafka(const std::string& args);
void create_topic(const std::string& topic, int partitions);

// One record for the console producer. A nullopt key/value becomes the null marker.
struct produced {
  std::optional<std::string> key;
  std::optional<std::string> value;
  // Record timestamp, ms (produce_bytes only); nullopt: the producer's clock.
  std::optional<int64_t> timestamp;
};
// Produces with the real Java console producer (partitioning by the Java client's
// default partitioner), in order. Keys and values must not contain tabs or newlines.
void produce(const std::string& topic, const std::vector<produced>& records);

// Produces arbitrary bytes with the real Java client (default partitioner) and
// returns each record's (partition, offset), in order.
std::vector<std::pair<int32_t, int64_t>> produce_bytes(const std::string& topic, const std::vector<produced>& records);

// A long-lived Java producer: send() returns once the record is acknowledged.
class interactive_producer {
 public:
  explicit interactive_producer(const std::string& topic);
  ~interactive_producer();
  std::pair<int32_t, int64_t> send(const produced& r);

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

std::string hex(std::string_view bytes);

// A record read back with the Java console consumer.
struct consumed {
  int32_t partition;
  int64_t offset;
  std::map<std::string, std::string> headers;
  std::optional<std::string> key;
  std::optional<std::string> value;
};
std::vector<consumed> consume_all(const std::string& topic, size_t expected);

// An instance's HTTP address: host (an IPv4 address) and port.
struct http_address {
  std::string host;
  uint16_t port;
};

// A minimal HTTP/1.1 client with one keep-alive connection.
struct http_answer {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;
  json body_json() const { return json::parse(body); }
};
// The status line and headers of an answer (without the blank line ending them).
http_answer parse_answer_head(const std::string& head);

class http_client {
 public:
  explicit http_client(uint16_t port) : port_(port) {}
  // An instance on another host (an IPv4 address, e.g. in a network namespace).
  http_client(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}
  ~http_client();
  // nullopt when the connection failed (server down).
  std::optional<http_answer> get(const std::string& target,
                                 const std::vector<std::pair<std::string, std::string>>& headers = {});
  std::optional<http_answer> post(const std::string& target, const std::string& content_type, const std::string& body);
  // Sends raw bytes and reads one response.
  std::optional<http_answer> raw(const std::string& request);

 private:
  bool connect();
  void close();
  std::string host_ = "127.0.0.1";
  uint16_t port_;
  int fd_ = -1;
};

// The X-Kstate-Peer value another instance of a group would send with a request:
// "v1;t=<unix ms>;s=<hex HMAC-SHA256(secret, "v1\n<t>\n<method>\n<target>\n<hex
// SHA-256(body)>")>", the signature scheme of server/src/api/peer_auth.h, written out
// here on its own so the test checks the server against the documented scheme.
// Signed at `at_ms` (unix ms), or now when 0.
std::string peer_signature(const std::string& secret, const std::string& method, const std::string& target,
                           const std::string& body, int64_t at_ms = 0);

// Percent-encodes every byte outside the unreserved set (RFC 3986).
std::string pct(const std::string& s);

// Where a kstate_process runs: by default on loopback against the test broker. In a
// network namespace (network-partition tests), it listens on `host` (an address of the
// namespace, which is then its advertised endpoint too) and is started under
// `ip netns exec <netns>`, which execs kstate: pid() is kstate's own.
struct process_placement {
  std::string netns;               // empty: the caller's namespace
  std::string host = "127.0.0.1";  // listen address
  std::string bootstrap;           // empty: bootstrap()
};

// A kstate process with its own config, state directory and log.
class kstate_process {
 public:
  struct view {
    std::string name;
    std::string topic;
    std::string value_format = "json";
    std::string dead_letter_topic;
    std::string key_format = "string";
    // More keys of the view's flow mapping, e.g. "kind: count, group_by: words".
    std::string extra;
  };
  using placement = process_placement;
  // `extra_yaml` is appended to the generated config (top-level keys); an `ingest:` map
  // in it replaces the default one (`commit_interval_ms: 200`).
  kstate_process(std::string application_id, std::vector<view> views, std::string state_dir,
                 std::string extra_yaml = {}, placement where = {});
  ~kstate_process();

  void start();
  // Waits until /readyz answers 200. Fails the test after `timeout`.
  void wait_ready(std::chrono::seconds timeout = std::chrono::seconds(120));
  void kill9();
  // SIGTERM and wait; returns the exit status.
  int terminate();
  // Waits (at most `timeout`) for the process to exit on its own; returns its exit
  // status, or -1 when it was still running (it is then killed).
  int wait_exit(std::chrono::seconds timeout = std::chrono::seconds(60));
  bool running() const { return pid_ > 0; }
  uint16_t port() const { return port_; }
  const std::string& host() const { return where_.host; }
  // The URL other instances forward to (its default advertised endpoint).
  std::string endpoint() const { return "http://" + where_.host + ":" + std::to_string(port_); }
  // Extra command-line arguments for the next start().
  void extra_args(std::vector<std::string> args) { args_ = std::move(args); }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }

  // Sum of kstate_ingest_records_consumed_total over every series.
  double metric_sum(const std::string& name);
  // Sum of the stored positions of a store's assigned partitions (= records applied
  // when the topic's offsets start at 0 and have no gaps).
  int64_t position_sum(const std::string& store);

 private:
  std::string config_path_, state_dir_, log_;
  placement where_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
  std::vector<std::string> args_;
};

// True when /v1/cluster on `port` reports a Stable group of `members` instances, each
// ready, owning `partitions` partitions in all (any number when negative).
// `authorization` is sent as the Authorization header when not empty.
bool cluster_settled(uint16_t port, size_t members, int partitions = -1, const std::string& authorization = {});
// Settled as every instance sees it: each one ready (/readyz), `partitions` partitions
// held once each across them, and every instance's /v1/cluster naming exactly those
// holders in a Stable group. Ready alone is not enough: an instance that holds nothing
// yet is ready, and one instance's view of the group can lag a rebalance.
// `why`, when given, says what is not settled yet.
// `authorization` is sent as the Authorization header of /v1/cluster when not empty.
bool group_settled(const std::vector<uint16_t>& ports, int partitions, std::string* why = nullptr,
                   const std::string& authorization = {});
bool group_settled(const std::vector<http_address>& at, int partitions, std::string* why = nullptr,
                   const std::string& authorization = {});

// Model of a table view: last write wins, a tombstone deletes.
using table_model = std::map<std::string, std::string>;
void apply_record(table_model& m, const produced& r);

}  // namespace kstate::testing
