#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/http.h"
#include "server/http_server.h"
#include "server/problem.h"
#include "server/url.h"

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using kstate::status_code;
using namespace kstate::server;

namespace {

http_request parsed(std::string_view target) {
  http_request req;
  auto s = parse_target(target, req);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return req;
}

status_code parse_code(std::string_view target) {
  http_request req;
  return parse_target(target, req).code();
}

std::vector<std::string> values(const http_request& req, const std::string& key) {
  std::vector<std::string> out;
  auto [b, e] = req.query.equal_range(key);
  for (auto it = b; it != e; ++it) out.push_back(it->second);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------
// parse_target

TEST_CASE("parse_target: %2F decodes to '/' inside one segment") {
  auto req = parsed("/v1/stores/a%2Fb/keys/x");
  REQUIRE(req.segments.size() == 5);
  CHECK(req.segments[2] == "a/b");
  CHECK(req.segments[4] == "x");
  CHECK(req.path == "/v1/stores/a%2Fb/keys/x");  // path stays raw
}

TEST_CASE("parse_target: %00 yields a NUL byte inside the segment") {
  auto req = parsed("/k/a%00b");
  REQUIRE(req.segments.size() == 2);
  CHECK(req.segments[1].size() == 3);
  CHECK(req.segments[1] == std::string("a\0b", 3));
}

TEST_CASE("parse_target: invalid percent-encoding is invalid_argument") {
  CHECK(parse_code("/x/%zz") == status_code::invalid_argument);
  CHECK(parse_code("/x/%4") == status_code::invalid_argument);
  CHECK(parse_code("/x/%") == status_code::invalid_argument);
  CHECK(parse_code("/x/%4g/y") == status_code::invalid_argument);
  CHECK(parse_code("/x?k=%zz") == status_code::invalid_argument);
  CHECK(parse_code("/x?k=%") == status_code::invalid_argument);
}

TEST_CASE("parse_target: a path must start with '/'") {
  CHECK(parse_code("") == status_code::invalid_argument);
  CHECK(parse_code("x/y") == status_code::invalid_argument);
  CHECK(parse_code("*") == status_code::invalid_argument);
  CHECK(parse_code("http://h/x") == status_code::invalid_argument);
}

TEST_CASE("parse_target: 4-byte UTF-8 percent-encoded decodes to its bytes") {
  auto req = parsed("/k/%F0%9F%98%80x");
  REQUIRE(req.segments.size() == 2);
  CHECK(req.segments[1] == "\xF0\x9F\x98\x80x");
  CHECK(req.segments[1].size() == 5);
}

TEST_CASE("parse_target: raw bytes RFC 3986 forbids but clients send are accepted") {
  auto req = parsed("/k/[1]|\xC3\xA9?q={a}");
  REQUIRE(req.segments.size() == 2);
  CHECK(req.segments[1] == "[1]|\xC3\xA9");
  CHECK(req.param("q") == "{a}");
  CHECK(req.path == "/k/[1]|\xC3\xA9");
}

TEST_CASE("parse_target: query parameters are decoded, repeats kept in order") {
  auto req = parsed("/q?a=1&b=x%20y&a=2&a=%26&c");
  CHECK(values(req, "a") == std::vector<std::string>{"1", "2", "&"});
  CHECK(req.param("a") == "1");
  CHECK(req.param("b") == "x y");
  CHECK(req.param("c") == "");  // present without a value
  CHECK_FALSE(req.param("d").has_value());
  CHECK(req.query.size() == 5);
}

TEST_CASE("parse_target: '+' is a space in query values (form-style), literal in paths") {
  auto req = parsed("/a+b?k=x+y&plus=%2B&sp+ace=1");
  CHECK(req.segments == std::vector<std::string>{"a+b"});
  CHECK(req.param("k") == "x y");
  CHECK(req.param("plus") == "+");
  CHECK(req.param("sp ace") == "1");
}

TEST_CASE("parse_target: empty segments are kept for the router") {
  CHECK(parsed("/v1/stores//keys").segments == std::vector<std::string>{"v1", "stores", "", "keys"});
  CHECK(parsed("/v1/").segments == std::vector<std::string>{"v1", ""});
  CHECK(parsed("/").segments.empty());
  auto req = parsed("/x?");
  CHECK(req.query.empty());
}

TEST_CASE("http_request: header() is case-insensitive, param() returns the first value") {
  http_request req;
  req.headers = {{"content-type", "text/plain"}, {"x-a", "1"}, {"x-a", "2"}};
  CHECK(req.header("Content-Type") == "text/plain");
  CHECK(req.header("X-A") == "1");
  CHECK_FALSE(req.header("accept").has_value());
  req.query = {{"k", "first"}, {"k", "second"}};
  CHECK(req.param("k") == "first");
}

// ---------------------------------------------------------------------------------
// problem table

TEST_CASE("problem: every failure_reason maps to its status, error_code and body") {
  struct expected {
    failure_reason reason;
    const char* name;
    unsigned status;
    int subcode;
  };
  const expected rows[] = {
      {failure_reason::unknown_store, "unknown_store", 404, 1},
      {failure_reason::key_not_found, "key_not_found", 404, 2},
      {failure_reason::route_not_found, "route_not_found", 404, 3},
      {failure_reason::bad_request, "bad_request", 400, 1},
      {failure_reason::bad_key_encoding, "bad_key_encoding", 400, 2},
      {failure_reason::bad_path_encoding, "bad_path_encoding", 400, 3},
      {failure_reason::method_not_allowed, "method_not_allowed", 405, 1},
      {failure_reason::not_acceptable, "not_acceptable", 406, 1},
      {failure_reason::payload_too_large, "payload_too_large", 413, 1},
      {failure_reason::uri_too_long, "uri_too_long", 414, 1},
      {failure_reason::unsupported_media, "unsupported_media", 415, 1},
      {failure_reason::headers_too_large, "headers_too_large", 431, 1},
      {failure_reason::internal, "internal", 500, 1},
      {failure_reason::not_caught_up, "not_caught_up", 503, 1},
      {failure_reason::not_owner, "not_owner", 503, 2},
      {failure_reason::shutting_down, "shutting_down", 503, 3},
  };
  // Every enumerator is in the table above: shutting_down is the last one.
  CHECK(std::size(rows) == static_cast<std::size_t>(failure_reason::shutting_down) + 1);

  for (const auto& row : rows) {
    CAPTURE(row.name);
    const auto info = describe(row.reason);
    CHECK(info.status == row.status);
    CHECK(info.error_code == static_cast<int>(row.status) * 100 + row.subcode);
    CHECK_FALSE(info.title.empty());

    const auto res = problem(row.reason, "what happened", "/v1/stores/s", 7);
    CHECK(res.status == row.status);
    CHECK(res.content_type == "application/problem+json");
    const auto body = nlohmann::json::parse(res.body);
    CHECK(body.at("type") == std::string("/problems/") + row.name);
    CHECK(body.at("title") == std::string(info.title));
    CHECK(body.at("status") == row.status);
    CHECK(body.at("detail") == "what happened");
    CHECK(body.at("instance") == "/v1/stores/s");
    CHECK(body.at("error_code") == info.error_code);

    int retry_after_headers = 0;
    for (const auto& [n, v] : res.headers) {
      if (n == "Retry-After") {
        ++retry_after_headers;
        CHECK(v == "7");
      }
    }
    CHECK(retry_after_headers == (row.status == 503 ? 1 : 0));
  }
}

TEST_CASE("problem: instance is omitted when empty, non-UTF-8 detail does not throw") {
  const auto res = problem(failure_reason::bad_key_encoding, std::string("key \xFF\xFE", 6));
  const auto body = nlohmann::json::parse(res.body);
  CHECK_FALSE(body.contains("instance"));
  CHECK(body.at("detail").get<std::string>().rfind("key ", 0) == 0);
}

TEST_CASE("reason_for: module statuses map to documented reasons") {
  CHECK(reason_for(kstate::unavailable("x")) == failure_reason::not_caught_up);
  CHECK(reason_for(kstate::invalid_argument("x")) == failure_reason::bad_request);
  CHECK(reason_for(kstate::not_found_error("x")) == failure_reason::unknown_store);
  CHECK(reason_for(kstate::io_error("x")) == failure_reason::internal);
  CHECK(reason_for(kstate::internal_error("x")) == failure_reason::internal);
}

// ---------------------------------------------------------------------------------
// live server

namespace {

using response = http::response<http::string_body>;

// A blocking-looking client built on async operations, so every wait has a deadline
// and a server bug fails the test instead of hanging it.
class client {
 public:
  explicit client(uint16_t port) {
    beast::error_code out;
    stream_.expires_after(5s);
    stream_.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port),
                          [&](beast::error_code ec) { out = ec; });
    run();
    REQUIRE_MESSAGE(!out, out.message());
  }

  beast::error_code send(std::string_view raw) {
    beast::error_code out;
    stream_.expires_after(5s);
    net::async_write(stream_, net::buffer(raw), [&](beast::error_code ec, std::size_t) { out = ec; });
    run();
    return out;
  }

  beast::error_code read(response& res) {
    beast::error_code out;
    stream_.expires_after(5s);
    http::async_read(stream_, buf_, res, [&](beast::error_code ec, std::size_t) { out = ec; });
    run();
    return out;
  }

  // Writes and reads at the same time: for requests the server answers before it has
  // read all of them (431, 413), where a client that only writes could block.
  beast::error_code exchange(std::string_view raw, response& res) {
    beast::error_code read_ec;
    stream_.expires_after(5s);
    net::async_write(stream_, net::buffer(raw), [](beast::error_code, std::size_t) {
      // Ignored on purpose: the server may close before taking every byte.
    });
    http::async_read(stream_, buf_, res, [&](beast::error_code ec, std::size_t) { read_ec = ec; });
    run();
    return read_ec;
  }

  // Reads until the server closes the connection. Returns the error that ended the
  // read: eof / reset when the server closed, timeout when it did not within `limit`.
  beast::error_code wait_closed(std::chrono::milliseconds limit) {
    beast::error_code out;
    stream_.expires_after(limit);
    read_until_error(out);
    run();
    return out;
  }

 private:
  void read_until_error(beast::error_code& out) {
    stream_.async_read_some(net::buffer(scratch_), [this, &out](beast::error_code ec, std::size_t) {
      if (ec) {
        out = ec;
        return;
      }
      read_until_error(out);
    });
  }

  void run() {
    ioc_.restart();
    ioc_.run();
  }

  net::io_context ioc_;
  beast::tcp_stream stream_{ioc_};
  beast::flat_buffer buf_;
  char scratch_[1024];
};

std::string get(std::string_view target, std::string_view extra_headers = "") {
  return "GET " + std::string(target) + " HTTP/1.1\r\nHost: localhost\r\n" + std::string(extra_headers) + "\r\n";
}

// Echoes what the server parsed, so tests can see the request the handler got.
http_response echo(const http_request& req) {
  if (req.segments.size() == 1 && req.segments[0] == "throw") throw std::runtime_error("secret internals");
  if (req.segments.size() == 1 && req.segments[0] == "slow") std::this_thread::sleep_for(300ms);
  nlohmann::json j;
  j["method"] = req.method;
  j["segments"] = req.segments;
  j["body"] = req.body;
  j["request_id"] = req.request_id;
  j["custom"] = req.header("X-Custom").value_or("");
  http_response res;
  res.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  res.with_header("X-Extra", "yes");
  return res;
}

struct running_server {
  explicit running_server(http_config cfg = {}, http_handler h = echo) {
    cfg.port = 0;
    cfg.threads = 2;
    server = std::make_unique<http_server>(std::move(cfg), std::move(h));
    auto s = server->start();
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(server->port() != 0);
  }
  uint16_t port() const { return server->port(); }
  std::unique_ptr<http_server> server;
};

nlohmann::json json_of(const response& res) { return nlohmann::json::parse(res.body()); }

void check_problem(const response& res, unsigned status, int error_code) {
  CHECK(res.result_int() == status);
  CHECK(res[http::field::content_type] == "application/problem+json");
  CHECK(res[http::field::server] == "kstate");
  CHECK_FALSE(res["X-Request-Id"].empty());
  const auto body = json_of(res);
  CHECK(body.at("status") == status);
  CHECK(body.at("error_code") == error_code);
}

}  // namespace

TEST_CASE("server: one keep-alive connection answers three requests in a row") {
  running_server srv;
  client c(srv.port());
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(!c.send(get("/v1/stores/a%2Fb/keys/k" + std::to_string(i), "X-Custom: c\r\n")));
    response res;
    REQUIRE(!c.read(res));
    CHECK(res.result_int() == 200);
    CHECK(res.keep_alive());
    CHECK(res[http::field::server] == "kstate");
    CHECK(res[http::field::content_type] == "application/json");
    CHECK(res["X-Extra"] == "yes");
    const auto body = json_of(res);
    CHECK(body["method"] == "GET");
    CHECK(body["segments"] == nlohmann::json({"v1", "stores", "a/b", "keys", "k" + std::to_string(i)}));
    CHECK(body["custom"] == "c");
    CHECK(body["request_id"] == std::string(res["X-Request-Id"]));
  }
}

TEST_CASE("server: pipelined requests are answered in order") {
  running_server srv;
  client c(srv.port());
  REQUIRE(!c.send(get("/one") + get("/two")));
  response a, b;
  REQUIRE(!c.read(a));
  REQUIRE(!c.read(b));
  CHECK(json_of(a)["segments"] == nlohmann::json({"one"}));
  CHECK(json_of(b)["segments"] == nlohmann::json({"two"}));
}

TEST_CASE("server: a sane X-Request-Id is echoed, an insane one is replaced") {
  running_server srv;
  client c(srv.port());
  REQUIRE(!c.send(get("/x", "X-Request-Id: abc-1.2_3\r\n")));
  response res;
  REQUIRE(!c.read(res));
  CHECK(res["X-Request-Id"] == "abc-1.2_3");
  CHECK(json_of(res)["request_id"] == "abc-1.2_3");

  REQUIRE(!c.send(get("/x", "X-Request-Id: has space\r\n")));
  response res2;
  REQUIRE(!c.read(res2));
  const std::string generated(res2["X-Request-Id"]);
  CHECK_FALSE(generated.empty());
  CHECK(generated != "has space");
  CHECK(json_of(res2)["request_id"] == generated);

  REQUIRE(!c.send(get("/x", "X-Request-Id: " + std::string(129, 'a') + "\r\n")));
  response res3;
  REQUIRE(!c.read(res3));
  CHECK(res3["X-Request-Id"].size() < 129);
  CHECK(res3["X-Request-Id"] != generated);  // generated ids are unique
}

TEST_CASE("server: POST body reaches the handler, Expect: 100-continue is honoured") {
  running_server srv;
  client c(srv.port());
  REQUIRE(!c.send("POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  response interim;
  REQUIRE(!c.read(interim));
  CHECK(interim.result_int() == 100);
  REQUIRE(!c.send("hello"));
  response res;
  REQUIRE(!c.read(res));
  CHECK(res.result_int() == 200);
  CHECK(json_of(res)["body"] == "hello");
  CHECK(json_of(res)["method"] == "POST");
}

TEST_CASE("server: bad percent-encoding is a 400 problem and the server keeps serving") {
  running_server srv;
  {
    client c(srv.port());
    REQUIRE(!c.send(get("/x/%zz")));
    response res;
    REQUIRE(!c.read(res));
    check_problem(res, 400, 40003);
    CHECK(json_of(res)["type"] == "/problems/bad_path_encoding");
    CHECK(json_of(res)["instance"] == "/x/%zz");
  }
  client c2(srv.port());
  REQUIRE(!c2.send(get("/still/here")));
  response res;
  REQUIRE(!c2.read(res));
  CHECK(res.result_int() == 200);
  CHECK(json_of(res)["segments"] == nlohmann::json({"still", "here"}));
}

TEST_CASE("server: a malformed request line is a 400 problem") {
  running_server srv;
  client c(srv.port());
  response res;
  REQUIRE(!c.exchange("NOT A REQUEST\r\n\r\n", res));
  check_problem(res, 400, 40001);
  CHECK_FALSE(res.keep_alive());
}

TEST_CASE("server: a 1 MB header is a 431 problem") {
  running_server srv;
  client c(srv.port());
  response res;
  REQUIRE(!c.exchange(get("/x", "X-Big: " + std::string(1024 * 1024, 'a') + "\r\n"), res));
  check_problem(res, 431, 43101);
  CHECK_FALSE(res.keep_alive());
}

TEST_CASE("server: a body over the limit is a 413 problem") {
  http_config cfg;
  cfg.max_body_bytes = 1024;
  running_server srv(cfg);
  SUBCASE("declared by Content-Length") {
    client c(srv.port());
    response res;
    REQUIRE(!c.exchange("POST /p?x=1 HTTP/1.1\r\nHost: x\r\nX-Request-Id: big-1\r\nContent-Length: 4096\r\n\r\n" +
                            std::string(4096, 'b'),
                        res));
    check_problem(res, 413, 41301);
    CHECK(res["X-Request-Id"] == "big-1");  // rejected requests still carry the client's id
    CHECK(json_of(res)["instance"] == "/p");
  }
  SUBCASE("discovered while reading a chunked body") {
    client c(srv.port());
    std::string chunked = "POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 4; ++i) chunked += "400\r\n" + std::string(1024, 'c') + "\r\n";
    chunked += "0\r\n\r\n";
    response res;
    REQUIRE(!c.exchange(chunked, res));
    check_problem(res, 413, 41301);
  }
  SUBCASE("a body at the limit is accepted") {
    client c(srv.port());
    response res;
    REQUIRE(!c.exchange("POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n" + std::string(1024, 'b'), res));
    CHECK(res.result_int() == 200);
  }
}

TEST_CASE("server: a target over max_target_bytes is a 414 problem") {
  http_config cfg;
  cfg.max_target_bytes = 1024;
  running_server srv(cfg);
  SUBCASE("longer than the target limit, within the header limit") {
    client c(srv.port());
    response res;
    REQUIRE(!c.exchange(get("/" + std::string(2000, 'k')), res));
    check_problem(res, 414, 41401);
  }
  SUBCASE("longer than the whole header limit") {
    client c(srv.port());
    response res;
    REQUIRE(!c.exchange(get("/" + std::string(64 * 1024, 'k')), res));
    check_problem(res, 414, 41401);
  }
  SUBCASE("at the limit is accepted") {
    client c(srv.port());
    response res;
    REQUIRE(!c.exchange(get("/" + std::string(1023, 'k')), res));
    CHECK(res.result_int() == 200);
  }
}

TEST_CASE("server: a client stalling mid request line is cut off after read_timeout") {
  http_config cfg;
  cfg.read_timeout = 300ms;
  running_server srv(cfg);
  client c(srv.port());
  REQUIRE(!c.send("GET /slowl"));
  const auto t0 = std::chrono::steady_clock::now();
  const auto ec = c.wait_closed(5s);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(ec != beast::error::timeout);  // the server closed, not our own deadline
  CHECK(elapsed >= 200ms);
  CHECK(elapsed < 2s);
}

TEST_CASE("server: an idle keep-alive connection is closed after read_timeout") {
  http_config cfg;
  cfg.read_timeout = 300ms;
  running_server srv(cfg);
  client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  response res;
  REQUIRE(!c.read(res));
  CHECK(res.result_int() == 200);
  const auto ec = c.wait_closed(5s);
  CHECK(ec != beast::error::timeout);
}

TEST_CASE("server: a throwing handler becomes a 500 problem, not a crash") {
  running_server srv;
  client c(srv.port());
  REQUIRE(!c.send(get("/throw")));
  response res;
  REQUIRE(!c.read(res));
  check_problem(res, 500, 50001);
  CHECK(res.body().find("secret internals") == std::string::npos);
  // Same connection, next request: the session survived.
  REQUIRE(!c.send(get("/ok")));
  response res2;
  REQUIRE(!c.read(res2));
  CHECK(res2.result_int() == 200);
}

TEST_CASE("server: a handler returning a header with CRLF becomes a 500") {
  running_server srv({}, [](const http_request&) {
    http_response r;
    r.with_header("X-Evil", "a\r\nSet-Cookie: x=1");
    return r;
  });
  client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  response res;
  REQUIRE(!c.read(res));
  check_problem(res, 500, 50001);
  CHECK(res["Set-Cookie"].empty());
}

TEST_CASE("server: stop() returns promptly with idle connections and is idempotent") {
  http_config cfg;
  cfg.shutdown_grace = 5s;
  running_server srv(cfg);
  client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  response res;
  REQUIRE(!c.read(res));
  REQUIRE(res.keep_alive());

  auto t0 = std::chrono::steady_clock::now();
  srv.server->stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(c.wait_closed(2s) != beast::error::timeout);  // the idle connection was closed

  t0 = std::chrono::steady_clock::now();
  srv.server->stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 100ms);

  // Nothing listens any more.
  net::io_context ioc;
  tcp::socket s(ioc);
  beast::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), srv.port()), ec);
  CHECK(ec);
}

TEST_CASE("server: stop() lets an in-flight response finish") {
  http_config cfg;
  cfg.shutdown_grace = 5s;
  running_server srv(cfg);
  std::atomic<unsigned> status{0};
  std::atomic<bool> keep_alive{true};
  std::thread t([&] {
    client c(srv.port());
    if (c.send(get("/slow"))) return;
    response res;
    if (c.read(res)) return;
    status = res.result_int();
    keep_alive = res.keep_alive();
  });
  std::this_thread::sleep_for(100ms);  // the handler is now sleeping
  const auto t0 = std::chrono::steady_clock::now();
  srv.server->stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  t.join();
  CHECK(status == 200);
  CHECK_FALSE(keep_alive);  // told to go away
  CHECK(elapsed < 2s);
}

TEST_CASE("server: start() reports a port that cannot be bound") {
  running_server first;
  http_config cfg;
  cfg.port = first.port();
  http_server second(cfg, echo);
  auto s = second.start();
  CHECK_FALSE(s.ok());
  CHECK(s.code() == status_code::io_error);
}
