#include <doctest/doctest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http/message.h"
#include "http/server.h"
#include "http/client.h"

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using kstate::result;
using kstate::status_code;
using namespace kstate::http;
using http_client = kstate::http::client;
using steady = std::chrono::steady_clock;

namespace {

std::string endpoint_of(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

// A started server on a free loopback port.
struct test_server {
  template <class Handler>
  test_server(Handler h, server_config cfg = {}) {
    cfg.port = 0;
    instance = std::make_unique<server>(cfg, std::move(h));
    auto s = instance->start();
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    endpoint = endpoint_of(instance->port());
  }
  std::unique_ptr<server> instance;
  std::string endpoint;
};

response echo_target(const request& req) {
  response r;
  r.content_type = "text/plain";
  r.body = req.target;
  return r;
}

client_request get(std::string target) {
  client_request r;
  r.target = std::move(target);
  return r;
}

// Sends one request and waits for its answer; also records the thread `done` ran on.
result<response> call(http_client& c, const std::string& ep, client_request req,
                      std::thread::id* done_thread = nullptr) {
  auto p = std::make_shared<std::promise<result<response>>>();
  auto f = p->get_future();
  c.send(ep, std::move(req), [p, done_thread](result<response> r) {
    if (done_thread) *done_thread = std::this_thread::get_id();
    p->set_value(std::move(r));
  });
  return f.get();
}

// Counts completions; wait() returns once `n` arrived or the timeout passed.
struct completions {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<result<response>> results;
  std::vector<std::string> targets;  // the target each result belongs to

  std::function<void(result<response>)> callback(std::string target) {
    return [this, target = std::move(target)](result<response> r) {
      std::lock_guard lk(mu);
      results.push_back(std::move(r));
      targets.push_back(target);
      cv.notify_all();
    };
  }
  bool wait(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return results.size() >= n; });
  }
};

// A scripted raw TCP server: each accepted connection runs `script(socket, index)` on
// its own thread (index counts connections from 0). For behaviour server never
// shows: Connection: close, truncated responses, dropping connections.
class raw_server {
 public:
  using script_fn = std::function<void(tcp::socket&, int)>;
  explicit raw_server(script_fn script) : script_(std::move(script)), acceptor_(ioc_) {
    tcp::endpoint ep(net::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~raw_server() {
    stopping_ = true;
    {
      // Wake the blocking accept.
      net::io_context io;
      tcp::socket s(io);
      beast::error_code ec;
      s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
    }
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  std::string endpoint() const { return endpoint_of(port_); }
  int accepted() const { return accepted_; }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket s(ioc_);
      beast::error_code ec;
      acceptor_.accept(s, ec);
      if (stopping_) return;
      if (ec) continue;
      const int index = accepted_++;
      conns_.emplace_back([this, index, s = std::move(s)]() mutable {
        try {
          script_(s, index);
        } catch (const std::exception&) {
          // The client went away mid-script: fine for these tests.
        }
      });
    }
  }

  script_fn script_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
  std::vector<std::thread> conns_;  // touched only by the accept thread, then by the destructor after join
};

// Reads one request off a raw socket; false when the client closed first.
bool read_request(tcp::socket& s, beast::flat_buffer& buf) {
  bhttp::request<bhttp::string_body> req;
  beast::error_code ec;
  bhttp::read(s, buf, req, ec);
  return !ec;
}

void write_raw(tcp::socket& s, std::string_view bytes) { net::write(s, net::buffer(bytes.data(), bytes.size())); }

// Waits until the client closes its side (so the server never resets first).
void wait_for_close(tcp::socket& s) {
  char c;
  beast::error_code ec;
  while (!ec) s.read_some(net::buffer(&c, 1), ec);
}

}  // namespace

TEST_CASE("1000 sequential requests reuse one pooled connection") {
  test_server srv(echo_target);
  http_client client({});
  for (int i = 0; i < 1000; ++i) {
    const std::string target = "/v1/stores/s/keys/k%2F" + std::to_string(i) + "?key_format=string";
    auto r = call(client, srv.endpoint, get(target));
    REQUIRE_MESSAGE(r.ok(), r.error().to_string());
    REQUIRE(r->status == 200);
    REQUIRE(r->body == target);
  }
  CHECK(client.connections_opened() <= 2);
  CHECK(client.idle_connections(srv.endpoint) == 1);
}

TEST_CASE("64 concurrent requests each get their own answer, and the pool stays bounded") {
  server_config scfg;
  scfg.threads = 4;
  test_server srv(echo_target, scfg);
  client_config cfg;
  cfg.threads = 4;
  cfg.max_idle_per_peer = 8;
  http_client client(cfg);
  completions done;
  for (int i = 0; i < 64; ++i) {
    const std::string target = "/echo/" + std::to_string(i);
    client.send(srv.endpoint, get(target), done.callback(target));
  }
  REQUIRE(done.wait(64, 10s));
  std::lock_guard lk(done.mu);
  for (size_t i = 0; i < done.results.size(); ++i) {
    REQUIRE_MESSAGE(done.results[i].ok(), done.results[i].error().to_string());
    CHECK(done.results[i]->body == done.targets[i]);
  }
  CHECK(client.connections_opened() >= 1);
  CHECK(client.connections_opened() <= 64);
  CHECK(client.idle_connections(srv.endpoint) <= 8);
  CHECK(client.idle_connections(srv.endpoint) >= 1);
}

TEST_CASE("request headers and body reach the peer; any status is a response; hop-by-hop headers are dropped") {
  test_server srv([](const request& req) {
    response r;
    r.status = 404;
    r.content_type = "application/problem+json";
    r.body = req.method + " " + req.body;
    r.with_header("X-Echo-Hop", req.header("x-kstate-hop").value_or("missing"));
    r.with_header("X-Echo-Accept", req.header("accept").value_or("missing"));
    r.with_header("Retry-After", "1");
    return r;
  });
  http_client client({});
  client_request req;
  req.method = "POST";
  req.target = "/v1/stores/s/keys:batchGet";
  req.headers = {{"X-Kstate-Hop", "1"},          {"X-Request-Id", "abc-123"},
                 {"Accept", "application/json"}, {"Content-Type", "application/json"},
                 {"Connection", "close"},  // client-owned: ignored, the connection stays pooled
                 {"Content-Length", "999"}};
  req.body = R"({"keys":["a"]})";
  auto r = call(client, srv.endpoint, req);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->status == 404);
  CHECK(r->content_type == "application/problem+json");
  CHECK(r->body == R"(POST {"keys":["a"]})");
  auto header = [&](std::string_view name) -> std::string {
    for (const auto& [n, v] : r->headers) {
      if (beast::iequals(n, name)) return v;
    }
    return "<absent>";
  };
  CHECK(header("X-Echo-Hop") == "1");
  CHECK(header("X-Echo-Accept") == "application/json");
  CHECK(header("Retry-After") == "1");
  CHECK(header("X-Request-Id") == "abc-123");
  CHECK(header("Content-Length") == "<absent>");
  CHECK(header("Connection") == "<absent>");
  CHECK(header("Content-Type") == "<absent>");  // it is in content_type
  CHECK(client.idle_connections(srv.endpoint) == 1);
}

TEST_CASE("a connection the server closed while idle is retried once on a fresh one") {
  server_config scfg;
  scfg.read_timeout = 200ms;  // the server drops keep-alive connections idle this long
  test_server srv(echo_target, scfg);
  http_client client({});
  auto first = call(client, srv.endpoint, get("/first"));
  REQUIRE(first.ok());
  CHECK(client.idle_connections(srv.endpoint) == 1);
  std::this_thread::sleep_for(400ms);
  auto second = call(client, srv.endpoint, get("/second"));
  REQUIRE_MESSAGE(second.ok(), second.error().to_string());
  CHECK(second->body == "/second");
  CHECK(client.connections_opened() == 2);
  CHECK(client.idle_connections(srv.endpoint) == 1);
}

TEST_CASE("connecting to a closed port is unavailable, quickly") {
  uint16_t port;
  {
    net::io_context io;
    tcp::acceptor a(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }  // closed: nothing listens there now
  http_client client({});
  const auto t0 = steady::now();
  auto r = call(client, endpoint_of(port), get("/x"));
  const auto took = steady::now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == status_code::unavailable);
  CHECK(took < 500ms);
  CHECK(client.connections_opened() == 0);
}

TEST_CASE("a handler slower than the deadline gives deadline_exceeded near the deadline; the client stays usable") {
  server_config scfg;
  scfg.threads = 2;
  test_server srv(
      [](const request& req) {
        if (req.path == "/slow") std::this_thread::sleep_for(1s);
        return echo_target(req);
      },
      scfg);
  client_config cfg;
  cfg.request_timeout = 10s;  // the request's own deadline must win
  http_client client(cfg);

  client_request slow = get("/slow");
  const auto t0 = steady::now();
  slow.deadline = t0 + 200ms;
  auto r = call(client, srv.endpoint, slow);
  const auto took = steady::now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == status_code::deadline_exceeded);
  CHECK(took >= 190ms);
  CHECK(took < 350ms);
  CHECK(client.idle_connections(srv.endpoint) == 0);  // a timed-out connection is never reused

  auto fast = call(client, srv.endpoint, get("/fast"));
  REQUIRE_MESSAGE(fast.ok(), fast.error().to_string());
  CHECK(fast->body == "/fast");

  // The configured request_timeout applies when the request has no deadline.
  client_config short_cfg;
  short_cfg.request_timeout = 150ms;
  http_client short_client(short_cfg);
  const auto t1 = steady::now();
  auto r2 = call(short_client, srv.endpoint, get("/slow"));
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.error().code() == status_code::deadline_exceeded);
  CHECK(steady::now() - t1 < 300ms);

  // A deadline already in the past fails without sending.
  client_request late = get("/fast");
  late.deadline = steady::now() - 1ms;
  auto r3 = call(client, srv.endpoint, late);
  REQUIRE_FALSE(r3.ok());
  CHECK(r3.error().code() == status_code::deadline_exceeded);
}

namespace {
// NDJSON lines produced piece by piece, as a scan would.
class ndjson_lines : public sync_body_source {
 public:
  explicit ndjson_lines(int n) : n_(n) {}
  bool produce(std::string& out) override {
    out += line(i_++);
    return i_ < n_;
  }
  static std::string line(int i) {
    return R"({"key":"k)" + std::to_string(i) + R"(","value":)" + std::to_string(i) + "}\n";
  }

 private:
  int n_;
  int i_ = 0;
};
}  // namespace

TEST_CASE("a chunked (streamed) response is read whole; one over max_response_bytes is resource_exhausted") {
  static constexpr int lines = 5000;
  test_server srv([](const request&) {
    response r;
    r.content_type = "application/x-ndjson";
    r.stream = std::make_shared<ndjson_lines>(lines);
    return r;
  });
  std::string expected;
  for (int i = 0; i < lines; ++i) expected += ndjson_lines::line(i);

  http_client client({});
  auto r = call(client, srv.endpoint, get("/v1/stores/s/keys"));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->content_type == "application/x-ndjson");
  CHECK(r->body.size() == expected.size());
  CHECK(r->body == expected);
  for (const auto& [n, v] : r->headers) CHECK_FALSE(beast::iequals(n, "Transfer-Encoding"));
  CHECK(client.idle_connections(srv.endpoint) == 1);  // the final chunk arrived: reusable

  client_config small;
  small.max_response_bytes = 10'000;
  http_client bounded(small);
  auto big = call(bounded, srv.endpoint, get("/v1/stores/s/keys"));
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().code() == status_code::resource_exhausted);
  CHECK(bounded.idle_connections(srv.endpoint) == 0);
}

TEST_CASE("destroying the client completes requests in flight with unavailable, promptly") {
  // A handler that never answers on its own: replies are parked until the test ends.
  std::mutex mu;
  std::vector<responder> parked;
  server_config scfg;
  scfg.shutdown_grace = 200ms;
  test_server srv(async_handler([&](const request&, responder reply) {
                    std::lock_guard lk(mu);
                    parked.push_back(std::move(reply));
                  }),
                  scfg);

  completions done;
  {
    client_config cfg;
    cfg.threads = 2;
    std::optional<http_client> client(std::in_place, cfg);
    for (int i = 0; i < 8; ++i) client->send(srv.endpoint, get("/hang/" + std::to_string(i)), done.callback(""));
    // Wait until the server holds all of them, so they are truly in flight.
    for (int spin = 0; spin < 500; ++spin) {
      {
        std::lock_guard lk(mu);
        if (parked.size() == 8) break;
      }
      std::this_thread::sleep_for(2ms);
    }
    {
      std::lock_guard lk(mu);
      REQUIRE(parked.size() == 8);
    }
    CHECK(done.results.empty());
    const auto t0 = steady::now();
    client.reset();
    CHECK(steady::now() - t0 < 500ms);
  }
  std::lock_guard lk(done.mu);
  REQUIRE(done.results.size() == 8);
  for (const auto& r : done.results) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == status_code::unavailable);
  }
  std::lock_guard plk(mu);
  for (auto& reply : parked) reply(echo_target({}));
}

TEST_CASE("bad endpoints and requests are invalid_argument, reported through done on a client thread") {
  http_client client({});
  for (std::string ep : {"https:/127.0.0.1:1", "127.0.0.1:80", "http://", "http://:80", "http://h:0", "http://h:99999",
                         "http://h:80/path", "http://user@h:80", "http://::1:80", "http://[::1", "ftp://h:1"}) {
    std::thread::id where;
    auto r = call(client, ep, get("/x"), &where);
    REQUIRE_FALSE_MESSAGE(r.ok(), ep);
    CHECK_MESSAGE(r.error().code() == status_code::invalid_argument, ep);
    CHECK(where != std::this_thread::get_id());
  }
  client_request no_slash = get("v1/x");
  CHECK(call(client, "http://127.0.0.1:1", no_slash).error().code() == status_code::invalid_argument);
  client_request space = get("/a b");
  CHECK(call(client, "http://127.0.0.1:1", space).error().code() == status_code::invalid_argument);
  client_request split = get("/x");
  split.headers = {{"X-Evil", "a\r\nX-Injected: 1"}};
  CHECK(call(client, "http://127.0.0.1:1", split).error().code() == status_code::invalid_argument);
  client_request method = get("/x");
  method.method = "GE T";
  CHECK(call(client, "http://127.0.0.1:1", method).error().code() == status_code::invalid_argument);
  CHECK(client.idle_connections("not an endpoint") == 0);
  CHECK(client.connections_opened() == 0);
}

TEST_CASE("endpoints that spell the same peer share a pool") {
  test_server srv(echo_target);
  http_client client({});
  const auto port = std::to_string(srv.instance->port());
  REQUIRE(call(client, "http://127.0.0.1:" + port, get("/a")).ok());
  REQUIRE(call(client, "HTTP://127.0.0.1:" + port + "/", get("/b")).ok());
  CHECK(client.connections_opened() == 1);
  CHECK(client.idle_connections("http://127.0.0.1:" + port + "/") == 1);
}

TEST_CASE("a host name is resolved") {
  test_server srv(echo_target);
  http_client client({});
  auto r = call(client, "http://localhost:" + std::to_string(srv.instance->port()), get("/named"));
  // localhost may resolve to ::1 first; the client tries each address in turn.
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->body == "/named");
}

TEST_CASE("a response with Connection: close is not pooled") {
  raw_server srv([](tcp::socket& s, int) {
    beast::flat_buffer buf;
    if (!read_request(s, buf)) return;
    write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    beast::error_code ec;
    s.shutdown(tcp::socket::shutdown_send, ec);
    wait_for_close(s);
  });
  http_client client({});
  auto r = call(client, srv.endpoint(), get("/x"));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->body == "ok");
  CHECK(r->content_type.empty());
  CHECK(client.idle_connections(srv.endpoint()) == 0);
}

TEST_CASE("a response cut off midway is unavailable and not retried") {
  // First request on a connection: answered with keep-alive. Second: half a response, then close.
  raw_server srv([](tcp::socket& s, int) {
    beast::flat_buffer buf;
    if (!read_request(s, buf)) return;
    write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    if (!read_request(s, buf)) return;
    write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    beast::error_code ec;
    s.shutdown(tcp::socket::shutdown_send, ec);
    wait_for_close(s);
  });
  http_client client({});
  REQUIRE(call(client, srv.endpoint(), get("/1")).ok());
  auto r = call(client, srv.endpoint(), get("/2"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == status_code::unavailable);
  CHECK(srv.accepted() == 1);  // bytes of a response arrived: resending would not be a retry of a stale connection
  CHECK(client.idle_connections(srv.endpoint()) == 0);
}

TEST_CASE("the stale-connection retry happens at most once") {
  // Connection 0 answers one request, then closes; every later connection closes at once.
  raw_server srv([](tcp::socket& s, int index) {
    beast::flat_buffer buf;
    if (index == 0) {
      if (!read_request(s, buf)) return;
      write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
    beast::error_code ec;
    s.shutdown(tcp::socket::shutdown_send, ec);
    wait_for_close(s);
  });
  http_client client({});
  REQUIRE(call(client, srv.endpoint(), get("/1")).ok());
  std::this_thread::sleep_for(50ms);  // let the FIN arrive
  auto r = call(client, srv.endpoint(), get("/2"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == status_code::unavailable);
  CHECK(srv.accepted() == 2);  // the pooled one, then one retry: not a third
}

TEST_CASE("send() from many threads at once, including from inside done") {
  server_config scfg;
  scfg.threads = 4;
  test_server srv(echo_target, scfg);
  client_config cfg;
  cfg.threads = 3;
  http_client client(cfg);
  completions done;
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string target = "/t" + std::to_string(t) + "/" + std::to_string(i);
        // Chain a second request from the first one's callback.
        client.send(srv.endpoint, get(target), [&, target](result<response> r) {
          const std::string second = target + "/again";
          if (!r.ok() || r->body != target) {
            done.callback(target)(std::move(r));
            return;
          }
          client.send(srv.endpoint, get(second), done.callback(second));
        });
      }
    });
  }
  for (auto& t : senders) t.join();
  REQUIRE(done.wait(200, 20s));
  std::lock_guard lk(done.mu);
  for (size_t i = 0; i < done.results.size(); ++i) {
    REQUIRE_MESSAGE(done.results[i].ok(), done.results[i].error().to_string());
    CHECK(done.results[i]->body == done.targets[i]);
  }
}

TEST_CASE("a response to HEAD has a Content-Length but no body; the connection stays usable") {
  raw_server srv([](tcp::socket& s, int) {
    beast::flat_buffer buf;
    if (!read_request(s, buf)) return;
    write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
    if (!read_request(s, buf)) return;
    write_raw(s, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
    wait_for_close(s);
  });
  http_client client({});
  client_request head = get("/x");
  head.method = "HEAD";
  auto h = call(client, srv.endpoint(), head);
  REQUIRE_MESSAGE(h.ok(), h.error().to_string());
  CHECK(h->body.empty());
  auto after = call(client, srv.endpoint(), get("/y"));
  REQUIRE_MESSAGE(after.ok(), after.error().to_string());
  CHECK(after->body == "hello");
  CHECK(client.connections_opened() == 1);
}
