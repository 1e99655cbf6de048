// Hostile input against a running group of two instances that serve data: requests a
// client controls byte for byte (framing, sizes, nesting, parameters, the internal
// dialect, methods, connections, pace). Each gets the documented 4xx/5xx problem+json
// answer, or the connection is closed; a request smuggled behind an ambiguous message
// is never answered; and afterwards both instances are up and answer exactly what was
// produced.
//
// Instance a has small limits (max_connections 8, read_timeout 1 s, target 1 KiB,
// header block 4 KiB, body 64 KiB, limit 100, 50 keys per batch); instance b has room for a target
// and a body that hold a key nested 100,000 deep, so that the JSON bound itself is
// what refuses it there.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

constexpr int max_connections = 8;
constexpr int max_limit = 100;
constexpr int max_batch_keys = 50;
constexpr int max_header_bytes = 4096;
constexpr int max_body_bytes = 65536;
constexpr int max_waiting = 3;

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A bound on a test that would otherwise hang; the server's own deadline (1 s on
  // instance a) ends every connection long before.
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the server sent on one connection, until it closed it.
struct exchange {
  std::string data;
  bool closed = false;  // the server ended the connection (not our receive bound)
};

exchange read_until_close(int fd) {
  exchange e;
  char buf[65536];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      e.data.append(buf, static_cast<size_t>(n));
      continue;
    }
    e.closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  return e;
}

// Sends `bytes` on a fresh connection and reads until the server closes it.
exchange send_raw(uint16_t port, const std::string& bytes) {
  int fd = connect_to(port);
  REQUIRE(fd >= 0);
  // The server may answer and close before it read everything (a header over the
  // limit): a failed send is part of the outcome, not an error of the test.
  size_t sent = 0;
  while (sent < bytes.size()) {
    auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  auto e = read_until_close(fd);
  ::close(fd);
  return e;
}

// The responses in a byte stream, in order (bodies framed by Content-Length, as
// kstate frames every answer that is not a stream).
std::vector<http_answer> responses(const std::string& data) {
  std::vector<http_answer> out;
  size_t at = 0;
  while (at < data.size()) {
    auto end = data.find("\r\n\r\n", at);
    if (end == std::string::npos || data.compare(at, 5, "HTTP/") != 0) break;
    http_answer a = parse_answer_head(data.substr(at, end - at));
    size_t length = a.headers.count("content-length") ? std::stoul(a.headers["content-length"]) : 0;
    a.body = data.substr(end + 4, length);
    at = end + 4 + length;
    out.push_back(std::move(a));
  }
  return out;
}

// A problem+json answer with this status and error code.
void check_problem(const http_answer& a, int status, int error_code) {
  CHECK(a.status == status);
  CHECK(a.headers.count("content-type") == 1);
  CHECK(a.headers.at("content-type").rfind("application/problem+json", 0) == 0);
  auto body = json::parse(a.body, nullptr, false);
  REQUIRE_MESSAGE(body.is_object(), "not JSON: " << a.body);
  CHECK(body["status"] == status);
  CHECK(body["error_code"] == error_code);
}

void check_problem(const std::optional<http_answer>& a, int status, int error_code) {
  REQUIRE(a);
  check_problem(*a, status, error_code);
}

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string keys_body(const std::vector<std::string>& keys) { return json{{"keys", keys}}.dump(); }

// What a store answers for every key, through one instance (pages of max_limit).
std::map<std::string, json> read_all(uint16_t port) {
  http_client h(port);
  std::map<std::string, json> out;
  std::string cursor;
  for (;;) {
    auto a =
        h.get("/v1/stores/s/keys?limit=" + std::to_string(max_limit) + (cursor.empty() ? "" : "&cursor=" + cursor));
    REQUIRE(a);
    REQUIRE(a->status == 200);
    auto body = a->body_json();
    for (const auto& e : body["data"]) out[e["key"].get<std::string>()] = e["value"];
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

}  // namespace

TEST_CASE("hostile requests get their documented answers; both instances stay up and exact") {
  const auto topic = unique_name("hostile");
  create_topic(topic, 3);
  std::vector<produced> records;
  table_model model;
  for (int i = 0; i < 60; ++i)
    records.push_back(
        {"user-" + std::to_string(i), "{\"n\":" + std::to_string(i) + ",\"name\":\"User " + std::to_string(i) + "\"}"});
  for (int i = 0; i < 60; i += 7)
    records.push_back({"user-" + std::to_string(i), "{\"n\":" + std::to_string(1000 + i) + "}"});
  records.push_back({"user-13", std::nullopt});
  for (const auto& r : records) apply_record(model, r);
  produce(topic, records);

  const auto app = unique_name("hostile-app");
  const auto dir = temp_dir("kstate-hostile");
  kstate_process a(app, {{"s", topic}}, dir + "/a"), b(app, {{"s", topic}}, dir + "/b");
  a.extra_args({"--set", "http.max_connections=" + std::to_string(max_connections), "--set",
                "http.read_timeout_ms=1000", "--set", "http.max_target_bytes=1024", "--set",
                "http.max_header_bytes=" + std::to_string(max_header_bytes), "--set",
                "http.max_body_bytes=" + std::to_string(max_body_bytes), "--set",
                "query.max_limit=" + std::to_string(max_limit), "--set",
                "query.max_batch_keys=" + std::to_string(max_batch_keys), "--set",
                "query.max_waiting_requests=" + std::to_string(max_waiting)});
  b.extra_args({"--set", "http.max_target_bytes=1048576", "--set", "http.max_header_bytes=2097152"});
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!(cluster_settled(a.port(), 2, 3) && cluster_settled(b.port(), 2, 3) &&
             a.position_sum("s") + b.position_sum("s") == static_cast<int64_t>(records.size())) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(cluster_settled(a.port(), 2, 3));
    REQUIRE(a.position_sum("s") + b.position_sum("s") == static_cast<int64_t>(records.size()));
  }
  const uint16_t pa = a.port(), pb = b.port();
  const std::string smuggled = "GET /v1/stores/s/keys/user-1 HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string batch = keys_body({"user-1"});
  const std::string post_head =
      "POST /v1/stores/s/keys:batchGet HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

  // Framing another hop could read differently: 400, Connection: close, and the
  // request smuggled after the message is never read. The first exchange is the
  // control: the same bytes with honest framing are two requests and two answers.
  {
    const auto honest = responses(
        send_raw(pa, post_head + "Content-Length: " + std::to_string(batch.size()) + "\r\n\r\n" + batch + smuggled)
            .data);
    REQUIRE(honest.size() == 2);
    CHECK(honest[0].status == 200);
    CHECK(honest[1].status == 200);

    const std::string chunked_batch = [&] {
      std::ostringstream s;
      s << std::hex << batch.size() << "\r\n" << batch << "\r\n0\r\n\r\n";
      return s.str();
    }();
    const std::string cl = "Content-Length: " + std::to_string(batch.size()) + "\r\n";
    struct framing {
      const char* name;
      std::string bytes;
    };
    const std::vector<framing> cases = {
        {"Transfer-Encoding: identity", post_head + "Transfer-Encoding: identity\r\n\r\n" + batch + smuggled},
        {"Transfer-Encoding: chunked, gzip", post_head + "Transfer-Encoding: chunked, gzip\r\n\r\n" + smuggled},
        {"Transfer-Encoding: gzip, chunked",
         post_head + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked_batch + smuggled},
        {"two Transfer-Encoding fields",
         post_head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_batch + smuggled},
        {"Transfer-Encoding with Content-Length",
         post_head + "Transfer-Encoding: chunked\r\n" + cl + "\r\n" + chunked_batch + smuggled},
        {"Content-Length with Transfer-Encoding",
         post_head + cl + "Transfer-Encoding: chunked\r\n\r\n" + chunked_batch + smuggled},
        {"two equal Content-Length fields", post_head + cl + cl + "\r\n" + batch + smuggled},
        {"Content-Length as a list", post_head + "Content-Length: " + std::to_string(batch.size()) + ", " +
                                         std::to_string(batch.size()) + "\r\n\r\n" + batch + smuggled},
        {"Transfer-Encoding on HTTP/1.0",
         "POST /v1/stores/s/keys:batchGet HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\n\r\n" +
             chunked_batch + smuggled},
    };
    for (uint16_t port : {pa, pb}) {
      for (const auto& f : cases) {
        CAPTURE(f.name);
        CAPTURE(port);
        auto e = send_raw(port, f.bytes);
        auto rs = responses(e.data);
        CHECK(e.closed);
        REQUIRE(rs.size() == 1);  // the smuggled request got no answer
        check_problem(rs[0], 400, 40001);
        CHECK(rs[0].headers["connection"] == "close");
      }
    }
  }

  // Header block, chunk extensions and trailers are bounded together (431); a body
  // over the limit is refused by its Content-Length, or when the chunks pass it (413);
  // a target over the limit is 414.
  {
    auto one = [&](const std::string& bytes) {
      auto rs = responses(send_raw(pa, bytes).data);
      REQUIRE(rs.size() == 1);
      return rs[0];
    };
    check_problem(
        one("GET /livez HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(2 * max_header_bytes, 'a') + "\r\n\r\n"), 431,
        43101);
    std::string many_fields = "GET /livez HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 500; ++i) many_fields += "X-F" + std::to_string(i) + ": v\r\n";
    check_problem(one(many_fields + "\r\n"), 431, 43101);
    check_problem(one(post_head + "Transfer-Encoding: chunked\r\n\r\n1;ext=" + std::string(2 * max_header_bytes, 'e') +
                      "\r\n{\r\n0\r\n\r\n"),
                  431, 43101);
    std::string small_extensions = post_head + "Transfer-Encoding: chunked\r\n\r\n";
    for (char ch : batch) small_extensions += "1;e=" + std::string(40, 'x') + "\r\n" + std::string(1, ch) + "\r\n";
    for (int i = 0; i < 100; ++i) small_extensions += "0000001;e=" + std::string(40, 'x') + "\r\n \r\n";
    check_problem(one(small_extensions + "0\r\n\r\n"), 431, 43101);
    check_problem(one(post_head + "Transfer-Encoding: chunked\r\n\r\n" +
                      [&] {
                        std::ostringstream s;
                        s << std::hex << batch.size() << "\r\n"
                          << batch << "\r\n0\r\nX-Trailer: " << std::string(2 * max_header_bytes, 't') << "\r\n\r\n";
                        return s.str();
                      }()),
                  431, 43101);
    check_problem(one(post_head + "Content-Length: " + std::to_string(max_body_bytes + 1) + "\r\n\r\n"), 413, 41301);
    std::string big_chunks = post_head + "Transfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < max_body_bytes / 0x4000; ++i) big_chunks += "4000\r\n" + std::string(0x4000, ' ') + "\r\n";
    check_problem(one(big_chunks + "1\r\n \r\n0\r\n\r\n"), 413, 41301);
    check_problem(one("GET /v1/stores/s/keys/" + std::string(2000, 'k') + " HTTP/1.1\r\nHost: x\r\n\r\n"), 414, 41401);
  }

  // JSON nested 100,000 deep as a key and as a body. On a, the target and the body are
  // over their limits first; on b they fit, and max_json_depth refuses them.
  {
    const std::string deep = nested_arrays(100'000);
    http_client ha(pa), hb(pb);
    check_problem(ha.get("/v1/stores/s/keys/" + pct(deep) + "?key_format=json"), 414, 41401);
    check_problem(hb.get("/v1/stores/s/keys/" + pct(deep) + "?key_format=json"), 400, 40002);
    check_problem(hb.get("/v1/stores/s/keys/" + pct(deep) + "/metadata?key_format=json"), 400, 40002);
    check_problem(hb.get("/v1/stores/s/keys?key_format=json&from=" + pct(deep)), 400, 40002);
    check_problem(ha.post("/v1/stores/s/keys:batchGet", "application/json",
                          json{{"key_format", "json"}, {"keys", {deep}}}.dump()),
                  413, 41301);
    check_problem(hb.post("/v1/stores/s/keys:batchGet", "application/json",
                          json{{"key_format", "json"}, {"keys", {deep}}}.dump()),
                  400, 40002);
    // The body itself nested deeper than max_json_depth (128): just over, and far over.
    check_problem(ha.post("/v1/stores/s/keys:batchGet", "application/json",
                          R"({"keys":["user-1"],"x":)" + nested_arrays(128) + "}"),
                  400, 40008);
    check_problem(hb.post("/v1/stores/s/keys:batchGet", "application/json", "{\"keys\":" + deep + "}"), 400, 40008);
    check_problem(hb.post("/v1/stores/s/keys:batchGet", "application/json", deep), 400, 40008);
  }

  // Parameters: limits, cursors, positions, through either instance.
  for (uint16_t port : {pa, pb}) {
    CAPTURE(port);
    http_client h(port);
    for (std::string limit :
         {"0", "-1", "abc", "1e3", "%201", "101", "99999999999999999999999", "-99999999999999999999"}) {
      CAPTURE(limit);
      // b keeps the default max_limit (1000); 101 is over a's only.
      if (port == pb && limit == "101") continue;
      check_problem(h.get("/v1/stores/s/keys?limit=" + limit), 400, 40005);
    }
    auto at_max = h.get("/v1/stores/s/keys?limit=" + std::to_string(max_limit));
    REQUIRE(at_max);
    CHECK(at_max->status == 200);
    for (std::string cursor : std::vector<std::string>{"garbage", "AAAA", "%00%ff", "!!!!", std::string(600, 'A')}) {
      CAPTURE(cursor);
      check_problem(h.get("/v1/stores/s/keys?cursor=" + cursor), 400, 40004);
    }
    // A cursor of another query.
    auto page = h.get("/v1/stores/s/keys?limit=2&prefix=user-");
    REQUIRE(page);
    REQUIRE(page->status == 200);
    const auto next = page->body_json()["metadata"]["next"].get<std::string>();
    check_problem(h.get("/v1/stores/s/keys?limit=2&prefix=user-1&cursor=" + next), 400, 40004);
    for (std::string pos : {"x", "0", "0:", ":1", "0:1,", ",0:1", "-1:0", "0:-1", "2147483648:0",
                            "0:99999999999999999999", "0:1;1:2", "%00"}) {
      CAPTURE(pos);
      check_problem(h.get("/v1/stores/s/keys/user-1?min_position=" + pos), 400, 40006);
      check_problem(h.get("/v1/stores/s/keys?min_position=" + pos), 400, 40006);
      check_problem(h.get("/v1/stores/s/count?min_position=" + pos), 400, 40006);
      check_problem(h.get("/v1/stores/s/keys/user-1", {{"X-Kstate-Min-Position", pos}}), 400, 40006);
    }
    for (std::string t : {"-1", "abc", "99999999999"}) {
      CAPTURE(t);
      check_problem(h.get("/v1/stores/s/keys/user-1?min_position=0:0&timeout_ms=" + t), 400, 40001);
    }
    // A partition the topic does not have.
    check_problem(h.get("/v1/stores/s/keys/user-1?min_position=3:0"), 400, 40006);
    check_problem(h.get("/v1/stores/s/keys?min_position=2147483647:0"), 400, 40006);
    check_problem(h.get("/v1/stores/s/count?min_position=0:0,99:5"), 400, 40006);
  }

  // The internal dialect: from a client, `partitions=` and `after=` are unknown
  // parameters; a request marked as a hop needs a valid signature of the group's
  // secret (401, 40102), whatever it carries; a signed request is still checked.
  {
    const auto secrets = consume_all(app + "-peer-secret", 1);
    REQUIRE(secrets.size() == 1);
    REQUIRE(secrets[0].value);
    const std::string secret = *secrets[0].value;
    http_client h(pa);
    for (std::string q :
         {"partitions=0,0", "partitions=99", "partitions=-1", "partitions=", "after=AAAA", "after=!!"}) {
      CAPTURE(q);
      check_problem(h.get("/v1/stores/s/keys?" + q), 400, 40007);
      // A signature without the hop mark makes no peer either.
      check_problem(h.get("/v1/stores/s/keys?" + q,
                          {{"X-Kstate-Peer", peer_signature(secret, "GET", "/v1/stores/s/keys?" + q, "")}}),
                    400, 40007);
      const std::string target = "/v1/stores/s/keys?" + q;
      check_problem(h.get(target, {{"X-Kstate-Hop", "1"}}), 401, 40102);
      check_problem(h.get(target, {{"X-Kstate-Hop", "1"},
                                   {"X-Kstate-Peer", peer_signature("not the group's secret!", "GET", target, "")}}),
                    401, 40102);
      check_problem(h.get(target, {{"X-Kstate-Hop", "1"},
                                   {"X-Kstate-Peer", peer_signature(secret, "GET", "/v1/stores/s/keys", "")}}),
                    401, 40102);
      const auto an_hour_ago =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count() -
          3'600'000;
      check_problem(h.get(target, {{"X-Kstate-Hop", "1"},
                                   {"X-Kstate-Peer", peer_signature(secret, "GET", target, "", an_hour_ago)}}),
                    401, 40102);
      for (std::string forged :
           std::vector<std::string>{"", "v1", "v1;t=;s=", "v1;t=99999999999999999999;s=00", "v2;t=1;s=00",
                                    "v1;t=-9223372036854775808;s=" + std::string(64, '0')}) {
        CAPTURE(forged);
        check_problem(h.get(target, {{"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", forged}}), 401, 40102);
      }
    }
    // Signed, and still refused when the parameters are wrong.
    for (std::string q : {"partitions=0,0", "partitions=3", "partitions=-1", "partitions=0,,1"}) {
      CAPTURE(q);
      const std::string target = "/v1/stores/s/keys?" + q;
      check_problem(
          h.get(target, {{"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", peer_signature(secret, "GET", target, "")}}), 400,
          40001);
    }
    const std::string bad_after = "/v1/stores/s/keys?partitions=0&after=!!";
    check_problem(
        h.get(bad_after, {{"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", peer_signature(secret, "GET", bad_after, "")}}), 400,
        40004);
  }

  // Methods: an unknown one is 405 on a route (with Allow), 404 elsewhere; the
  // request-duration metric labels it "other", never with the client's word.
  {
    http_client h(pa);
    auto m = h.raw("FROBNICATE /v1/stores/s/keys/user-1 HTTP/1.1\r\nHost: x\r\n\r\n");
    check_problem(m, 405, 40501);
    CHECK(m->headers["allow"] == "GET");
    check_problem(h.raw("FROBNICATE /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"), 404, 40403);
    check_problem(h.raw("DELETE /v1/stores/s/keys/user-1 HTTP/1.1\r\nHost: x\r\n\r\n"), 405, 40501);
    auto metrics = h.get("/metrics");
    REQUIRE(metrics);
    REQUIRE(metrics->status == 200);
    CHECK(metrics->body.find("FROBNICATE") == std::string::npos);
    CHECK(metrics->body.find("method=\"other\"") != std::string::npos);
    std::istringstream in(metrics->body);
    std::string line;
    while (std::getline(in, line)) {
      auto at = line.find("method=\"");
      if (at == std::string::npos) continue;
      const auto value = line.substr(at + 8, line.find('"', at + 8) - at - 8);
      CAPTURE(line);
      CHECK((value == "GET" || value == "HEAD" || value == "POST" || value == "PUT" || value == "DELETE" ||
             value == "PATCH" || value == "OPTIONS" || value == "other"));
    }
  }

  // Keys per batch: the limit answers, one more is 413; through the instance that
  // gathers from the other too.
  {
    std::vector<std::string> keys;
    for (int i = 0; i < max_batch_keys; ++i) keys.push_back("user-" + std::to_string(i));
    http_client h(pa);
    auto ok = h.post("/v1/stores/s/keys:batchGet", "application/json", keys_body(keys));
    REQUIRE(ok);
    CAPTURE(ok->body);
    REQUIRE(ok->status == 200);
    std::map<std::string, json> found, want;
    std::set<std::string> missing, want_missing;
    const auto answer = ok->body_json();  // named: a temporary would die before the loops' bodies
    for (const auto& e : answer["data"]) found[e["key"].get<std::string>()] = e["value"];
    for (const auto& k : answer["missing"]) missing.insert(k.get<std::string>());
    for (const auto& k : keys) {
      if (auto it = model.find(k); it != model.end()) want[k] = json::parse(it->second);
      else want_missing.insert(k);
    }
    CHECK(found == want);
    CHECK(missing == want_missing);
    CHECK(want_missing == std::set<std::string>{"user-13"});  // deleted
    keys.push_back("user-99");
    check_problem(h.post("/v1/stores/s/keys:batchGet", "application/json", keys_body(keys)), 413, 41301);
    std::vector<std::string> many(100'000, "k");
    http_client hb(pb);
    check_problem(hb.post("/v1/stores/s/keys:batchGet", "application/json", keys_body(many)), 413, 41301);
  }

  // A flood beyond max_connections: each connection is served, answered 503 (50306) or
  // closed, and every refusal is counted. (How many are served is not bounded by
  // max_connections: a served connection closes and frees its slot for one the server
  // accepts later. Whether any is closed unanswered depends on how many 503s are still
  // pending when it is accepted; tests/http/server_test.cc checks that path.)
  {
    // The refusals counter, read on a connection of its own before and after.
    auto refused_total = [&] {
      http_client m(pa);
      auto r = m.get("/metrics");
      REQUIRE(r);
      REQUIRE(r->status == 200);
      const std::string name = "kstate_http_refused_connections_total ";
      auto at = r->body.find("\n" + name);
      REQUIRE(at != std::string::npos);
      return std::stoull(r->body.substr(at + 1 + name.size()));
    };
    const auto refused_before = refused_total();
    std::vector<int> fds;
    for (int i = 0; i < 150; ++i) {
      int fd = connect_to(pa);
      if (fd >= 0) fds.push_back(fd);
    }
    const std::string req = "GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for (int fd : fds) (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);  // a refused one fails: counted below
    int served = 0, busy = 0, closed = 0;
    for (int fd : fds) {
      auto rs = responses(read_until_close(fd).data);
      ::close(fd);
      if (rs.empty()) {
        ++closed;
        continue;
      }
      REQUIRE(rs.size() == 1);
      if (rs[0].status == 200) {
        ++served;
      } else {
        check_problem(rs[0], 503, 50306);
        ++busy;
      }
    }
    MESSAGE("flood of " << fds.size() << " connections: " << served << " served, " << busy << " answered 503, "
                        << closed << " closed");
    const auto refused = refused_total() - refused_before;
    MESSAGE("refusals counted: " << refused);
    CHECK(busy > 0);
    CHECK(refused >= static_cast<uint64_t>(busy));  // each 503 is a counted refusal
    CHECK(served + refused <= fds.size());          // a refused connection is never served
    CHECK(served + busy + closed == static_cast<int>(fds.size()));
  }

  // A flood of min_position waits for a position nobody will reach: max_waiting park
  // until their timeout (503 50304), every other one is refused at once (503 50307),
  // each with Retry-After.
  {
    const int flood = 2 * max_waiting;
    // A partition a holds: the wait happens on its owner.
    auto described = http_client(pa).get("/v1/stores/s");
    REQUIRE(described);
    REQUIRE(described->status == 200);
    const auto held = described->body_json()["position"];
    REQUIRE_FALSE(held.empty());
    const std::string wait = "GET /v1/stores/s/count?min_position=" + held.begin().key() +
                             ":1000000&timeout_ms=3000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    std::vector<std::future<exchange>> sent;
    for (int i = 0; i < flood; ++i) sent.push_back(std::async(std::launch::async, [&] { return send_raw(pa, wait); }));
    int parked = 0, refused = 0;
    for (auto& f : sent) {
      auto got = responses(f.get().data);
      REQUIRE(got.size() == 1);
      CHECK(got[0].headers.count("retry-after") == 1);
      const int code = json::parse(got[0].body, nullptr, false).value("error_code", 0);
      if (code == 50304) ++parked;
      else if (code == 50307) ++refused;
      else FAIL("unexpected answer " << got[0].status << " " << got[0].body);
    }
    CHECK(parked <= max_waiting);
    CHECK(refused >= flood - max_waiting);
  }

  // Slow clients are cut off at read_timeout (1 s on a): one that sends its header a
  // byte at a time, one that does so with its body. Neither is ever answered, and
  // neither gets anywhere near the end of its bytes.
  for (const std::string& head :
       {std::string("GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: "), post_head + "Content-Length: 4000\r\n\r\n"}) {
    int fd = connect_to(pa);
    REQUIRE(fd >= 0);
    REQUIRE(::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size()));
    bool cut_off = false;
    int sent = 0;
    std::string got;
    for (; sent < 2000 && !cut_off; ++sent) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (::send(fd, "a", 1, MSG_NOSIGNAL) != 1) cut_off = true;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) {
        char buf[4096];
        auto n = ::recv(fd, buf, sizeof buf, 0);
        if (n > 0) got.append(buf, static_cast<size_t>(n));
        else cut_off = true;
      }
    }
    ::close(fd);
    CAPTURE(head);
    CHECK(cut_off);
    CHECK(got.empty());
    MESSAGE("slow client cut off after " << sent << " bytes");
  }

  // Still up, and exact: every key through either instance, a key forwarded, a batch.
  for (auto* p : {&a, &b}) {
    REQUIRE(p->running());
    http_client h(p->port());
    auto live = h.get("/livez");
    REQUIRE(live);
    CHECK(live->status == 200);
    std::map<std::string, json> want;
    for (const auto& [k, v] : model) want[k] = json::parse(v);
    CHECK(read_all(p->port()) == want);
    for (const char* key : {"user-7", "user-8", "user-13", "user-59"}) {
      CAPTURE(key);
      auto g = h.get(std::string("/v1/stores/s/keys/") + key);
      REQUIRE(g);
      auto it = model.find(key);
      if (it == model.end()) {
        check_problem(g, 404, 40402);
      } else {
        REQUIRE(g->status == 200);
        CHECK(g->body_json()["value"] == json::parse(it->second));
      }
    }
  }
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}
