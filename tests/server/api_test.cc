// The REST API without a broker: real RocksDB stores, ownership and membership
// registries set by hand, and for the cases between instances real HTTP servers and
// clients on loopback. Every expectation comes from the data the test wrote. Over 700
// lines: every case uses the `node` fixture below, which would otherwise move to a
// header of its own for this one program.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include <xxhash.h>

#include "core/value_codec.h"
#include "core/window.h"
#include "http/client.h"
#include "http/server.h"
#include "http/url.h"
#include "ingest/partitioner.h"
#include "query/engine.h"
#include "query/freshness.h"
#include "query/key_format.h"
#include "api/peer_auth.h"
#include "bootstrap.h"
#include "snapshots.h"
#include "server/api.h"
#include "server/auth.h"
#include "storage/db.h"

using namespace kstate;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int32_t partitions = 4;
const std::string topic = "t";

int32_t partition_of(std::string_view key) { return (*ingest::make_partitioner("murmur2"))(key, partitions); }

std::string temp_dir() {
  static std::atomic<int> n{0};
  auto d = fs::temp_directory_path() / ("kstate-api-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

struct answer {
  unsigned status = 0;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::thread::id thread;  // where the answer was given
  std::shared_ptr<http::body_source> stream;

  json body_json() const { return json::parse(body); }
  std::optional<std::string> header(const std::string& name) const {
    for (const auto& [n, v] : headers)
      if (n == name) return v;
    return std::nullopt;
  }
  // The whole streamed body.
  std::string drain() {
    std::string out;
    for (bool more = true; more;) {
      std::promise<http::body_source::piece> p;
      stream->next([&p](http::body_source::piece piece) { p.set_value(std::move(piece)); });
      auto piece = p.get_future().get();
      REQUIRE_FALSE(piece.failed);
      out += piece.data;
      more = piece.more;
    }
    return out;
  }
};

// One instance: a store "s" of topic "t" (4 partitions, string keys, JSON values) and a
// windowed count "w" of the same topic (tumbling windows of 1 s) in RocksDB, the
// partitions it holds, its API.
struct node {
  // A node holding `held` (caught up). Adjust ctx, then build() (or serve()).
  explicit node(std::vector<int32_t> held = {0, 1, 2, 3}, query::freshness_config waits = {}) {
    view_def v;
    v.name = "s";
    v.topic = topic;
    views.push_back(v);
    view_def w;
    w.name = "w";
    w.topic = topic;
    w.kind = view_kind::count;
    window_spec spec;
    spec.size_ms = 1000;
    REQUIRE(normalize(spec).ok());
    w.window = spec;
    views.push_back(w);
    storage::db_options opts;
    opts.path = dir + "/db";
    auto opened = storage::db::open(opts, {"s", "w"});
    REQUIRE(opened.ok());
    db = std::move(opened.value());
    ownership.set_partition_count(topic, partitions);
    std::vector<ownership_registry::assignment> a;
    for (int32_t p : held) a.push_back({topic, p, 0, true, 0});
    ownership.assign(a);
    ownership.mark_joined();
    queries = std::make_unique<query::engine>(
        views, *db, ownership,
        std::map<std::string, partitioner_fn>{{"s", *ingest::make_partitioner("murmur2")},
                                              {"w", *ingest::make_partitioner("murmur2")}});
    waiter = std::make_unique<query::freshness_waiter>(*queries, notifier, waits);
    ctx.queries = queries.get();
    ctx.waiter = waiter.get();
    ctx.ownership = &ownership;
    ctx.metrics = metrics.get();
    ctx.instance = "http://127.0.0.1:1";
    ctx.group = "g";
  }
  ~node() {
    if (http_server) http_server->stop();
    waiter->shutdown();
  }

  // Makes the API from ctx.
  void build() { handler = server::make_api_handler(ctx); }
  // Serves the API over HTTP on a free loopback port (its advertised endpoint), with a
  // client to reach other instances and the group's secret; then build().
  void serve(const std::string& group_secret) {
    http::server_config cfg;
    cfg.port = 0;
    http_server = std::make_unique<http::server>(
        cfg, [this](const http::request& r, http::responder reply) { handler(r, std::move(reply)); });
    REQUIRE(http_server->start().ok());
    ctx.instance = "http://127.0.0.1:" + std::to_string(http_server->port());
    peers = std::make_unique<http::client>(http::client_config{});
    secret->set(group_secret);
    ctx.secret = secret;
    ctx.peers = peers.get();
    ctx.membership = &membership;
    build();
  }

  // Writes key -> value into the key's partition, at the partition's next offset.
  void put(const std::string& key, const std::string& value) {
    int32_t p = partition_of(key);
    auto b = db->new_batch();
    int64_t off = next[p]++;
    b.put(*db->find_view("s"), p, key, frame_value(off, value));
    b.set_position(*db->find_view("s"), p, next[p]);
    REQUIRE(db->write(b).ok());
    notifier.notify();
  }

  // Writes the window of `key` starting at `start` (ms) with the aggregate `value`.
  void put_window(const std::string& key, int64_t start, const std::string& value) {
    int32_t p = partition_of(key);
    auto b = db->new_batch();
    int64_t off = next[p]++;
    b.put(*db->find_view("w"), p, encode_windowed_key(key, start), frame_value(off, value));
    b.set_position(*db->find_view("w"), p, next[p]);
    REQUIRE(db->write(b).ok());
  }

  answer call(const std::string& method, const std::string& target, std::string body = {},
              std::vector<std::pair<std::string, std::string>> headers = {}) {
    http::request req;
    req.method = method;
    req.target = target;
    REQUIRE(http::parse_target(target, req).ok());
    req.body = std::move(body);
    for (auto& [n, v] : headers) {
      std::string lower = n;
      for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(lower, v);
    }
    req.request_id = "test";
    std::promise<answer> p;
    handler(req, [&p](http::response r) {
      answer a;
      a.status = r.status;
      a.content_type = r.content_type;
      a.body = std::move(r.body);
      a.headers = std::move(r.headers);
      a.stream = std::move(r.stream);
      a.thread = std::this_thread::get_id();
      p.set_value(std::move(a));
    });
    auto f = p.get_future();
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    return f.get();
  }
  answer get(const std::string& target, std::vector<std::pair<std::string, std::string>> headers = {}) {
    return call("GET", target, {}, std::move(headers));
  }

  std::string dir = temp_dir();
  std::vector<view_def> views;
  std::unique_ptr<storage::db> db;
  ownership_registry ownership;
  membership_registry membership;
  change_notifier notifier;
  std::unique_ptr<query::engine> queries;
  std::unique_ptr<query::freshness_waiter> waiter;
  std::shared_ptr<prometheus::Registry> metrics = std::make_shared<prometheus::Registry>();
  std::shared_ptr<server::peer_secret> secret = std::make_shared<server::peer_secret>();
  std::unique_ptr<http::client> peers;
  server::api_context ctx;
  http::async_handler handler;
  std::unique_ptr<http::server> http_server;
  std::map<int32_t, int64_t> next;
};

// The group as the coordinator would describe it: each endpoint with its partitions.
cluster_snapshot group_of(const std::vector<std::pair<std::string, std::vector<int32_t>>>& members) {
  cluster_snapshot s;
  s.version = 1;
  s.group_state = "Stable";
  for (const auto& [endpoint, parts] : members) {
    member_info m;
    m.member_id = endpoint;
    m.endpoint = endpoint;
    for (int32_t p : parts) m.partitions.emplace_back(topic, p);
    s.members.push_back(m);
  }
  return s;
}

std::string key_text(int i) { return "user-" + std::to_string(i); }
std::string value_of(int i) { return R"({"n":)" + std::to_string(i) + "}"; }

// A key whose base64url spelling lands in another partition than the key itself.
std::string key_with_other_text_partition() {
  for (int i = 0;; ++i) {
    auto k = key_text(i);
    if (partition_of(k) != partition_of(query::base64url_encode(k))) return k;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------
// One instance

TEST_CASE("batchGet: a key asked twice is read and answered once, in first-appearance order") {
  node n;
  n.build();
  for (int i = 0; i < 10; ++i) n.put(key_text(i), value_of(i));
  auto r = n.call("POST", "/v1/stores/s/keys:batchGet",
                  R"({"keys": ["user-3", "user-1", "user-3", "nobody", "user-1", "nobody"]})",
                  {{"Content-Type", "application/json"}});
  REQUIRE(r.status == 200);
  auto body = r.body_json();
  REQUIRE(body["data"].size() == 2);
  CHECK(body["data"][0]["key"] == "user-3");
  CHECK(body["data"][0]["value"] == json::parse(value_of(3)));
  CHECK(body["data"][1]["key"] == "user-1");
  CHECK(body["missing"] == json::array({"nobody"}));
}

TEST_CASE("batchGet: a key its format cannot decode is named by its place in the list") {
  node n;
  n.build();
  auto r = n.call("POST", "/v1/stores/s/keys:batchGet", R"({"keys": ["12", "twelve", "13"], "key_format": "long"})",
                  {{"Content-Type", "application/json"}});
  CHECK(r.status == 400);
  CHECK(r.body_json()["type"] == "/problems/bad_key_encoding");
  CHECK(r.body_json()["detail"].get<std::string>().rfind("keys[1]: ", 0) == 0);
}

TEST_CASE("batchGet: a body nested deeper than max_json_depth is refused before it is parsed") {
  node n;
  n.ctx.limits.max_json_depth = 16;
  n.build();
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  auto deep = n.call("POST", "/v1/stores/s/keys:batchGet", R"({"keys": [)" + nested(100'000) + "]}",
                     {{"Content-Type", "application/json"}});
  CHECK(deep.status == 400);
  CHECK(deep.body_json()["error_code"] == 40008);
  // At the limit the body is parsed (and then refused for what it says, not its depth).
  auto at_limit = n.call("POST", "/v1/stores/s/keys:batchGet", R"({"keys": [)" + nested(14) + "]}",
                         {{"Content-Type", "application/json"}});
  CHECK(at_limit.status == 400);
  CHECK(at_limit.body_json()["detail"] == "keys must be strings");
}

TEST_CASE("pages end before query.max_response_bytes, and paging still returns every key once") {
  node n;
  n.ctx.limits.max_response_bytes = 4096;
  n.build();
  std::map<std::string, std::string> model;
  for (int i = 0; i < 200; ++i) {
    n.put(key_text(i), R"({"pad":")" + std::string(200, 'x') + R"(","n":)" + std::to_string(i) + "}");
    model[key_text(i)] = std::to_string(i);
  }
  std::vector<std::string> got;
  std::string target = "/v1/stores/s/keys?limit=1000";
  for (int pages = 0; pages < 1000; ++pages) {
    auto r = n.get(target);
    REQUIRE(r.status == 200);
    CHECK(r.body.size() <= 4096 + 512);  // one entry may cross the bound, never more
    auto body = r.body_json();
    CHECK(body["data"].size() < 200);
    for (const auto& e : body["data"]) got.push_back(e["key"].get<std::string>());
    if (body["metadata"]["next"].is_null()) break;
    target = "/v1/stores/s/keys?limit=1000&cursor=" + body["metadata"]["next"].get<std::string>();
  }
  std::vector<std::string> want;
  for (const auto& [k, v] : model) want.push_back(k);
  CHECK(got == want);
  // A batch whose answer would be larger is refused, not cut.
  json keys = json::array();
  for (int i = 0; i < 200; ++i) keys.push_back(key_text(i));
  auto b =
      n.call("POST", "/v1/stores/s/keys:batchGet", json{{"keys", keys}}.dump(), {{"Content-Type", "application/json"}});
  CHECK(b.status == 400);
  CHECK(b.body_json()["error_code"] == 40009);
}

TEST_CASE("a key's windows are read on a worker and bounded by query.max_response_bytes") {
  node n;
  n.ctx.limits.max_response_bytes = 4096;
  n.build();
  const std::string value = R"({"pad":")" + std::string(200, 'x') + R"("})";
  for (int64_t i = 0; i < 100; ++i) n.put_window("k", i * 1000, value);
  // Five windows fit: answered whole, in start order, off the caller's thread.
  auto few = n.get("/v1/stores/w/windows/k?from=0&to=5000");
  REQUIRE(few.status == 200);
  CHECK(few.thread != std::this_thread::get_id());
  auto body = few.body_json();
  REQUIRE(body["data"].size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(body["data"][i]["start"] == i * 1000);
  // A hundred would pass the bound: refused with the answer-size code, not cut.
  auto all = n.get("/v1/stores/w/windows/k?from=0&to=100000");
  CHECK(all.status == 400);
  CHECK(all.body_json()["error_code"] == 40009);
  CHECK(all.body.size() < 4096);
}

TEST_CASE("min_position: waits are bounded in number; beyond it 503 at once") {
  query::freshness_config waits;
  waits.max_waiters = 2;
  node n({0, 1, 2, 3}, waits);
  n.build();
  n.put("user-1", value_of(1));
  const int32_t p = partition_of("user-1");
  const std::string target = "/v1/stores/s/keys/user-1?min_position=" + std::to_string(p) + ":50&timeout_ms=3000";
  // Two requests park; the third is refused immediately.
  std::vector<std::future<answer>> parked;
  for (int i = 0; i < 2; ++i) parked.push_back(std::async(std::launch::async, [&] { return n.get(target); }));
  for (int i = 0; i < 200 && n.waiter->pending() < 2; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(n.waiter->pending() == 2);
  auto refused = n.get(target);
  CHECK(refused.status == 503);
  CHECK(refused.body_json()["error_code"] == 50307);
  CHECK(refused.header("Retry-After"));
  // The parked ones time out with the position they saw.
  for (auto& f : parked) {
    auto r = f.get();
    CHECK(r.status == 503);
    CHECK(r.body_json()["error_code"] == 50304);
    CHECK(r.body_json()["position"][std::to_string(p)] == 1);
  }
  CHECK(n.waiter->refused() == 1);
}

// The key as 8 bytes big-endian, as Kafka's LongSerializer writes `n`.
std::string long_key(int64_t n) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, n >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
  return out;
}

TEST_CASE("min_position: a key's partition is that of the decoded key, not of its text") {
  // (key bytes, the key as the request writes it, key_format), for each format whose
  // text differs from the bytes, picked so that the text hashes to another partition.
  std::vector<std::tuple<std::string, std::string, std::string>> cases;
  const std::string b64 = key_with_other_text_partition();
  cases.emplace_back(b64, query::base64url_encode(b64), "base64url");
  for (int64_t n = 1;; ++n) {
    if (partition_of(long_key(n)) != partition_of(std::to_string(n))) {
      cases.emplace_back(long_key(n), std::to_string(n), "long");
      break;
    }
  }
  for (const auto& [key, text, format] : cases) {
    CAPTURE(format);
    const int32_t p = partition_of(key);
    // This instance holds only the key's partition: the partition of its text is
    // someone else's.
    node n({p});
    n.build();
    n.put(key, value_of(7));
    const std::string target = "/v1/stores/s/keys/" + text + "?key_format=" + format;
    auto now = n.get(target + "&min_position=" + std::to_string(p) + ":0");
    CHECK(now.status == 200);
    // Not reached yet: the request waits for the key's partition, and times out.
    auto later = n.get(target + "&min_position=" + std::to_string(p) + ":5&timeout_ms=100");
    CHECK(later.status == 503);
    CHECK(later.body_json()["error_code"] == 50304);
    // A write that reaches it answers a waiting request.
    auto waiting = std::async(std::launch::async, [&n, target = target, p = p] {
      return n.get(target + "&min_position=" + std::to_string(p) + ":3&timeout_ms=5000");
    });
    for (int i = 0; i < 200 && n.waiter->pending() == 0; ++i) std::this_thread::sleep_for(10ms);
    for (int i = 0; i < 3; ++i) n.put(key, value_of(10 + i));
    auto r = waiting.get();
    CHECK(r.status == 200);
    CHECK(r.body_json()["value"] == json::parse(value_of(12)));
  }
}

TEST_CASE("exact counts and scans are answered from a worker thread, never the caller's") {
  node n;
  n.build();
  for (int i = 0; i < 50; ++i) n.put(key_text(i), value_of(i));
  auto c = n.get("/v1/stores/s/count");
  REQUIRE(c.status == 200);
  CHECK(c.body_json()["count"] == 50);
  CHECK(c.body_json()["exact"] == true);
  CHECK(c.thread != std::this_thread::get_id());
  auto scan = n.get("/v1/stores/s/keys", {{"Accept", "application/x-ndjson"}});
  REQUIRE(scan.status == 200);
  REQUIRE(scan.stream);
  std::istringstream lines(scan.drain());
  int count = 0;
  for (std::string line; std::getline(lines, line);) {
    auto e = json::parse(line);
    CHECK(e["value"]["n"] == std::stoi(e["key"].get<std::string>().substr(5)));
    ++count;
  }
  CHECK(count == 50);
}

TEST_CASE("metric labels come from a fixed set: an invented method is 'other'") {
  node n;
  n.build();
  for (const char* m : {"FROB", "GET1", "BREW"}) n.call(m, "/v1/stores/s/keys/k");
  auto metrics = n.get("/metrics").body;
  CHECK(metrics.find("FROB") == std::string::npos);
  CHECK(metrics.find("BREW") == std::string::npos);
  CHECK(metrics.find("method=\"other\"") != std::string::npos);
}

TEST_CASE("readyz: an anonymous probe sees readiness, not topics; a cluster token sees the partitions") {
  node n;
  std::vector<server::token_entry> tokens(1);
  tokens[0].name = "ops";
  auto hash = server::sha256_hex("ops-token");
  for (size_t i = 0; i < 32; ++i)
    tokens[0].hash[i] = static_cast<unsigned char>(std::stoi(hash.substr(2 * i, 2), nullptr, 16));
  tokens[0].scopes.cluster = true;
  n.ctx.auth = std::make_shared<server::token_authenticator>(tokens);
  n.build();
  auto anon = n.get("/readyz");
  CHECK(anon.status == 200);
  CHECK(anon.body_json() == json{{"draining", false}, {"ready", true}});
  CHECK(anon.body.find(topic + "\"") == std::string::npos);
  auto ops = n.get("/readyz", {{"Authorization", "Bearer ops-token"}});
  CHECK(ops.body_json()["partitions"].size() == 4);
}

TEST_CASE("readyz: a state directory that refuses writes makes the instance unready, and says why; reads go on") {
  node n;
  n.put("k1", R"({"v":1})");
  n.build();
  REQUIRE(n.get("/readyz").status == 200);
  const auto before = n.get("/v1/stores/s/keys/k1");
  REQUIRE(before.status == 200);
  n.ownership.set_write_failure("write: IO error: No space left on device");
  auto r = n.get("/readyz");
  CHECK(r.status == 503);
  CHECK(r.body_json()["ready"] == false);
  CHECK(r.body_json()["write_failure"] == "write: IO error: No space left on device");
  // Lookups are answered as before, from what is stored.
  const auto during = n.get("/v1/stores/s/keys/k1");
  CHECK(during.status == before.status);
  CHECK(during.body == before.body);
  n.ownership.set_write_failure({});
  r = n.get("/readyz");
  CHECK(r.status == 200);
  CHECK_FALSE(r.body_json().contains("write_failure"));
}

TEST_CASE("readyz and the store description show how far a partition catching up is, and when it should be done") {
  node n({0, 1, 2});
  // Partition 3 assigned at offset 1,000 with its end at 5,000; 1,000 offsets applied.
  n.ownership.assign({{topic, 3, 5'000, false, 1'000}});
  n.ownership.update_progress(topic, 3, 2'000, 5'200);
  n.build();
  auto r = n.get("/readyz");
  CHECK(r.status == 503);
  const json body = r.body_json();
  json behind;
  for (const auto& p : body["partitions"])
    if (p["partition"] == 3) behind = p;
  REQUIRE_MESSAGE(behind.is_object(), r.body);
  CHECK(behind["ready"] == false);
  const auto& c = behind["catch_up"];
  CHECK(c["position"] == 2'000);
  CHECK(c["target"] == 5'000);
  CHECK(c["left"] == 3'000);
  // The rate is what was applied since the assignment, over the time since: positive,
  // and the estimate is what is left at that rate.
  REQUIRE(c["records_per_second"].get<double>() > 0);
  REQUIRE(c["eta_seconds"].is_number());
  // (given to a tenth of a second)
  CHECK(std::abs(c["eta_seconds"].get<double>() - 3'000 / c["records_per_second"].get<double>()) <= 0.051);
  // Caught-up partitions have none.
  for (const auto& p : body["partitions"])
    if (p["partition"] != 3) CHECK_FALSE(p.contains("catch_up"));

  auto d = n.get("/v1/stores/s");
  REQUIRE(d.status == 200);
  const json described = d.body_json();
  for (const auto& p : described["assigned_partitions"]) {
    if (p["partition"] == 3) CHECK(p["catch_up"]["left"] == 3'000);
    else CHECK_FALSE(p.contains("catch_up"));
  }
}

TEST_CASE("peer signatures: HMAC-SHA256 over the documented message, checked against a known vector") {
  // Expected values computed independently (Python's hmac and hashlib) over
  // "v1\n<t>\n<method>\n<target>\n<hex SHA-256 of the body>".
  const server::api::peer_signer signer("0123456789abcdef-group-secret");
  const int64_t t = 1700000000123;
  CHECK(signer.sign("GET", "/v1/stores/s/keys/k?x=1", "", t) ==
        "v1;t=1700000000123;s=684a832dc2b3cb668534a12929e56add71511b4e38cb38ebbc9304c0c7eb4b90");
  CHECK(signer.sign("POST", "/v1/stores/s/keys:batchGet", R"({"keys":["a"]})", t) ==
        "v1;t=1700000000123;s=1329c623d575051c356b4f398cca945ac1f5b1d87665fffad88f7905893bc5f4");
  // verify() accepts exactly what sign() made, within the skew, and nothing altered.
  http::request req;
  req.method = "POST";
  req.target = "/v1/stores/s/keys:batchGet";
  req.body = R"({"keys":["a"]})";
  req.headers = {{"x-kstate-peer", signer.sign(req.method, req.target, req.body, t)}};
  CHECK(signer.verify(req, t + 1000));
  CHECK_FALSE(signer.verify(req, t + 61'000));
  req.body = R"({"keys":["b"]})";
  CHECK_FALSE(signer.verify(req, t + 1000));
  req.body = R"({"keys":["a"]})";
  CHECK(signer.verify(req, t + 1000));
  CHECK_FALSE(server::api::peer_signer("0123456789abcdef-other-secret").verify(req, t + 1000));
}

TEST_CASE("internal dialect: hop requests must be signed, internal parameters are a peer's only") {
  node n;
  n.serve("0123456789abcdef-the-group-secret");
  for (int i = 0; i < 20; ++i) n.put(key_text(i), value_of(i));
  // From a client: refused.
  auto param = n.get("/v1/stores/s/count?partitions=0");
  CHECK(param.status == 400);
  CHECK(param.body_json()["error_code"] == 40007);
  auto hop = n.get("/v1/stores/s/count", {{"X-Kstate-Hop", "1"}});
  CHECK(hop.status == 401);
  CHECK(hop.body_json()["error_code"] == 40102);
}

TEST_CASE("partition copies: only signed peers reach them; pages hold the partition, the last its count and checksum") {
  const std::string secret = "0123456789abcdef-the-group-secret";
  node n;
  server::snapshot_sender_limits limits;
  limits.page_bytes = 1000;  // many pages
  limits.max_sessions = 1;
  n.ctx.snapshots = std::make_shared<server::snapshot_sender>(*n.db, limits);
  n.serve(secret);
  std::map<std::string, std::string> model;  // partition 1's keys and their stored values
  for (int i = 0; i < 300; ++i) {
    auto k = key_text(i);
    int32_t p = partition_of(k);
    int64_t off = n.next[p];
    n.put(k, value_of(i));
    if (p == 1) model[k] = frame_value(off, value_of(i));
  }
  REQUIRE(model.size() > 30);
  const server::api::peer_signer signer(secret);
  auto peer = [&](const std::string& method, const std::string& target) {
    return n.call(method, target, {},
                  {{"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", signer.sign(method, target, "", signer.now_ms())}});
  };
  const std::string base = "/v1/stores/s/partitions/1/snapshot";

  // To a client the routes do not exist.
  CHECK(n.get(base).status == 404);
  CHECK(n.call("POST", base).status == 404);
  CHECK(n.get("/v1/stores/s/partitions/1/snapshot", {{"X-Kstate-Hop", "1"}}).status == 401);

  auto probe = peer("GET", base);
  REQUIRE(probe.status == 200);
  CHECK(probe.body_json()["positions"] == json::array({{{"name", "s"}, {"offset", n.next[1]}}}));
  CHECK(peer("GET", "/v1/stores/s/partitions/x/snapshot").status == 400);
  CHECK(peer("GET", "/v1/stores/nope/partitions/1/snapshot").status == 404);

  auto opened = peer("POST", base);
  REQUIRE(opened.status == 200);
  const auto session = opened.body_json()["session"].get<std::string>();
  CHECK(opened.body_json()["positions"] == probe.body_json()["positions"]);
  // One copy at a time here: a second is refused while the first is being sent.
  CHECK(peer("POST", base).status == 503);
  // Written after the copy was opened: not in it.
  n.put("written-later", value_of(1));

  std::map<std::string, std::string> got;
  std::vector<std::string> order;
  uint64_t hash = 0;
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  std::string last_body;
  for (uint64_t page = 0;; ++page) {
    auto a = peer("GET", base + "?session=" + session + "&page=" + std::to_string(page));
    REQUIRE(a.status == 200);
    CHECK(a.content_type == "application/vnd.kstate.snapshot");
    uint64_t frames = 0;
    REQUIRE(server::for_each_snapshot_frame(a.body, [&](std::string_view k, std::string_view v) {
              ++frames;
              got.emplace(std::string(k), std::string(v));
              order.emplace_back(k);
              return status::ok_status();
            }).ok());
    CHECK(a.header("X-Kstate-Snapshot-Entries") == std::to_string(frames));
    XXH64_update(h, a.body.data(), a.body.size());
    if (page > 0) {
      // Only the next page, or the last one again (a retried request).
      CHECK(peer("GET", base + "?session=" + session + "&page=" + std::to_string(page - 1)).status == 400);
      CHECK(peer("GET", base + "?session=" + session + "&page=" + std::to_string(page)).body == a.body);
    }
    if (a.header("X-Kstate-Snapshot-Last")) {
      hash = XXH64_digest(h);
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
      CHECK(a.header("X-Kstate-Snapshot-Digest") == std::string(hex));
      CHECK(a.header("X-Kstate-Snapshot-Total") == std::to_string(model.size()));
      CHECK(page >= 2);  // several pages
      break;
    }
  }
  XXH64_freeState(h);
  CHECK(got == model);
  CHECK(std::is_sorted(order.begin(), order.end()));
  // The copy was sent whole: room for the next one.
  CHECK(peer("POST", base).status == 200);
  CHECK(peer("GET", base + "?session=nosuchsession&page=0").status == 404);
}

TEST_CASE("a join view's copy carries its sides after the joined values, and says how many on the last page") {
  const std::string dir = temp_dir();
  storage::db_options o{.path = dir};
  o.verify_files_interval_ms = 0;
  auto opened = storage::db::open(o, {"j", "j#sides", "t"});
  REQUIRE(opened.ok());
  auto& d = *opened.value();
  const auto j = *d.find_view("j"), sides = *d.find_view("j#sides"), t = *d.find_view("t");
  // Partition 0: sides of every key, joined values of two in three (an inner join holds
  // sides of keys not joined yet).
  std::map<std::string, std::string> joined, side_model;
  auto b = d.new_batch();
  for (int i = 0; i < 200; ++i) {
    const auto k = "k" + std::to_string(i);
    side_model[k] = "sides of " + k;
    b.put(sides, 0, k, side_model[k]);
    if (i % 3 != 0) {
      joined[k] = "joined " + k;
      b.put(j, 0, k, joined[k]);
    }
  }
  b.put(sides, 1, "another-partition", "x");
  b.set_position(j, 0, 200);
  b.put(t, 0, "plain", "v");
  b.set_position(t, 0, 1);
  REQUIRE(d.write(b).ok());
  const std::vector<view_def> views{view_def{.name = "j", .kind = view_kind::join, .topic = "r"},
                                    view_def{.name = "t", .topic = "t"}};
  server::snapshot_sender_limits limits;
  limits.page_bytes = 500;  // many pages
  // Its sessions hold snapshots of the database: it goes first.
  auto sender = std::make_unique<server::snapshot_sender>(d, limits, views);
  CHECK(sender->carries_sides("j"));
  CHECK_FALSE(sender->carries_sides("t"));

  for (const std::string store : {"j", "t"}) {
    CAPTURE(store);
    auto offer = sender->open(store, 0);
    REQUIRE(offer.ok());
    std::map<std::string, std::string> got, got_sides;
    bool entry_after_side = false;
    uint64_t total = 0;
    std::optional<uint64_t> total_sides;
    for (uint64_t n = 0; n < 1000; ++n) {
      auto page = sender->read(offer->session, n);
      REQUIRE(page.ok());
      REQUIRE(server::for_each_snapshot_frame(page->body, [&](std::string_view k, std::string_view v,
                                                              server::snapshot_frame kind) {
                if (kind == server::snapshot_frame::version) return status::internal("a version of no versioned view");
                if (kind == server::snapshot_frame::side) got_sides.emplace(k, v);
                else {
                  entry_after_side = entry_after_side || !got_sides.empty();
                  got.emplace(k, v);
                }
                return status::ok_status();
              }).ok());
      total += page->entries;
      if (page->last) {
        CHECK(page->total_entries == total);
        total_sides = page->total_sides;
        break;
      }
    }
    if (store == "j") {
      CHECK(got == joined);
      CHECK(got_sides == side_model);
      CHECK(total_sides == side_model.size());
      CHECK_FALSE(entry_after_side);
    } else {
      CHECK(got == std::map<std::string, std::string>{{"plain", "v"}});
      CHECK(got_sides.empty());
      CHECK_FALSE(total_sides.has_value());
    }
  }

  // A reader that takes entries only refuses sides rather than taking them for entries,
  // and a frame of two kinds is malformed.
  std::string body;
  server::append_snapshot_frame(body, "k", "v", server::snapshot_frame::side);
  CHECK_FALSE(server::for_each_snapshot_frame(body, [](std::string_view, std::string_view) {
                return status::ok_status();
              }).ok());
  body[0] = static_cast<char>(0xc0);
  CHECK_FALSE(server::for_each_snapshot_frame(body, [](std::string_view, std::string_view, server::snapshot_frame) {
                return status::ok_status();
              }).ok());
  sender.reset();
  opened.value().reset();
  fs::remove_all(dir);
}

TEST_CASE("a join partition is copied with its sides, and never from a sender whose copies lack them") {
  const std::string secret = "0123456789abcdef-the-group-secret";
  // The sender's state, declared first: the sender's sessions hold snapshots of it.
  const std::string src_dir = temp_dir();
  auto src = storage::db::open(storage::db_options{.path = src_dir, .verify_files_interval_ms = 0}, {"j", "j#sides"});
  REQUIRE(src.ok());
  auto& s = *src.value();
  const auto j = *s.find_view("j"), sides = *s.find_view("j#sides");
  std::map<std::string, std::string> joined, side_model;
  auto b = s.new_batch();
  for (int i = 0; i < 300; ++i) {
    const auto k = "k" + std::to_string(i);
    side_model[k] = "sides of " + k;
    b.put(sides, 0, k, side_model[k]);
    if (i % 4 != 0) {
      joined[k] = "joined " + k;
      b.put(j, 0, k, joined[k]);
    }
  }
  b.set_position(j, 0, 300);
  b.set_named_position("j#changelog", 0, 280);
  REQUIRE(s.write(b).ok());
  view_def jv;
  jv.name = "j";
  jv.kind = view_kind::join;
  jv.topic = jv.repartition_topic = "app-j-repartition";
  const std::vector<view_def> views{jv};

  node n;  // serves the copy routes
  n.serve(secret);
  // The receiver: another member of the group, taking partition 0 without its state.
  const std::string self = "http://127.0.0.1:1";
  membership_registry membership;
  membership.publish(group_of({{n.ctx.instance, {}}, {self, {0}}}));
  http::client peers(http::client_config{});
  auto shared_secret = std::make_shared<server::peer_secret>();
  shared_secret->set(secret);
  std::atomic<bool> stopping{false};
  server::bootstrap_config cfg;
  cfg.min_offsets = 1;
  cfg.timeout = 20s;
  cfg.page_timeout = 5s;
  server::snapshot_sender_limits limits;
  limits.page_bytes = 700;  // many pages

  for (const bool sends_sides : {true, false}) {
    CAPTURE(sends_sides);
    // Without the views, the sender is one that does not know to send sides (an
    // instance of an earlier version): its copies hold the joined values only.
    n.ctx.snapshots = sends_sides ? std::make_shared<server::snapshot_sender>(s, limits, views)
                                  : std::make_shared<server::snapshot_sender>(s, limits);
    n.build();
    const std::string dst_dir = temp_dir();
    auto dst = storage::db::open(storage::db_options{.path = dst_dir, .verify_files_interval_ms = 0}, {"j", "j#sides"});
    REQUIRE(dst.ok());
    auto& d = *dst.value();
    server::bootstrapper boot(cfg, views, d, membership, peers, shared_secret, self, stopping, nullptr);
    boot.run({{jv.repartition_topic, 0}});
    auto contents = [&](storage::view_id view) {
      std::map<std::string, std::string> out;
      auto snap = d.read_snapshot();
      for (auto it = snap->scan(view, 0, std::nullopt, std::nullopt, false, storage::scan_use::sweep); it->valid();
           it->next())
        out.emplace(std::string(it->key()), std::string(it->value()));
      return out;
    };
    CHECK(boot.failed() == 0);
    if (sends_sides) {
      CHECK(boot.installed() == 1);
      CHECK(contents(*d.find_view("j")) == joined);
      CHECK(contents(*d.find_view("j#sides")) == side_model);
      CHECK(*d.read_snapshot()->view_positions(*d.find_view("j"), 0) ==
            std::vector<std::pair<std::string, int64_t>>{{"j", 300}, {"j#changelog", 280}});
    } else {
      // Not installed: no position, so the partition restores from its changelog.
      CHECK(boot.installed() == 0);
      CHECK_FALSE(d.stored_position(*d.find_view("j"), 0).value().has_value());
      CHECK(contents(*d.find_view("j")).empty());
      CHECK(contents(*d.find_view("j#sides")).empty());
    }
  }
}

TEST_CASE("internal parameters: partitions must be distinct partitions of the topic") {
  // Through a real peer: instance a asks b, which holds everything; a request signed by
  // the group with bad partition lists is refused by b.
  node b;
  const std::string secret = "0123456789abcdef-the-group-secret";
  b.serve(secret);
  http::client peer(http::client_config{});
  auto ask = [&](const std::string& target) {
    http::client_request req;
    req.target = target;
    std::promise<result<http::response>> p;
    // Signed as an instance of the group would.
    server::api::peer_signer signer(secret);
    req.headers = {{"X-Kstate-Hop", "1"},
                   {"X-Kstate-Peer", signer.sign("GET", target, "", server::api::peer_signer::now_ms())}};
    peer.send(b.ctx.instance, req, [&p](result<http::response> r) { p.set_value(std::move(r)); });
    auto r = p.get_future().get();
    REQUIRE(r.ok());
    return std::move(r.value());
  };
  CHECK(ask("/v1/stores/s/count?partitions=0,1").status == 200);
  for (const char* bad : {"0,0", "4", "-1", "1,,2", "x"}) {
    CAPTURE(bad);
    CHECK(ask(std::string("/v1/stores/s/count?partitions=") + bad).status == 400);
  }
}

// ---------------------------------------------------------------------------------
// Two instances: a holds partitions 0 and 1, b holds 2 and 3.

namespace {

const std::string group_secret = "0123456789abcdef-the-group-secret";

struct pair_of_nodes {
  pair_of_nodes() : a({0, 1}), b({2, 3}) {
    a.serve(group_secret);
    b.serve(group_secret);
    auto g = group_of({{a.ctx.instance, {0, 1}}, {b.ctx.instance, {2, 3}}});
    a.membership.publish(g);
    b.membership.publish(g);
    for (int i = 0; i < 100; ++i) {
      auto k = key_text(i);
      (partition_of(k) < 2 ? a : b).put(k, value_of(i));
      model[k] = i;
    }
  }
  node a, b;
  std::map<std::string, int> model;
};

}  // namespace

TEST_CASE("two instances: a key, a page, a count and a batch through either equal the model") {
  pair_of_nodes pn;
  for (auto* via : {&pn.a, &pn.b}) {
    for (const auto& [k, i] : pn.model) {
      auto r = via->get("/v1/stores/s/keys/" + k);
      REQUIRE(r.status == 200);
      CHECK(r.body_json()["value"]["n"] == i);
    }
    auto page = via->get("/v1/stores/s/keys?limit=1000");
    REQUIRE(page.status == 200);
    std::vector<std::string> got;
    const auto page_body = page.body_json();
    for (const auto& e : page_body["data"]) got.push_back(e["key"].get<std::string>());
    std::vector<std::string> want;
    for (const auto& [k, i] : pn.model) want.push_back(k);
    CHECK(got == want);
    auto count = via->get("/v1/stores/s/count");
    REQUIRE(count.status == 200);
    CHECK(count.body_json()["count"] == pn.model.size());
    CHECK(count.body_json()["metadata"]["position"].size() == 4);
    auto batch = via->call("POST", "/v1/stores/s/keys:batchGet", R"({"keys":["user-5","nobody","user-77","user-5"]})",
                           {{"Content-Type", "application/json"}});
    REQUIRE(batch.status == 200);
    auto body = batch.body_json();
    REQUIRE(body["data"].size() == 2);
    CHECK(body["data"][0]["key"] == "user-5");
    CHECK(body["data"][1]["key"] == "user-77");
    CHECK(body["missing"] == json::array({"nobody"}));
  }
}

TEST_CASE("two instances: min_position on another instance's partition is waited for there") {
  pair_of_nodes pn;
  // Partition 2 is b's. Through a, a count and a range naming it answer once b has it.
  const int64_t at = pn.b.next[2];
  auto reached = pn.a.get("/v1/stores/s/count?min_position=2:" + std::to_string(at - 1));
  CHECK(reached.status == 200);
  auto not_yet = pn.a.get("/v1/stores/s/count?min_position=2:" + std::to_string(at + 2) + "&timeout_ms=200");
  CHECK(not_yet.status == 503);
  CHECK(not_yet.body_json()["error_code"] == 50304);
  // A page waiting for it is answered when b applies the records.
  auto waiting = std::async(std::launch::async, [&] {
    return pn.a.get("/v1/stores/s/keys?limit=1000&min_position=2:" + std::to_string(at + 1) + "&timeout_ms=5000");
  });
  std::this_thread::sleep_for(200ms);
  std::string k2;
  for (int i = 1000;; ++i)
    if (partition_of(key_text(i)) == 2) {
      k2 = key_text(i);
      break;
    }
  pn.b.put(k2, value_of(1));
  pn.b.put(k2, value_of(2));
  auto page = waiting.get();
  REQUIRE(page.status == 200);
  bool found = false;
  const auto page_body = page.body_json();
  for (const auto& e : page_body["data"]) found = found || e["key"] == k2;
  CHECK(found);
  // A batch too: the key on b is read after b reached the position.
  auto batch =
      pn.a.call("POST", "/v1/stores/s/keys:batchGet?min_position=2:" + std::to_string(at + 1) + "&timeout_ms=2000",
                json{{"keys", {k2}}}.dump(), {{"Content-Type", "application/json"}});
  REQUIRE(batch.status == 200);
  CHECK(batch.body_json()["data"][0]["value"]["n"] == 2);
}

TEST_CASE("coalesced forwards: answers equal the owner's own, whether the owner takes batches or not") {
  for (const bool owner_takes_batches : {true, false}) {
    CAPTURE(owner_takes_batches);
    pair_of_nodes pn;
    // One exchange at a time to b: concurrent lookups beyond it ride in batches.
    pn.a.ctx.peer_batch.max_in_flight = 1;
    pn.a.build();
    // b as it is, or as an earlier version without the batch route (404), counting the
    // batches it is sent.
    std::atomic<int> batches{0};
    auto real = pn.b.handler;
    pn.b.handler = [&, real](const http::request& r, http::responder reply) {
      if (r.path == "/v1/internal/forwards") {
        ++batches;
        if (!owner_takes_batches) {
          http::response gone;
          gone.status = 404;
          gone.content_type = "application/problem+json";
          gone.body = R"({"title":"no route"})";
          return reply(std::move(gone));
        }
      }
      real(r, std::move(reply));
    };
    // Keys b holds, found and missing, and a key with bytes that travel encoded.
    std::vector<std::string> targets;
    for (int i = 0; i < 300; ++i) {
      const auto k = i < 200 ? key_text(i % 100) : "gone/" + std::to_string(i);
      if (partition_of(k) >= 2) targets.push_back("/v1/stores/s/keys/" + http::percent_encode(k));
    }
    REQUIRE(targets.size() > 50);
    std::vector<answer> via_a(targets.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 16; ++t)
      clients.emplace_back([&] {
        for (size_t i = next++; i < targets.size(); i = next++) via_a[i] = pn.a.get(targets[i]);
      });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < targets.size(); ++i) {
      CAPTURE(targets[i]);
      auto own = pn.b.get(targets[i]);
      CHECK(own.header("X-Kstate-Forwarded-To") == std::nullopt);
      CHECK(via_a[i].status == own.status);
      CHECK(via_a[i].content_type == own.content_type);
      CHECK(via_a[i].body == own.body);
      CHECK(via_a[i].header("X-Kstate-Position") == own.header("X-Kstate-Position"));
      CHECK(via_a[i].header("X-Kstate-Forwarded-To") == pn.b.ctx.instance);
    }
    // Batches were sent; refused, the first one made a send every request alone.
    if (owner_takes_batches) CHECK(batches > 0);
    else CHECK(batches == 1);
  }
}

TEST_CASE("forwarding: only this API's headers come back from the owner") {
  // The owner of every partition here is a server that answers with headers of its own.
  node a({0, 1});
  http::server_config cfg;
  cfg.port = 0;
  http::server owner(cfg, [](const http::request&) {
    http::response r;
    r.body = R"({"key":"x"})";
    r.with_header("Set-Cookie", "session=stolen")
        .with_header("Access-Control-Allow-Origin", "https://evil.example")
        .with_header("X-Kstate-Position", "2:5")
        .with_header("X-Other", "no");
    return r;
  });
  REQUIRE(owner.start().ok());
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(owner.port());
  a.serve(group_secret);
  a.membership.publish(group_of({{a.ctx.instance, {0, 1}}, {endpoint, {2, 3}}}));
  std::string k;
  for (int i = 0;; ++i)
    if (partition_of(key_text(i)) >= 2) {
      k = key_text(i);
      break;
    }
  auto r = a.get("/v1/stores/s/keys/" + k);
  CHECK(r.status == 200);
  CHECK(r.header("X-Kstate-Position") == "2:5");
  CHECK(r.header("X-Kstate-Forwarded-To") == endpoint);
  CHECK_FALSE(r.header("Set-Cookie"));
  CHECK_FALSE(r.header("Access-Control-Allow-Origin"));
  CHECK_FALSE(r.header("X-Other"));
  owner.stop();
}

TEST_CASE("forwarding: an instance speaking TLS never sends a request to a plain-HTTP endpoint") {
  std::atomic<int> asked{0};
  http::server_config cfg;
  cfg.port = 0;
  http::server owner(cfg, [&asked](const http::request&) {
    ++asked;
    return http::response{};
  });
  REQUIRE(owner.start().ok());
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(owner.port());
  node a({0, 1});
  a.serve(group_secret);
  a.ctx.instance = "https://127.0.0.1:1";  // what an instance with http.tls advertises
  a.build();
  a.membership.publish(group_of({{a.ctx.instance, {0, 1}}, {endpoint, {2, 3}}}));
  std::string k;
  for (int i = 0;; ++i)
    if (partition_of(key_text(i)) >= 2) {
      k = key_text(i);
      break;
    }
  auto r = a.get("/v1/stores/s/keys/" + k);
  CHECK(r.status == 503);
  CHECK(r.body_json()["error_code"] == 50302);
  auto page = a.get("/v1/stores/s/keys");
  CHECK(page.status == 503);
  CHECK(asked == 0);
  owner.stop();
}

TEST_CASE("forwarding: the caller's token never reaches another instance, for a key, a page, a batch or the cluster") {
  // The owner of partitions 2 and 3 records the headers of every request it receives.
  std::mutex mu;
  std::vector<http::request> seen;
  http::server_config cfg;
  cfg.port = 0;
  http::server owner(cfg, [&](const http::request& r) {
    {
      std::lock_guard lk(mu);
      seen.push_back(r);
    }
    http::response res;
    res.status = 503;  // an answer is not the point; what was sent is
    res.with_header("Retry-After", "1");
    return res;
  });
  REQUIRE(owner.start().ok());
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(owner.port());
  node a({0, 1});
  auto tokens = server::parse_token_file(std::string("tokens:\n  - {name: dash, sha256: ") +
                                         server::sha256_hex("secret-token") + ", stores: ['*'], cluster: true}\n");
  REQUIRE(tokens.ok());
  a.ctx.auth = std::make_shared<server::token_authenticator>(std::move(tokens.value()));
  a.serve(group_secret);
  a.membership.publish(group_of({{a.ctx.instance, {0, 1}}, {endpoint, {2, 3}}}));
  std::string k;
  for (int i = 0;; ++i)
    if (partition_of(key_text(i)) >= 2) {
      k = key_text(i);
      break;
    }
  const std::vector<std::pair<std::string, std::string>> bearer{{"Authorization", "Bearer secret-token"}};
  CHECK(a.get("/v1/stores/s/keys/" + k).status == 401);  // the token is needed here
  a.get("/v1/stores/s/keys/" + k, bearer);
  a.get("/v1/stores/s/keys?limit=10", bearer);
  a.get("/v1/stores/s/count", bearer);
  a.call("POST", "/v1/stores/s/keys:batchGet", json{{"keys", {k}}}.dump(),
         {{"Authorization", "Bearer secret-token"}, {"Content-Type", "application/json"}});
  a.get("/v1/cluster", bearer);
  owner.stop();
  std::lock_guard lk(mu);
  CHECK(seen.size() >= 4);
  for (const auto& r : seen) {
    CAPTURE(r.target);
    for (const auto& [name, value] : r.headers) {
      CHECK(name != "authorization");
      CHECK(value.find("secret-token") == std::string::npos);
    }
    CHECK(r.target.find("secret-token") == std::string::npos);
    CHECK(r.body.find("secret-token") == std::string::npos);
  }
}

TEST_CASE("a key's 404 is the problem's members and where the key is absent, exactly as dump() prints them") {
  node n;
  n.build();
  n.put("present", value_of(1));
  // Plain, written with percent-escapes, and bytes that are not UTF-8 (base64url).
  for (const auto& [key, path_key, query] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"nobody", "nobody", ""},
           {"a \"quoted\" \xc3\xa9 key", "a%20%22quoted%22%20%C3%A9%20key", ""},
           {std::string("\xff\xfe", 2), query::base64url_encode(std::string("\xff\xfe", 2)),
            "?key_format=base64url"}}) {
    CAPTURE(path_key);
    auto r = n.get("/v1/stores/s/keys/" + path_key + query);
    REQUIRE(r.status == 404);
    const int32_t p = partition_of(key);
    json want = {{"type", "/problems/key_not_found"},
                 {"title", "Key not found"},
                 {"status", 404},
                 {"detail", "no value for this key in store 's'"},
                 {"instance", "/v1/stores/s/keys/" + path_key},
                 {"error_code", 40402},
                 {"partition", p},
                 {"position", {{std::to_string(p), n.next[p]}}},
                 {"served_by", n.ctx.instance}};
    CHECK(r.body == want.dump(-1, ' ', false, json::error_handler_t::replace));
    CHECK(r.content_type == "application/problem+json");
    CHECK(r.header("X-Kstate-Position") == std::to_string(p) + ":" + std::to_string(n.next[p]));
  }
}
