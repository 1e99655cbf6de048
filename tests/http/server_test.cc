#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <random>

#include "live_server.h"

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

TEST_CASE("parse_target: a plain path (no escapes, no query) splits as the general parser does") {
  // With a '?' appended the target takes the general parser (an empty query adds no
  // parameter); both must give the same path and segments.
  std::mt19937 rng(7);
  const std::string alphabet = "abcXYZ019-._~!$&'()*+,;=:@/";
  std::uniform_int_distribution<size_t> len(0, 24), pick(0, alphabet.size() - 1);
  for (int i = 0; i < 5000; ++i) {
    std::string target = "/";
    for (size_t n = len(rng); n > 0; --n) target += alphabet[pick(rng)];
    CAPTURE(target);
    auto plain = parsed(target);
    auto general = parsed(target + "?");
    CHECK(plain.path == general.path);
    CHECK(plain.segments == general.segments);
    CHECK(plain.query.empty());
  }
  CHECK(parsed("/").segments.empty());
  CHECK(parsed("//x").segments == std::vector<std::string>{"", "x"});
  CHECK(parsed("/./v1/stores").segments == std::vector<std::string>{".", "v1", "stores"});
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

TEST_CASE("percent_encode: RFC 3986 unreserved characters stay, every other byte is %XX, and parse_target undoes it") {
  CHECK(percent_encode("AZaz09-._~") == "AZaz09-._~");
  CHECK(percent_encode("a b/c?d&e=f+g%") == "a%20b%2Fc%3Fd%26e%3Df%2Bg%25");
  CHECK(percent_encode(std::string_view("\x00\xff\xc3\xbc", 4)) == "%00%FF%C3%BC");
  // Every byte, through a path segment and a query value and back.
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  auto req = parsed("/" + percent_encode(all) + "?k=" + percent_encode(all));
  CHECK(req.segments == std::vector<std::string>{all});
  CHECK(req.param("k") == all);
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

TEST_CASE("server: response framing by version, Connection, HEAD and bodiless statuses") {
  // A handler whose status the path chooses; the framing is checked on the raw bytes.
  running_server srv({}, [](const request& req) {
    response r;
    r.body = "0123456789";
    if (!req.segments.empty() && req.segments[0] == "nocontent") r.status = 204;
    return r;
  });
  auto exchange = [&](const std::string& raw_request, bool expect_close) {
    wire_client c(srv.port());
    REQUIRE(!c.send(raw_request));
    std::string raw;
    c.read_raw(raw, 2s, expect_close ? "" : "\r\n\r\n");
    return raw;
  };
  SUBCASE("HTTP/1.1 keep-alive: Content-Length, no Connection field") {
    auto raw = exchange(get("/a"), false);
    CHECK(raw.rfind("HTTP/1.1 200 OK\r\nServer: kstate\r\n", 0) == 0);
    CHECK(raw.find("Content-Length: 10\r\n") != std::string::npos);
    CHECK(raw.find("Connection:") == std::string::npos);
  }
  SUBCASE("HTTP/1.1 Connection: close is answered with it, then the connection closes") {
    auto raw = exchange(get("/a", "Connection: close\r\n"), true);
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.substr(raw.size() - 14) == "\r\n\r\n0123456789");
  }
  SUBCASE("HTTP/1.0 closes unless kept alive, and says keep-alive when kept") {
    auto closed = exchange("GET /a HTTP/1.0\r\n\r\n", true);
    CHECK(closed.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
    CHECK(closed.find("Connection:") == std::string::npos);
    CHECK(closed.substr(closed.size() - 10) == "0123456789");
    wire_client c(srv.port());
    for (int i = 0; i < 2; ++i) {
      REQUIRE(!c.send("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
      wire_response res;
      REQUIRE(!c.read(res));
      CHECK(res.version() == 10);
      CHECK(res[bhttp::field::connection] == "keep-alive");
      CHECK(res.body() == "0123456789");
    }
  }
  SUBCASE("HEAD: the GET's Content-Length, no body bytes before the next response") {
    wire_client c(srv.port());
    REQUIRE(!c.send("HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n" + get("/a", "Connection: close\r\n")));
    std::string raw;
    c.read_raw(raw, 2s);
    const auto first_end = raw.find("\r\n\r\n");
    REQUIRE(first_end != std::string::npos);
    CHECK(raw.substr(0, first_end).find("Content-Length: 10") != std::string::npos);
    CHECK(raw.compare(first_end + 4, 9, "HTTP/1.1 ") == 0);
    CHECK(raw.substr(raw.size() - 10) == "0123456789");
  }
  SUBCASE("204: neither Content-Length nor body") {
    auto raw = exchange(get("/nocontent", "Connection: close\r\n"), true);
    CHECK(raw.rfind("HTTP/1.1 204 No Content\r\n", 0) == 0);
    CHECK(raw.find("Content-Length") == std::string::npos);
    CHECK(raw.substr(raw.size() - 4) == "\r\n\r\n");
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
  CHECK(rest.empty());                 // no second answer: the body was not a request
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
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
                        "{}" + smuggled);
  check_refused_framing("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n", "{}" + smuggled);
}

TEST_CASE("smuggling: Transfer-Encoding in an HTTP/1.0 request is refused") {
  check_refused_framing("POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "0\r\n\r\n" + smuggled);
}

TEST_CASE("smuggling: a plain chunked body is still accepted and the connection reused") {
  counting_handler h;
  running_server srv({}, h.fn());
  wire_client c(srv.port());
  REQUIRE(
      !c.send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + get("/b")));
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
    REQUIRE(
        !c.send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
                "X-Custom: from-trailer\r\n\r\n"));
    REQUIRE(!c.read(res));
    CHECK(res.result_int() == 200);
    CHECK(json_of(res)["body"] == "abc");
    CHECK(json_of(res)["custom"] == "");  // the trailer field is not a header
  }
  wire_client c(srv.port());
  wire_response res;
  REQUIRE(
      !c.exchange("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
                  "X-Big: " +
                      std::string(4096, 't') + "\r\n\r\n",
                  res));
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
  REQUIRE(!c.exchange(
      "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;" + std::string(1024 * 1024, 'a'), res));
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

TEST_CASE("limits: past the connections held for a 503, a connection is closed at once; every refusal is counted") {
  server_config cfg;
  cfg.max_connections = 2;
  running_server srv(cfg);
  wire_client a(srv.port()), b(srv.port());
  for (auto* c : {&a, &b}) {
    REQUIRE(!c->send(get("/open")));
    wire_response res;
    REQUIRE(!c->read(res));
    CHECK(res.result_int() == 200);
  }
  // None of these sends anything yet, so each one held for a 503 stays open and the
  // server's count of open connections only grows. Connections are accepted in order.
  constexpr int held = 64, extra = 5;  // 64: the server's overload_answers
  std::vector<std::unique_ptr<wire_client>> over;
  for (int i = 0; i < held + extra; ++i) over.push_back(std::make_unique<wire_client>(srv.port()));
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (srv.instance->refused_connections() < held + extra && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  REQUIRE(srv.instance->refused_connections() == held + extra);
  for (int i = held; i < held + extra; ++i) {
    (void)over[i]->send(get("/over"));  // may fail: the server has closed it
    std::string raw;
    CHECK(over[i]->read_raw(raw, 3s) != beast::error::timeout);  // closed by the server
    CHECK(raw.empty());                                          // a held one would have answered 503
  }
  for (int i = 0; i < held; ++i) {
    wire_response res;
    REQUIRE(!over[i]->exchange(get("/over"), res));
    check_problem(res, 503, 50306);
  }
  CHECK(srv.instance->refused_connections() == held + extra);
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
