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
#include <condition_variable>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "http/message.h"
#include "http/server.h"
#include "http/problem.h"
#include "http/url.h"

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using kstate::status_code;
using namespace kstate::http;

namespace {

request parsed(std::string_view target) {
  request req;
  auto s = parse_target(target, req);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return req;
}

status_code parse_code(std::string_view target) {
  request req;
  return parse_target(target, req).code();
}

std::vector<std::string> values(const request& req, const std::string& key) {
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

TEST_CASE("parse_target: dot segments are kept as sent, the first one too") {
  // Boost.URL's segments() drops a leading "." segment; the router must see it, or
  // "/./v1/stores" would answer like "/v1/stores" while "/v1/./stores" does not.
  CHECK(parsed("/./v1/stores").segments == std::vector<std::string>{".", "v1", "stores"});
  CHECK(parsed("/./").segments == std::vector<std::string>{".", ""});
  CHECK(parsed("/.//a").segments == std::vector<std::string>{".", "", "a"});
  CHECK(parsed("/v1/./stores").segments == std::vector<std::string>{"v1", ".", "stores"});
  CHECK(parsed("/../a").segments == std::vector<std::string>{"..", "a"});
  CHECK(parsed("/%2e/a%2Fb?x=1").segments == std::vector<std::string>{".", "a/b"});
}

TEST_CASE("request: header() is case-insensitive, param() returns the first value") {
  request req;
  req.headers = {{"content-type", "text/plain"}, {"x-a", "1"}, {"x-a", "2"}};
  CHECK(req.header("Content-Type") == "text/plain");
  CHECK(req.header("X-A") == "1");
  CHECK_FALSE(req.header("accept").has_value());
  req.query = {{"k", "first"}, {"k", "second"}};
  CHECK(req.param("k") == "first");
}

// ---------------------------------------------------------------------------------
// live server

namespace {

using wire_response = bhttp::response<bhttp::string_body>;

// A blocking-looking client built on async operations, so every wait has a deadline
// and a server bug fails the test instead of hanging it.
class wire_client {
 public:
  // `rcvbuf` > 0 shrinks the socket's receive buffer before connecting (the TCP window
  // is negotiated at connect), so a client that stops reading pushes back quickly.
  explicit wire_client(uint16_t port, int rcvbuf = 0) {
    beast::error_code out;
    if (rcvbuf > 0) {
      stream_.socket().open(tcp::v4());
      stream_.socket().set_option(net::socket_base::receive_buffer_size(rcvbuf));
    }
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

  beast::error_code read(wire_response& res) {
    beast::error_code out;
    stream_.expires_after(5s);
    bhttp::async_read(stream_, buf_, res, [&](beast::error_code ec, std::size_t) { out = ec; });
    run();
    return out;
  }

  // Writes and reads at the same time: for requests the server answers before it has
  // read all of them (431, 413), where a client that only writes could block.
  beast::error_code exchange(std::string_view raw, wire_response& res) {
    beast::error_code read_ec;
    stream_.expires_after(5s);
    net::async_write(stream_, net::buffer(raw), [](beast::error_code, std::size_t) {
      // Ignored on purpose: the server may close before taking every byte.
    });
    bhttp::async_read(stream_, buf_, res, [&](beast::error_code ec, std::size_t) { read_ec = ec; });
    run();
    return read_ec;
  }

  // Reads until the server closes the connection. Returns the error that ended the
  // read: eof / reset when the server closed, timeout when it did not within `limit`.
  beast::error_code wait_closed(std::chrono::milliseconds limit) {
    std::string ignored;
    return read_raw(ignored, limit);
  }

  // Like wait_closed(), keeping the raw bytes (for checking framing); bytes already
  // buffered by an earlier read come first. With `marker`, stops once it was received.
  beast::error_code read_raw(std::string& raw, std::chrono::milliseconds limit, std::string_view marker = {}) {
    raw.append(static_cast<const char*>(buf_.cdata().data()), buf_.size());
    buf_.consume(buf_.size());
    if (!marker.empty() && raw.find(marker) != std::string::npos) return {};
    beast::error_code out;
    stream_.expires_after(limit);
    read_until_error(out, raw, marker);
    run();
    return out;
  }

 private:
  void read_until_error(beast::error_code& out, std::string& raw, std::string_view marker) {
    stream_.async_read_some(net::buffer(scratch_), [this, &out, &raw, marker](beast::error_code ec, std::size_t n) {
      raw.append(scratch_, n);
      if (ec) {
        out = ec;
        return;
      }
      if (!marker.empty() && raw.find(marker) != std::string::npos) return;
      read_until_error(out, raw, marker);
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
response echo(const request& req) {
  if (req.segments.size() == 1 && req.segments[0] == "throw") throw std::runtime_error("secret internals");
  if (req.segments.size() == 1 && req.segments[0] == "slow") std::this_thread::sleep_for(300ms);
  nlohmann::json j;
  j["method"] = req.method;
  j["segments"] = req.segments;
  j["body"] = req.body;
  j["request_id"] = req.request_id;
  j["custom"] = req.header("X-Custom").value_or("");
  response res;
  res.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  res.with_header("X-Extra", "yes");
  return res;
}

// An application's error scheme as kstate installs one (server_config::render_error),
// reduced to the rows these tests check: the server's own errors must be rendered by it.
response test_errors(server_error e, std::string_view detail, std::string_view instance) {
  struct row {
    unsigned status;
    int code;
    const char* type;
  };
  row r{500, 50001, "internal"};
  switch (e) {
    case server_error::bad_request: r = {400, 40001, "bad_request"}; break;
    case server_error::bad_target: r = {400, 40003, "bad_path_encoding"}; break;
    case server_error::payload_too_large: r = {413, 41301, "payload_too_large"}; break;
    case server_error::uri_too_long: r = {414, 41401, "uri_too_long"}; break;
    case server_error::headers_too_large: r = {431, 43101, "headers_too_large"}; break;
    case server_error::internal: r = {500, 50001, "internal"}; break;
    case server_error::overloaded: r = {503, 50306, "too_many_connections"}; break;
  }
  return problem(r.status, std::string("/problems/") + r.type, "title", detail, instance, {{"error_code", r.code}});
}

struct running_server {
  explicit running_server(server_config cfg = {}, handler h = echo) {
    cfg.port = 0;
    cfg.threads = 2;
    if (!cfg.render_error) cfg.render_error = test_errors;
    instance = std::make_unique<server>(std::move(cfg), std::move(h));
    auto s = instance->start();
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(instance->port() != 0);
  }
  uint16_t port() const { return instance->port(); }
  std::unique_ptr<server> instance;
};

nlohmann::json json_of(const wire_response& res) { return nlohmann::json::parse(res.body()); }

void check_problem(const wire_response& res, unsigned status, int error_code) {
  CHECK(res.result_int() == status);
  CHECK(res[bhttp::field::content_type] == "application/problem+json");
  CHECK(res[bhttp::field::server] == "kstate");
  CHECK_FALSE(res["X-Request-Id"].empty());
  const auto body = json_of(res);
  CHECK(body.at("status") == status);
  CHECK(body.at("error_code") == error_code);
}

}  // namespace

TEST_CASE("server: one keep-alive connection answers three requests in a row") {
  running_server srv;
  wire_client c(srv.port());
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(!c.send(get("/v1/stores/a%2Fb/keys/k" + std::to_string(i), "X-Custom: c\r\n")));
    wire_response res;
    REQUIRE(!c.read(res));
    CHECK(res.result_int() == 200);
    CHECK(res.keep_alive());
    CHECK(res[bhttp::field::server] == "kstate");
    CHECK(res[bhttp::field::content_type] == "application/json");
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
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/one") + get("/two")));
  wire_response a, b;
  REQUIRE(!c.read(a));
  REQUIRE(!c.read(b));
  CHECK(json_of(a)["segments"] == nlohmann::json({"one"}));
  CHECK(json_of(b)["segments"] == nlohmann::json({"two"}));
}

TEST_CASE("server: a sane X-Request-Id is echoed, an insane one is replaced") {
  running_server srv;
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/x", "X-Request-Id: abc-1.2_3\r\n")));
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res["X-Request-Id"] == "abc-1.2_3");
  CHECK(json_of(res)["request_id"] == "abc-1.2_3");

  REQUIRE(!c.send(get("/x", "X-Request-Id: has space\r\n")));
  wire_response res2;
  REQUIRE(!c.read(res2));
  const std::string generated(res2["X-Request-Id"]);
  CHECK_FALSE(generated.empty());
  CHECK(generated != "has space");
  CHECK(json_of(res2)["request_id"] == generated);

  REQUIRE(!c.send(get("/x", "X-Request-Id: " + std::string(129, 'a') + "\r\n")));
  wire_response res3;
  REQUIRE(!c.read(res3));
  CHECK(res3["X-Request-Id"].size() < 129);
  CHECK(res3["X-Request-Id"] != generated);  // generated ids are unique
}

TEST_CASE("server: POST body reaches the handler, Expect: 100-continue is honoured") {
  running_server srv;
  wire_client c(srv.port());
  REQUIRE(!c.send("POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  wire_response interim;
  REQUIRE(!c.read(interim));
  CHECK(interim.result_int() == 100);
  REQUIRE(!c.send("hello"));
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res.result_int() == 200);
  CHECK(json_of(res)["body"] == "hello");
  CHECK(json_of(res)["method"] == "POST");
}

TEST_CASE("server: bad percent-encoding is a 400 problem and the server keeps serving") {
  running_server srv;
  {
    wire_client c(srv.port());
    REQUIRE(!c.send(get("/x/%zz")));
    wire_response res;
    REQUIRE(!c.read(res));
    check_problem(res, 400, 40003);
    CHECK(json_of(res)["type"] == "/problems/bad_path_encoding");
    CHECK(json_of(res)["instance"] == "/x/%zz");
  }
  wire_client c2(srv.port());
  REQUIRE(!c2.send(get("/still/here")));
  wire_response res;
  REQUIRE(!c2.read(res));
  CHECK(res.result_int() == 200);
  CHECK(json_of(res)["segments"] == nlohmann::json({"still", "here"}));
}

TEST_CASE("server: a malformed request line is a 400 problem") {
  running_server srv;
  wire_client c(srv.port());
  wire_response res;
  REQUIRE(!c.exchange("NOT A REQUEST\r\n\r\n", res));
  check_problem(res, 400, 40001);
  CHECK_FALSE(res.keep_alive());
}

TEST_CASE("server: a 1 MB header is a 431 problem") {
  running_server srv;
  wire_client c(srv.port());
  wire_response res;
  REQUIRE(!c.exchange(get("/x", "X-Big: " + std::string(1024 * 1024, 'a') + "\r\n"), res));
  check_problem(res, 431, 43101);
  CHECK_FALSE(res.keep_alive());
}

// ---------------------------------------------------------------------------------
// Request smuggling (RFC 9112 section 6): a message whose body length another hop could
// read differently is refused and its connection closed, so what follows it on the
// wire is never read as a request.

namespace {

// A handler that counts the requests it was given and echoes them.
struct counting_handler {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  handler fn() {
    auto c = calls;
    return [c](const request& req) {
      ++*c;
      return echo(req);
    };
  }
};

// Sends `head` + `body`, expects one 400 problem, then the connection closed with nothing
// more on it; the handler was never called.
void check_refused_framing(const std::string& head, const std::string& body) {
  counting_handler h;
  running_server srv({}, h.fn());
  wire_client c(srv.port());
  wire_response res;
  REQUIRE(!c.exchange(head + body, res));
  check_problem(res, 400, 40001);
  CHECK_FALSE(res.keep_alive());
  std::string rest;
  auto ec = c.read_raw(rest, 3s);
  CHECK(ec != beast::error::timeout);  // closed by the server
  CHECK(rest.empty());                  // no second answer: the body was not a request
  CHECK(*h.calls == 0);
}

const std::string smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

}  // namespace

TEST_CASE("smuggling: Transfer-Encoding identity is refused, its body never becomes a request") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n", smuggled);
}

TEST_CASE("smuggling: chunked that is not the final coding is refused") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", smuggled);
}

TEST_CASE("smuggling: a coding before chunked is refused (not decoded here)") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                        "0\r\n\r\n" + smuggled);
}

TEST_CASE("smuggling: two Transfer-Encoding fields are refused") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
                        "0\r\n\r\n" + smuggled);
}

TEST_CASE("smuggling: Transfer-Encoding with Content-Length is refused, in either order") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                        "0\r\n\r\n" + smuggled);
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                        "0\r\n\r\n" + smuggled);
}

TEST_CASE("smuggling: Content-Length twice or as a list is refused even when the values agree") {
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", "{}" + smuggled);
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n", "{}" + smuggled);
}

TEST_CASE("smuggling: Transfer-Encoding in an HTTP/1.0 request is refused") {
  check_refused_framing("POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "0\r\n\r\n" + smuggled);
}

TEST_CASE("smuggling: a plain chunked body is still accepted and the connection reused") {
  counting_handler h;
  running_server srv({}, h.fn());
  wire_client c(srv.port());
  REQUIRE(!c.send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" +
                  get("/b")));
  wire_response a, b;
  REQUIRE(!c.read(a));
  REQUIRE(!c.read(b));
  CHECK(json_of(a)["body"] == "abc");
  CHECK(json_of(b)["segments"] == nlohmann::json({"b"}));
  CHECK(*h.calls == 2);
}

TEST_CASE("limits: chunk extensions count against the header limit") {
  server_config cfg;
  cfg.max_header_bytes = 2048;
  counting_handler h;
  running_server srv(cfg, h.fn());
  wire_client c(srv.port());
  std::string body;
  for (int i = 0; i < 40; ++i) body += "1;ext=" + std::string(100, 'e') + "\r\nx\r\n";  // 4 KB of extensions
  body += "0\r\n\r\n";
  wire_response res;
  REQUIRE(!c.exchange("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body, res));
  check_problem(res, 431, 43101);
  CHECK_FALSE(res.keep_alive());
  CHECK(*h.calls == 0);
}

TEST_CASE("limits: trailers count against the header limit and never reach the handler") {
  server_config cfg;
  cfg.max_header_bytes = 2048;
  running_server srv(cfg);
  {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
                    "X-Custom: from-trailer\r\n\r\n"));
    REQUIRE(!c.read(res));
    CHECK(res.result_int() == 200);
    CHECK(json_of(res)["body"] == "abc");
    CHECK(json_of(res)["custom"] == "");  // the trailer field is not a header
  }
  wire_client c(srv.port());
  wire_response res;
  REQUIRE(!c.exchange("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
                      "X-Big: " + std::string(4096, 't') + "\r\n\r\n", res));
  check_problem(res, 431, 43101);
  CHECK_FALSE(res.keep_alive());
}

TEST_CASE("limits: a chunk line that never ends is cut off, not buffered") {
  server_config cfg;
  cfg.max_header_bytes = 2048;
  counting_handler h;
  running_server srv(cfg, h.fn());
  wire_client c(srv.port());
  wire_response res;
  // 1 MiB of chunk-size digits without a line end: more than the read buffer holds.
  REQUIRE(!c.exchange("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;" +
                      std::string(1024 * 1024, 'a'), res));
  check_problem(res, 431, 43101);
  CHECK(*h.calls == 0);
}

TEST_CASE("limits: beyond max_connections a connection gets 503 and is closed; the others keep working") {
  server_config cfg;
  cfg.max_connections = 2;
  running_server srv(cfg);
  wire_client a(srv.port()), b(srv.port());
  // Both are served, so both are open sessions before the third connects.
  for (auto* c : {&a, &b}) {
    REQUIRE(!c->send(get("/open")));
    wire_response res;
    REQUIRE(!c->read(res));
    CHECK(res.result_int() == 200);
  }
  {
    wire_client over(srv.port());
    wire_response res;
    REQUIRE(!over.exchange(get("/over"), res));
    check_problem(res, 503, 50306);
    CHECK_FALSE(res.keep_alive());
    CHECK_FALSE(res[bhttp::field::retry_after].empty());
    CHECK(over.wait_closed(3s) != beast::error::timeout);
  }
  CHECK(srv.instance->refused_connections() == 1);
  // The open connections still answer.
  REQUIRE(!a.send(get("/still")));
  wire_response res;
  REQUIRE(!a.read(res));
  CHECK(res.result_int() == 200);
}

TEST_CASE("server: a body over the limit is a 413 problem") {
  server_config cfg;
  cfg.max_body_bytes = 1024;
  running_server srv(cfg);
  SUBCASE("declared by Content-Length") {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.exchange("POST /p?x=1 HTTP/1.1\r\nHost: x\r\nX-Request-Id: big-1\r\nContent-Length: 4096\r\n\r\n" +
                            std::string(4096, 'b'),
                        res));
    check_problem(res, 413, 41301);
    CHECK(res["X-Request-Id"] == "big-1");  // rejected requests still carry the client's id
    CHECK(json_of(res)["instance"] == "/p");
  }
  SUBCASE("discovered while reading a chunked body") {
    wire_client c(srv.port());
    std::string chunked = "POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 4; ++i) chunked += "400\r\n" + std::string(1024, 'c') + "\r\n";
    chunked += "0\r\n\r\n";
    wire_response res;
    REQUIRE(!c.exchange(chunked, res));
    check_problem(res, 413, 41301);
  }
  SUBCASE("a body at the limit is accepted") {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.exchange("POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n" + std::string(1024, 'b'), res));
    CHECK(res.result_int() == 200);
  }
}

TEST_CASE("server: a target over max_target_bytes is a 414 problem") {
  server_config cfg;
  cfg.max_target_bytes = 1024;
  running_server srv(cfg);
  SUBCASE("longer than the target limit, within the header limit") {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.exchange(get("/" + std::string(2000, 'k')), res));
    check_problem(res, 414, 41401);
  }
  SUBCASE("longer than the whole header limit") {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.exchange(get("/" + std::string(64 * 1024, 'k')), res));
    check_problem(res, 414, 41401);
  }
  SUBCASE("at the limit is accepted") {
    wire_client c(srv.port());
    wire_response res;
    REQUIRE(!c.exchange(get("/" + std::string(1023, 'k')), res));
    CHECK(res.result_int() == 200);
  }
}

TEST_CASE("server: a client stalling mid request line is cut off after read_timeout") {
  server_config cfg;
  cfg.read_timeout = 300ms;
  running_server srv(cfg);
  wire_client c(srv.port());
  REQUIRE(!c.send("GET /slowl"));
  const auto t0 = std::chrono::steady_clock::now();
  const auto ec = c.wait_closed(5s);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(ec != beast::error::timeout);  // the server closed, not our own deadline
  CHECK(elapsed >= 200ms);
  CHECK(elapsed < 2s);
}

TEST_CASE("server: an idle keep-alive connection is closed after read_timeout") {
  server_config cfg;
  cfg.read_timeout = 300ms;
  running_server srv(cfg);
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res.result_int() == 200);
  const auto ec = c.wait_closed(5s);
  CHECK(ec != beast::error::timeout);
}

TEST_CASE("server: a throwing handler becomes a 500 problem, not a crash") {
  running_server srv;
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/throw")));
  wire_response res;
  REQUIRE(!c.read(res));
  check_problem(res, 500, 50001);
  CHECK(res.body().find("secret internals") == std::string::npos);
  // Same connection, next request: the session survived.
  REQUIRE(!c.send(get("/ok")));
  wire_response res2;
  REQUIRE(!c.read(res2));
  CHECK(res2.result_int() == 200);
}

TEST_CASE("server: a handler returning a header with CRLF becomes a 500") {
  running_server srv({}, [](const request&) {
    response r;
    r.with_header("X-Evil", "a\r\nSet-Cookie: x=1");
    return r;
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  wire_response res;
  REQUIRE(!c.read(res));
  check_problem(res, 500, 50001);
  CHECK(res["Set-Cookie"].empty());
}

TEST_CASE("server: stop() returns promptly with idle connections and is idempotent") {
  server_config cfg;
  cfg.shutdown_grace = 5s;
  running_server srv(cfg);
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/x")));
  wire_response res;
  REQUIRE(!c.read(res));
  REQUIRE(res.keep_alive());

  auto t0 = std::chrono::steady_clock::now();
  srv.instance->stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(c.wait_closed(2s) != beast::error::timeout);  // the idle connection was closed

  t0 = std::chrono::steady_clock::now();
  srv.instance->stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 100ms);

  // Nothing listens any more.
  net::io_context ioc;
  tcp::socket s(ioc);
  beast::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), srv.port()), ec);
  CHECK(ec);
}

TEST_CASE("server: stop() lets an in-flight response finish") {
  server_config cfg;
  cfg.shutdown_grace = 5s;
  running_server srv(cfg);
  std::atomic<unsigned> status{0};
  std::atomic<bool> keep_alive{true};
  std::thread t([&] {
    wire_client c(srv.port());
    if (c.send(get("/slow"))) return;
    wire_response res;
    if (c.read(res)) return;
    status = res.result_int();
    keep_alive = res.keep_alive();
  });
  std::this_thread::sleep_for(100ms);  // the handler is now sleeping
  const auto t0 = std::chrono::steady_clock::now();
  srv.instance->stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  t.join();
  CHECK(status == 200);
  CHECK_FALSE(keep_alive);  // told to go away
  CHECK(elapsed < 2s);
}

TEST_CASE("server: start() reports a port that cannot be bound") {
  running_server first;
  server_config cfg;
  cfg.port = first.port();
  server second(cfg, echo);
  auto s = second.start();
  CHECK_FALSE(s.ok());
  CHECK(s.code() == status_code::io_error);
}

// ---------------------------------------------------------------------------------
// streamed (chunked) responses

namespace {

// Hands out `pieces` numbered lines, one per next() call; counts the calls and reports
// its own destruction (a real source holds a RocksDB snapshot until destroyed).
struct counting_source : sync_body_source {
  struct probe {
    std::atomic<int> calls{0};
    std::atomic<bool> destroyed{false};
  };
  counting_source(std::shared_ptr<probe> p, int pieces, std::size_t piece_bytes = 0, int throw_at = -1)
      : probe_(std::move(p)), pieces_(pieces), piece_bytes_(piece_bytes), throw_at_(throw_at) {}
  ~counting_source() override { probe_->destroyed = true; }

  bool produce(std::string& out) override {
    const int i = probe_->calls++;
    if (i == throw_at_) throw std::runtime_error("storage failed mid-scan");
    if (piece_bytes_ > 0) {
      out.append(piece_bytes_, static_cast<char>('a' + i % 26));
    } else {
      out += line(i);
    }
    return i + 1 < pieces_;
  }

  static std::string line(int i) { return "{\"n\":" + std::to_string(i) + "}\n"; }

  std::shared_ptr<probe> probe_;
  int pieces_;
  std::size_t piece_bytes_;
  int throw_at_;
};

std::string expected_lines(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += counting_source::line(i);
  return out;
}

// The most a TCP socket's send buffer can grow to by autotuning (Linux: the third
// field of tcp_wmem); 4 MiB, the kernel default, where that cannot be read.
std::size_t max_send_buffer_bytes() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_wmem");
  std::size_t min = 0, initial = 0, max = 0;
  if (in >> min >> initial >> max && max > 0) return max;
  return 4 * 1024 * 1024;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("stream: 2,000 pieces arrive complete, in order, chunked; the connection is then reused") {
  auto probe = std::make_shared<counting_source::probe>();
  running_server srv({}, [probe](const request& req) {
    response r;
    if (req.path == "/scan") {
      r.content_type = "application/x-ndjson";
      r.body = "ignored when streaming";
      r.with_header("X-Extra", "yes");
      r.stream = std::make_shared<counting_source>(probe, 2000);
    } else {
      r.body = "{\"next\":true}";
    }
    return r;
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/scan")));
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res.result_int() == 200);
  CHECK(res.chunked());
  CHECK(res[bhttp::field::content_length].empty());
  CHECK(res[bhttp::field::content_type] == "application/x-ndjson");
  CHECK(res["X-Extra"] == "yes");
  CHECK_FALSE(res["X-Request-Id"].empty());
  CHECK(res.keep_alive());
  CHECK(res.body() == expected_lines(2000));
  CHECK(probe->calls == 2000);
  CHECK(wait_for([&] { return probe->destroyed.load(); }, 2s));  // released once complete

  REQUIRE(!c.send(get("/next")));
  wire_response res2;
  REQUIRE(!c.read(res2));
  CHECK(res2.result_int() == 200);
  CHECK(res2.body() == "{\"next\":true}");
}

TEST_CASE("stream: the body ends with the terminating chunk on the wire") {
  auto probe = std::make_shared<counting_source::probe>();
  running_server srv({}, [probe](const request&) {
    response r;
    r.stream = std::make_shared<counting_source>(probe, 3);
    return r;
  });
  wire_client c(srv.port());
  REQUIRE(!c.send("GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string raw;
  CHECK(c.read_raw(raw, 5s) != beast::error::timeout);
  CHECK(raw.find("Transfer-Encoding: chunked\r\n") != std::string::npos);
  const auto body_start = raw.find("\r\n\r\n");
  REQUIRE(body_start != std::string::npos);
  CHECK(raw.substr(body_start + 4) == "8\r\n{\"n\":0}\n\r\n8\r\n{\"n\":1}\n\r\n8\r\n{\"n\":2}\n\r\n0\r\n\r\n");
}

TEST_CASE("stream: empty pieces are skipped; a source that only returns empty pieces is cut off") {
  struct gappy : sync_body_source {
    int i = 0;
    bool produce(std::string& out) override {
      ++i;
      if (i % 3 == 0) out = "x" + std::to_string(i);
      return i < 30;
    }
  };
  struct stuck : sync_body_source {
    bool produce(std::string&) override { return true; }
  };
  running_server srv({}, [](const request& req) {
    response r;
    if (req.path == "/gappy") r.stream = std::make_shared<gappy>();
    else r.stream = std::make_shared<stuck>();
    return r;
  });
  {
    wire_client c(srv.port());
    REQUIRE(!c.send(get("/gappy")));
    wire_response res;
    REQUIRE(!c.read(res));
    std::string want;
    for (int i = 3; i <= 30; i += 3) want += "x" + std::to_string(i);
    CHECK(res.body() == want);
  }
  {
    wire_client c(srv.port());
    REQUIRE(!c.send(get("/stuck")));
    std::string raw;
    CHECK(c.read_raw(raw, 5s) != beast::error::timeout);  // closed by the server, not our deadline
    CHECK(raw.find("HTTP/1.1 200") == 0);
    CHECK(raw.find("0\r\n\r\n") == std::string::npos);  // no terminating chunk: truncated
  }
}

TEST_CASE("stream: next() is called only as fast as the client reads; a stalled client is cut off and the source released") {
  server_config cfg;
  cfg.read_timeout = 300ms;  // also the write deadline
  auto probe = std::make_shared<counting_source::probe>();
  static constexpr std::size_t piece = 64 * 1024;
  running_server srv(cfg, [probe](const request&) {
    response r;
    // 64 GiB in all, produced lazily: a server that drained it would be obvious.
    r.stream = std::make_shared<counting_source>(probe, 1 << 20, piece);
    return r;
  });
  wire_client c(srv.port(), 4 * 1024);
  REQUIRE(!c.send(get("/big")));
  std::string raw;
  REQUIRE(!c.read_raw(raw, 5s, "\r\n\r\n"));  // the header, then the client stops reading
  CHECK(raw.find("HTTP/1.1 200") == 0);

  std::this_thread::sleep_for(500ms);
  const int calls = probe->calls;
  // What may legitimately be in flight: the server's kernel send buffer (Linux grows it
  // automatically up to tcp_wmem's maximum, 4 MiB by default, i.e. 64 pieces), the
  // client's small receive buffer, the piece being written and the one being produced.
  const int bound = static_cast<int>(max_send_buffer_bytes() / piece) + 4;
  CAPTURE(calls);
  CAPTURE(bound);
  CHECK(calls >= 1);
  CHECK(calls <= bound);  // bounded by socket buffers, not by the source

  // The write deadline (300 ms) has passed with no progress: the connection is closed
  // and the source destroyed, without the client doing anything.
  CHECK(wait_for([&] { return probe->destroyed.load(); }, 3s));
  CHECK(probe->calls == calls);  // no more pieces produced after it stalled
}

TEST_CASE("stream: next() throwing mid-stream closes the connection without the final chunk") {
  auto probe = std::make_shared<counting_source::probe>();
  running_server srv({}, [probe](const request&) {
    response r;
    r.content_type = "application/x-ndjson";
    r.stream = std::make_shared<counting_source>(probe, 100, 0, /*throw_at=*/5);
    return r;
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/scan")));
  std::string raw;
  const auto ec = c.read_raw(raw, 5s);
  CHECK(ec != beast::error::timeout);  // the server closed
  CHECK(raw.find("HTTP/1.1 200") == 0);
  CHECK(raw.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(raw.find("{\"n\":4}") != std::string::npos);  // what came before the failure was sent
  CHECK(raw.find("{\"n\":5}") == std::string::npos);
  CHECK(raw.find("0\r\n\r\n") == std::string::npos);  // but never the end of the body
  CHECK(probe->calls == 6);
  CHECK(wait_for([&] { return probe->destroyed.load(); }, 2s));
}

TEST_CASE("stream: an HTTP/1.0 client gets the body unframed, ended by closing the connection") {
  auto probe = std::make_shared<counting_source::probe>();
  running_server srv({}, [probe](const request&) {
    response r;
    r.stream = std::make_shared<counting_source>(probe, 50);
    return r;
  });
  wire_client c(srv.port());
  REQUIRE(!c.send("GET /s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  std::string raw;
  CHECK(c.read_raw(raw, 5s) != beast::error::timeout);
  CHECK(raw.find("HTTP/1.0 200") == 0);
  CHECK(raw.find("Transfer-Encoding") == std::string::npos);
  const auto body_start = raw.find("\r\n\r\n");
  REQUIRE(body_start != std::string::npos);
  CHECK(raw.substr(body_start + 4) == expected_lines(50));
}

// ---------------------------------------------------------------------------------
// asynchronous handlers

namespace {

// Threads started by handlers, joined when the test ends.
struct background {
  ~background() {
    for (auto& t : threads) t.join();
  }
  void run(std::function<void()> f) {
    std::lock_guard lk(mu);
    threads.emplace_back(std::move(f));
  }
  std::mutex mu;
  std::vector<std::thread> threads;
};

response text(std::string body) {
  response r;
  r.content_type = "text/plain";
  r.body = std::move(body);
  return r;
}

struct running_async_server {
  running_async_server(server_config cfg, async_handler h) {
    cfg.port = 0;
    cfg.threads = 2;
    if (!cfg.render_error) cfg.render_error = test_errors;
    instance = std::make_unique<server>(std::move(cfg), std::move(h));
    auto s = instance->start();
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  uint16_t port() const { return instance->port(); }
  std::unique_ptr<server> instance;
};

}  // namespace

TEST_CASE("async: a reply from another thread 200 ms later reaches the client") {
  background bg;  // declared first: joined after the server is gone
  running_async_server srv({}, [&bg](const request& req, responder reply) {
    bg.run([reply, path = req.path] {
      std::this_thread::sleep_for(200ms);
      reply(text("later:" + path));
    });
  });
  wire_client c(srv.port());
  for (int i = 0; i < 2; ++i) {  // and the connection stays usable afterwards
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(!c.send(get("/w" + std::to_string(i))));
    wire_response res;
    REQUIRE(!c.read(res));
    CHECK(std::chrono::steady_clock::now() - t0 >= 190ms);
    CHECK(res.result_int() == 200);
    CHECK(res.body() == "later:/w" + std::to_string(i));
    CHECK(res.keep_alive());
  }
}

TEST_CASE("async: a streamed reply from another thread") {
  background bg;
  auto probe = std::make_shared<counting_source::probe>();
  running_async_server srv({}, [&bg, probe](const request&, responder reply) {
    bg.run([reply, probe] {
      response r;
      r.stream = std::make_shared<counting_source>(probe, 10);
      reply(std::move(r));
    });
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/s")));
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res.chunked());
  CHECK(res.body() == expected_lines(10));
}

TEST_CASE("async: a handler that drops its responder uncalled yields a 500 problem") {
  background bg;
  running_async_server srv({}, [&bg](const request& req, responder reply) {
    if (req.path == "/now") return;  // dropped on the I/O thread, inside the handler
    bg.run([reply = std::move(reply)]() mutable {
      std::this_thread::sleep_for(50ms);
      reply = nullptr;  // dropped later, on another thread
    });
  });
  wire_client c(srv.port());
  for (const char* path : {"/now", "/later"}) {
    CAPTURE(path);
    REQUIRE(!c.send(get(path, "X-Request-Id: drop-1\r\n")));
    wire_response res;
    REQUIRE(!c.read(res));
    check_problem(res, 500, 50001);
    CHECK(res["X-Request-Id"] == "drop-1");
    CHECK(json_of(res)["detail"].get<std::string>().find("did not answer") != std::string::npos);
    CHECK(json_of(res)["instance"] == path);
    CHECK(res.keep_alive());
  }
}

TEST_CASE("async: a second reply is ignored and the connection stays usable") {
  background bg;
  running_async_server srv({}, [&bg](const request& req, responder reply) {
    reply(text("first:" + req.path));
    reply(text("second:" + req.path));  // ignored
    bg.run([reply, path = req.path] { reply(text("third:" + path)); });  // ignored too
  });
  wire_client c(srv.port());
  for (const char* path : {"/a", "/b", "/c"}) {
    REQUIRE(!c.send(get(path)));
    wire_response res;
    REQUIRE(!c.read(res));
    CHECK(res.body() == std::string("first:") + path);  // a stray reply would show up here
  }
  // Nothing extra arrives on the connection.
  std::string raw;
  CHECK(c.read_raw(raw, 300ms) == beast::error::timeout);
  CHECK(raw.empty());
}

TEST_CASE("async: a handler that throws before replying yields a 500; a reply before throwing stands") {
  running_async_server srv({}, [](const request& req, responder reply) {
    if (req.path == "/after") reply(text("answered"));
    throw std::runtime_error("secret internals");
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/before")));
  wire_response res;
  REQUIRE(!c.read(res));
  check_problem(res, 500, 50001);
  CHECK(res.body().find("secret") == std::string::npos);
  REQUIRE(!c.send(get("/after")));
  wire_response res2;
  REQUIRE(!c.read(res2));
  CHECK(res2.result_int() == 200);
  CHECK(res2.body() == "answered");
}

TEST_CASE("async: a reply arriving during stop() is delivered, then the connection closes") {
  server_config cfg;
  cfg.shutdown_grace = 5s;
  std::mutex mu;
  responder held;
  running_async_server srv(cfg, [&](const request&, responder reply) {
    std::lock_guard lk(mu);
    held = std::move(reply);
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/wait")));
  REQUIRE(wait_for([&] { std::lock_guard lk(mu); return static_cast<bool>(held); }, 2s));

  std::thread replier([&] {
    std::this_thread::sleep_for(150ms);
    std::lock_guard lk(mu);
    held(text("just in time"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  srv.instance->stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  replier.join();
  CHECK(elapsed >= 100ms);
  CHECK(elapsed < 2s);
  wire_response res;
  REQUIRE(!c.read(res));
  CHECK(res.body() == "just in time");
  CHECK_FALSE(res.keep_alive());
  CHECK(c.wait_closed(2s) != beast::error::timeout);
}

TEST_CASE("async: a reply still pending does not hold stop() beyond shutdown_grace; a late reply is dropped") {
  server_config cfg;
  cfg.shutdown_grace = 300ms;
  std::mutex mu;
  responder held;
  running_async_server srv(cfg, [&](const request&, responder reply) {
    std::lock_guard lk(mu);
    held = std::move(reply);
  });
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/never")));
  REQUIRE(wait_for([&] { std::lock_guard lk(mu); return static_cast<bool>(held); }, 2s));

  const auto t0 = std::chrono::steady_clock::now();
  srv.instance->stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed >= 250ms);
  CHECK(elapsed < 2s);
  std::string raw;
  CHECK(c.read_raw(raw, 2s) != beast::error::timeout);  // closed, without an answer
  CHECK(raw.empty());

  // Late replies, while the server object exists and after it is gone: both dropped.
  held(text("too late"));
  srv.instance.reset();
  held(text("much too late"));
  held = nullptr;
}

TEST_CASE("async: the responder may outlive the server uncalled") {
  server_config cfg;
  cfg.shutdown_grace = 100ms;
  std::mutex mu;
  responder held;
  {
    running_async_server srv(cfg, [&](const request&, responder reply) {
      std::lock_guard lk(mu);
      held = std::move(reply);
    });
    wire_client c(srv.port());
    REQUIRE(!c.send(get("/x")));
    REQUIRE(wait_for([&] { std::lock_guard lk(mu); return static_cast<bool>(held); }, 2s));
  }
  std::lock_guard lk(mu);
  held = nullptr;  // destroyed uncalled after the server: must not touch it
}
