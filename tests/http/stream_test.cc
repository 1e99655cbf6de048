#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "live_server.h"

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

TEST_CASE(
    "stream: next() is called only as fast as the client reads; a stalled client is cut off and the source released") {
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

// A server whose handler keeps the responder of the request it receives, for the test
// to answer (or drop) later. Members are destroyed server first, so a responder still
// held then outlives the server.
struct holding_server {
  explicit holding_server(server_config cfg)
      : srv(std::move(cfg), [this](const request&, responder reply) {
          std::lock_guard lk(mu);
          held = std::move(reply);
        }) {}
  // True once a request arrived and its responder is held.
  bool wait_held() {
    return wait_for(
        [&] {
          std::lock_guard lk(mu);
          return static_cast<bool>(held);
        },
        2s);
  }
  void reply(response r) {
    std::lock_guard lk(mu);
    held(std::move(r));
  }
  std::mutex mu;
  responder held;
  running_async_server srv;
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

// A plain socket connected to the server, for clients that close or reset at a chosen
// moment.
static int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

TEST_CASE("stream: a client closing while the source has nothing to send releases the source at once") {
  // A source that keeps the server's request for a piece and never answers it, as a
  // change subscription does between heartbeats.
  struct silent_source : body_source {
    explicit silent_source(std::shared_ptr<counting_source::probe> p) : probe(std::move(p)) {}
    ~silent_source() override { probe->destroyed = true; }
    void next(std::function<void(piece)> done) override {
      ++probe->calls;
      held = std::move(done);
    }
    std::shared_ptr<counting_source::probe> probe;
    std::function<void(piece)> held;
  };
  auto probe = std::make_shared<counting_source::probe>();
  server_config cfg;
  cfg.read_timeout = 120s;  // the deadline would release it only after this
  running_async_server srv(cfg, [probe](const request&, responder reply) {
    response r;
    r.stream = std::make_shared<silent_source>(probe);
    reply(std::move(r));
  });
  const int fd = raw_connect(srv.port());
  const std::string req = "GET /feed HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  char buf[512];
  REQUIRE(::recv(fd, buf, sizeof buf, 0) > 0);  // the header: the stream has begun
  REQUIRE(wait_for([&] { return probe->calls.load() >= 1; }, 5s));
  CHECK_FALSE(probe->destroyed.load());
  ::close(fd);
  CHECK(wait_for([&] { return probe->destroyed.load(); }, 20s));
}

TEST_CASE("stream: clients closing while a large piece is being written never harm the server") {
  // Each piece is larger than the socket buffers, so a write is in flight when the
  // client goes away: the stream must end through that write's failure.
  auto probe = std::make_shared<counting_source::probe>();
  running_server srv({}, [probe](const request&) {
    response r;
    r.stream = std::make_shared<counting_source>(probe, 1'000, 8u << 20);
    return r;
  });
  for (int i = 0; i < 20; ++i) {
    const int fd = raw_connect(srv.port());
    const std::string req = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
    char buf[4096];
    REQUIRE(::recv(fd, buf, sizeof buf, 0) > 0);
    if (i % 2 == 0) {
      linger l{1, 0};  // a reset rather than an orderly close
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    ::close(fd);
    REQUIRE(wait_for([&] { return probe->destroyed.load(); }, 20s));
    probe->destroyed = false;
  }
  // Still serving.
  wire_client c(srv.port());
  REQUIRE(!c.send(get("/small")));
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
    reply(text("second:" + req.path));                                   // ignored
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
  holding_server h(cfg);
  wire_client c(h.srv.port());
  REQUIRE(!c.send(get("/wait")));
  REQUIRE(h.wait_held());

  std::thread replier([&] {
    std::this_thread::sleep_for(150ms);
    h.reply(text("just in time"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  h.srv.instance->stop();
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
  holding_server h(cfg);
  wire_client c(h.srv.port());
  REQUIRE(!c.send(get("/never")));
  REQUIRE(h.wait_held());

  const auto t0 = std::chrono::steady_clock::now();
  h.srv.instance->stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed >= 250ms);
  CHECK(elapsed < 2s);
  std::string raw;
  CHECK(c.read_raw(raw, 2s) != beast::error::timeout);  // closed, without an answer
  CHECK(raw.empty());

  // Late replies, while the server object exists and after it is gone: both dropped.
  h.reply(text("too late"));
  h.srv.instance.reset();
  h.reply(text("much too late"));
  h.held = nullptr;
}

TEST_CASE("async: the responder may outlive the server uncalled") {
  server_config cfg;
  cfg.shutdown_grace = 100ms;
  holding_server h(cfg);
  {
    wire_client c(h.srv.port());
    REQUIRE(!c.send(get("/x")));
    REQUIRE(h.wait_held());
  }
  h.srv.instance.reset();
  h.held = nullptr;  // destroyed uncalled after the server: must not touch it
}
