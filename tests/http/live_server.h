#pragma once
// A live kstate::http server on a loopback port and a Beast client with deadlines,
// shared by the server tests (server_test.cc, stream_test.cc).

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
