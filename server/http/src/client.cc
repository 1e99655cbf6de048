// client: Beast's HTTP client over pooled keep-alive connections. Like
// server.cc, the only translation unit of its feature that includes Beast, which is
// why it is over 700 lines: a second file would compile Beast's templates again.
//
// Structure. A `connection` is one TCP stream on its own strand plus its read buffer;
// it is either idle in the pool (no operation pending, owned by the pool) or used by
// exactly one `exchange` (one request/response). An exchange runs all its steps on the
// strand of the connection it currently uses: that is what makes beast::tcp_stream's
// timeout handling safe with several I/O threads. It moves to another strand only when
// it retries on a fresh connection, and then by posting, so its steps still happen one
// after the other.
//
// Completion. `exchange::finish` is the one place that ends an exchange: guarded by an
// atomic flag, so the first of {response, error, deadline, client shutdown} wins and the
// callback runs exactly once; handlers of operations still pending afterwards see the
// flag and do nothing. A connection goes back to the pool before `done` is called, so a
// caller that sends its next request from `done` (or right after it) reuses it.
//
// Shutdown. The destructor marks the client stopping (send() then fails fast), posts a
// cancel to every live exchange (each completes with unavailable on its strand and
// closes its socket), drops the idle connections, releases the work guard and joins the
// threads, which return once the last cancelled operation has unwound. No handler is
// ever destroyed uncalled, so every `done` runs.
//
// Shared state (pool, live set, stopping flag) is guarded by client_state::mu; an
// exchange's members are touched only on its current strand, except `cancelled_`
// (atomic), `finished_` (atomic) and `conn_` (written under the exchange's mutex so
// cancel() can read it from the destroying thread).

#include "http/client.h"

#include "core/log.h"
#include "syntax.h"
#include "core/thread_name.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

namespace kstate::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using clock_type = std::chrono::steady_clock;
using done_fn = std::function<void(result<response>)>;

// Response header blocks are small (kstate sends a handful of fields); 64 KiB leaves room
// for any sane peer while bounding a broken one.
constexpr std::uint32_t max_response_header_bytes = 64 * 1024;

// The "http" logger, shared with server.cc (same module): an embedding
// application's if it registered one, else a clone of the default logger.
const std::shared_ptr<spdlog::logger>& log() {
  static const std::shared_ptr<spdlog::logger> l = module_logger("http");
  return l;
}

using syntax::iequals;
using syntax::is_token;
using syntax::valid_header_value;

bool valid_target(std::string_view t) {
  if (t.empty() || t.front() != '/') return false;
  return std::none_of(t.begin(), t.end(), [](unsigned char c) { return c <= 0x20 || c == 0x7f; });
}

// Headers whose values the client owns: they frame the message or describe this hop.
bool client_owned_header(std::string_view n) {
  for (std::string_view h : {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade",
                             "proxy-connection"}) {
    if (iequals(n, h)) return true;
  }
  return false;
}

// Response headers that describe this hop or the framing, not the answer (RFC 9110
// 7.6.1), plus the two the caller gets elsewhere (content_type, body size).
bool dropped_response_field(bhttp::field f) {
  switch (f) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::proxy_connection:
    case bhttp::field::te:
    case bhttp::field::trailer:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::content_length:
    case bhttp::field::content_type: return true;
    default: return false;
  }
}

// A parsed "http://host[:port][/]" or "https://host[:port][/]". `key` names the pool and is what idle_connections()
// looks up, so "http://Peer:80" and "http://peer" share connections.
struct peer_address {
  std::string host;  // without brackets
  std::string port;
  std::optional<net::ip::address> numeric;  // set when host is an IP literal: no DNS
  std::string key;                          // "host:port", lower case, IPv6 in brackets
  bool tls = false;                         // https: TLS, the certificate checked against host
};

result<peer_address> parse_endpoint(std::string_view ep) {
  auto bad = [&](std::string_view why) {
    return status::invalid_argument("peer endpoint '" + std::string(ep.substr(0, 256)) + "': " + std::string(why));
  };
  constexpr std::string_view plain_scheme = "http://";
  constexpr std::string_view tls_scheme = "https://";
  bool tls = false;
  std::string_view rest;
  if (ep.size() >= plain_scheme.size() && iequals(ep.substr(0, plain_scheme.size()), plain_scheme)) {
    rest = ep.substr(plain_scheme.size());
  } else if (ep.size() >= tls_scheme.size() && iequals(ep.substr(0, tls_scheme.size()), tls_scheme)) {
    rest = ep.substr(tls_scheme.size());
    tls = true;
  } else {
    return bad("only http://host:port and https://host:port are supported");
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) return bad("expected http://host:port, nothing more");

  peer_address a;
  std::string_view host;
  std::string_view port;
  bool bracketed = false;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 address");
    host = rest.substr(1, close - 1);
    const auto after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after IPv6 address");
      port = after.substr(1);
    }
    bracketed = true;
  } else {
    const auto colon = rest.rfind(':');
    host = rest.substr(0, colon);
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return bad("an IPv6 address needs brackets");
  }
  if (host.empty()) return bad("missing host");
  if (!std::all_of(host.begin(), host.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == ':' || c == '%';
      })) {
    return bad("invalid host");
  }
  if (port.empty() && rest.find(':') == std::string_view::npos) port = tls ? "443" : "80";
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return bad("invalid port");
  }
  const unsigned long port_num = std::stoul(std::string(port));
  if (port_num == 0 || port_num > 65535) return bad("port out of range");

  a.host = std::string(host);
  std::transform(a.host.begin(), a.host.end(), a.host.begin(), [](unsigned char c) { return std::tolower(c); });
  a.port = std::to_string(port_num);
  beast::error_code ec;
  auto addr = net::ip::make_address(a.host, ec);
  if (!ec) {
    a.numeric = addr;
  } else if (bracketed) {
    return bad("invalid IPv6 address");
  }
  a.key = (bracketed ? "[" + a.host + "]" : a.host) + ":" + a.port;
  a.tls = tls;
  return a;
}

status validate(const client_request& r) {
  if (!is_token(r.method))
    return status::invalid_argument("peer request: invalid method '" + r.method.substr(0, 64) + "'");
  if (!valid_target(r.target))
    return status::invalid_argument("peer request: target must be origin-form ('/...'), no spaces");
  for (const auto& [n, v] : r.headers) {
    if (!is_token(n) || !valid_header_value(v)) {
      return status::invalid_argument("peer request: invalid header '" + n.substr(0, 64) + "'");
    }
  }
  return {};
}

// One TCP connection to a peer. Its stream's executor is its own strand; every
// operation on it runs there.
//
// Plain or TLS, fixed when created: with a TLS context the TCP stream is wrapped in an
// ssl_stream, and every read and write goes through it.
struct connection {
  connection(net::io_context& ioc, net::ssl::context* tls_ctx) {
    if (tls_ctx) {
      tls.emplace(net::make_strand(ioc), *tls_ctx);
    } else {
      plain.emplace(net::make_strand(ioc));
    }
  }
  beast::tcp_stream& stream() { return plain ? *plain : beast::get_lowest_layer(*tls); }
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;  // bytes read past a response would be kept here (then: not reused)
};

class exchange;

// Everything exchanges share with the client. Lives in client::impl, which
// outlives every exchange's handlers (the destructor joins the I/O threads first).
struct client_state {
  client_state(client_config c, net::io_context& io) : cfg(std::move(c)), ioc(io) {}

  const client_config cfg;
  net::io_context& ioc;
  // For https:// endpoints; null when it could not be set up (tls_error says why).
  std::unique_ptr<net::ssl::context> tls;
  std::string tls_error;
  std::atomic<uint64_t> opened{0};

  mutable std::mutex mu;
  bool stopping = false;  // guarded by mu
  // Per endpoint key, idle connections; back() is the most recently used (LIFO: it is the
  // least likely to have been closed by the peer's idle timeout). Guarded by mu.
  std::unordered_map<std::string, std::vector<std::shared_ptr<connection>>> idle;
  // Exchanges not finished yet, for the destructor to cancel. Guarded by mu.
  std::unordered_map<exchange*, std::weak_ptr<exchange>> live;

  // An idle connection to `key`, or null (also when stopping).
  std::shared_ptr<connection> take(const std::string& key) {
    std::lock_guard lk(mu);
    if (stopping) return nullptr;
    auto it = idle.find(key);
    if (it == idle.end() || it->second.empty()) return nullptr;
    auto c = std::move(it->second.back());
    it->second.pop_back();
    return c;
  }

  // Returns false (the caller closes `c`) when the pool is full or the client stopping.
  bool give_back(const std::string& key, std::shared_ptr<connection> c) {
    std::lock_guard lk(mu);
    if (stopping) return false;
    auto& v = idle[key];
    if (v.size() >= cfg.max_idle_per_peer) return false;
    v.push_back(std::move(c));
    return true;
  }

  // Forgets every idle connection to `key`. Called when the most recently used one was
  // found closed by the peer: the others have been idle at least as long, so with the
  // peer's idle timeout they are gone too, and each would cost a failed attempt.
  void drop_idle(const std::string& key) {
    std::vector<std::shared_ptr<connection>> dropped;
    {
      std::lock_guard lk(mu);
      auto it = idle.find(key);
      if (it == idle.end()) return;
      dropped.swap(it->second);
    }
    // Destroyed outside the lock. Idle connections have no operation pending, so closing
    // them off their strand races with nothing.
  }
};

result<response> to_response(bhttp::response<bhttp::string_body>&& msg) {
  response r;
  r.status = msg.result_int();
  r.content_type = std::string(msg[bhttp::field::content_type]);
  for (const auto& f : msg) {
    if (dropped_response_field(f.name())) continue;
    r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  r.body = std::move(msg.body());
  return r;
}

// One request/response. Owned by shared_ptrs in its pending handlers (and briefly by
// send()); see the file comment for which thread touches what.
class exchange : public std::enable_shared_from_this<exchange> {
 public:
  exchange(client_state& st, peer_address addr, client_request req, clock_type::time_point deadline, done_fn done)
      : st_(st), addr_(std::move(addr)), deadline_(deadline), done_(std::move(done)) {
    head_ = iequals(req.method, "HEAD");
    // The request line and fields in one buffer, the body as given: written as one
    // gather, without Beast's serializer (several times the cost for small requests).
    // send() checked the method, target and headers.
    auto field = [this](std::string_view n, std::string_view v) {
      req_head_.append(n.data(), n.size()).append(": ").append(v.data(), v.size()).append("\r\n");
    };
    req_head_.reserve(128 + req.target.size());
    req_head_.append(req.method).append(" ").append(req.target).append(" HTTP/1.1\r\n");
    field("Host", addr_.key);
    for (const auto& [n, v] : req.headers)
      if (!client_owned_header(n)) field(n, v);
    // Content-Length even when 0 for methods that carry a body, as Beast's
    // prepare_payload did; none on a bodiless GET or HEAD.
    if (!req.body.empty() || !(iequals(req.method, "GET") || head_)) {
      char len[24];
      auto end = std::to_chars(len, len + sizeof len, req.body.size()).ptr;
      field("Content-Length", std::string_view(len, static_cast<std::size_t>(end - len)));
    }
    req_head_.append("\r\n");
    req_body_ = std::move(req.body);
  }

  // From send(), on the caller's thread, after the exchange was registered as live.
  void start() {
    auto c = st_.take(addr_.key);
    reused_ = c != nullptr;
    if (!c) c = std::make_shared<connection>(st_.ioc, addr_.tls ? st_.tls.get() : nullptr);
    {
      std::lock_guard lk(mu_);
      conn_ = c;
    }
    // Posted, never run inline: send() must not block, and done must not run on the
    // caller's thread.
    net::post(c->stream().get_executor(), [self = shared_from_this()] {
      if (self->reused_) {
        self->write();
      } else {
        self->connect();
      }
    });
  }

  // Completes the exchange with `s` without having started it (client stopping).
  void reject(status s) {
    net::post(st_.ioc, [self = shared_from_this(), s = std::move(s)]() mutable { self->finish(std::move(s), false); });
  }

  // From the destructor's thread: completes the exchange with unavailable on its strand,
  // unless it completes first. Pending operations are aborted by finish() closing the
  // socket.
  void cancel() {
    std::shared_ptr<connection> c;
    {
      std::lock_guard lk(mu_);
      cancelled_ = true;
      c = conn_;
    }
    // Without a connection, start() has not posted its first step yet; that step will see
    // cancelled_.
    if (c) {
      net::post(c->stream().get_executor(), [self = shared_from_this()] {
        self->finish(status::unavailable("peer " + self->addr_.key + ": client stopped before the response arrived"),
                     false);
      });
    }
  }

 private:
  // Before each step: false (after completing the exchange) when it must not go on.
  bool proceed() {
    if (finished_) return false;
    if (cancelled_) {
      finish(status::unavailable("peer " + addr_.key + ": client stopped before the response arrived"), false);
      return false;
    }
    if (clock_type::now() >= deadline_) {
      finish(deadline_error("before the response was complete"), false);
      return false;
    }
    return true;
  }

  status deadline_error(std::string_view phase) const {
    return status::deadline_exceeded("peer " + addr_.key + ": deadline passed " + std::string(phase));
  }

  // Resolving and connecting end at the connect deadline, which is the request's
  // deadline unless connect_timeout comes sooner.
  clock_type::time_point connect_deadline() const {
    return std::min(deadline_, connect_started_ + st_.cfg.connect_timeout);
  }

  // A timeout while connecting: if only connect_timeout ran out (the request still had
  // time), the peer is unreachable; otherwise the request ran out of time.
  status connect_timeout_error() const {
    if (clock_type::now() < deadline_) {
      return status::unavailable("peer " + addr_.key + ": no connection within " +
                                 std::to_string(st_.cfg.connect_timeout.count()) + " ms");
    }
    return deadline_error("while connecting");
  }

  void connect() {
    if (!proceed()) return;
    connect_started_ = clock_type::now();
    if (addr_.numeric) {
      // A vector, so both paths use the same range connect.
      std::vector<tcp::endpoint> eps{
          tcp::endpoint(*addr_.numeric, static_cast<unsigned short>(std::stoul(addr_.port)))};
      return connect_to(eps);
    }
    // The resolver is not covered by the stream's expiry: a timer bounds it. On expiry
    // the exchange completes at once; the resolver's late answer is then ignored.
    auto ex = conn_->stream().get_executor();
    resolver_.emplace(ex);
    resolve_timer_.emplace(ex);
    resolve_timer_->expires_at(connect_deadline());
    resolve_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->finished_) return;  // cancelled: the resolve finished first
      self->resolver_->cancel();
      self->finish(self->connect_timeout_error(), false);
    });
    resolver_->async_resolve(
        addr_.host, addr_.port,
        [self = shared_from_this()](beast::error_code ec, const tcp::resolver::results_type& results) {
          self->resolve_timer_->cancel();
          if (self->finished_) return;
          if (ec) {
            return self->finish(status::unavailable("peer " + self->addr_.key + ": resolve failed: " + ec.message()),
                                false);
          }
          self->connect_to(results);
        });
  }

  template <class Endpoints>
  void connect_to(const Endpoints& eps) {
    if (!proceed()) return;
    conn_->stream().expires_at(connect_deadline());
    conn_->stream().async_connect(
        eps, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) { self->on_connect(ec); });
  }

  void on_connect(beast::error_code ec) {
    if (finished_) return;
    if (ec == beast::error::timeout) return finish(connect_timeout_error(), false);
    if (ec) return finish(error_status(ec, "connect"), false);
    st_.opened.fetch_add(1, std::memory_order_relaxed);
    // Requests and responses are small and latency-bound; Nagle would only delay them.
    beast::error_code ignored;
    conn_->stream().socket().set_option(tcp::no_delay(true), ignored);  // best effort: failure is harmless
    if (conn_->tls) return handshake();
    write();
  }

  // TLS: the peer's certificate must chain to the configured CA and name the host of
  // its endpoint (a DNS name, or an IP address in its subjectAltName).
  void handshake() {
    if (!proceed()) return;
    auto& tls = *conn_->tls;
    if (!addr_.numeric) {
      // SNI, for peers behind something that routes by name.
      (void)SSL_set_tlsext_host_name(tls.native_handle(), addr_.host.c_str());  // failure only loses SNI
    }
    beast::error_code ec;
    tls.set_verify_mode(net::ssl::verify_peer, ec);
    if (!ec) tls.set_verify_callback(net::ssl::host_name_verification(addr_.host), ec);
    if (ec) return finish(status::io_error("peer " + addr_.key + ": TLS setup: " + ec.message()), false);
    conn_->stream().expires_at(connect_deadline());
    tls.async_handshake(net::ssl::stream_base::client, [self = shared_from_this()](beast::error_code ec) {
      if (self->finished_) return;
      if (ec == beast::error::timeout) return self->finish(self->connect_timeout_error(), false);
      if (ec) {
        return self->finish(status::unavailable("peer " + self->addr_.key + ": TLS handshake failed: " + ec.message()),
                            false);
      }
      self->write();
    });
  }

  void write() {
    if (!proceed()) return;
    // One deadline for the whole exchange: the stream applies it to every operation
    // started from here on, the read included.
    conn_->stream().expires_at(deadline_);
    auto on_done = [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_write(ec); };
    const std::array<net::const_buffer, 2> bufs{net::buffer(req_head_), net::buffer(req_body_)};
    if (conn_->tls) {
      net::async_write(*conn_->tls, bufs, std::move(on_done));
    } else {
      net::async_write(*conn_->plain, bufs, std::move(on_done));
    }
  }

  void on_write(beast::error_code ec) {
    if (finished_) return;
    if (ec) {
      if (stale(ec)) return retry();
      return finish(error_status(ec, "write"), false);
    }
    read();
  }

  void read() {
    if (!proceed()) return;
    // A fresh parser per response; its body limit bounds chunked bodies too, since
    // Beast counts decoded bytes.
    parser_.emplace();
    parser_->header_limit(max_response_header_bytes);
    parser_->body_limit(static_cast<std::uint64_t>(st_.cfg.max_response_bytes));
    if (head_) parser_->skip(true);  // a response to HEAD announces a length but has no body
    auto on_done = [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); };
    if (conn_->tls) {
      bhttp::async_read(*conn_->tls, conn_->buffer, *parser_, std::move(on_done));
    } else {
      bhttp::async_read(*conn_->plain, conn_->buffer, *parser_, std::move(on_done));
    }
  }

  void on_read(beast::error_code ec) {
    if (finished_) return;
    if (ec) {
      const bool nothing_received = !parser_->got_some() && conn_->buffer.size() == 0;
      if (nothing_received && stale(ec)) return retry();
      return finish(error_status(ec, "read"), false);
    }
    auto msg = parser_->release();
    parser_.reset();
    // Reusable only if the peer keeps it open and sent nothing beyond this response
    // (unsolicited bytes would be taken for the next request's answer).
    const bool reuse = msg.keep_alive() && conn_->buffer.size() == 0;
    finish(to_response(std::move(msg)), reuse);
  }

  // A pooled connection the peer closed while it was idle: reset or EOF before any
  // response byte, on the first attempt. Only those are retried (see the header for why
  // resending is safe); a fresh connection failing the same way is a real failure.
  bool stale(beast::error_code ec) const {
    if (!reused_ || retried_ || cancelled_) return false;
    return ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
           ec == net::error::broken_pipe || ec == net::error::connection_aborted ||
           ec == net::ssl::error::stream_truncated;
  }

  void retry() {
    retried_ = true;
    reused_ = false;
    st_.drop_idle(addr_.key);
    conn_->stream().close();
    auto fresh = std::make_shared<connection>(st_.ioc, addr_.tls ? st_.tls.get() : nullptr);
    bool switched = false;
    {
      std::lock_guard lk(mu_);
      // cancel() either already ran (then it saw the old connection and posted to its
      // strand, where we are now) or will see the fresh one.
      if (!cancelled_) {
        conn_ = fresh;
        switched = true;
      }
    }
    if (!switched) {
      return finish(status::unavailable("peer " + addr_.key + ": client stopped before the response arrived"), false);
    }
    log()->debug("peer {}: idle connection was closed by the peer; retrying on a new one", addr_.key);
    net::post(fresh->stream().get_executor(), [self = shared_from_this()] { self->connect(); });
  }

  status error_status(beast::error_code ec, std::string_view phase) const {
    const std::string where = "peer " + addr_.key + ": " + std::string(phase) + ": ";
    if (ec == beast::error::timeout) return deadline_error(std::string("during ") + std::string(phase));
    if (ec == bhttp::error::body_limit) {
      return status::resource_exhausted(where + "response body over " + std::to_string(st_.cfg.max_response_bytes) +
                                        " bytes");
    }
    if (ec == bhttp::error::header_limit) {
      return status::resource_exhausted(where + "response header over " + std::to_string(max_response_header_bytes) +
                                        " bytes");
    }
    // The peer closed early: unreachable, like a reset.
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message)
      return status::unavailable(where + ec.message());
    // Any other parser error: the peer does not speak HTTP/1.1 as expected.
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
      return status::io_error(where + "malformed response: " + ec.message());
    }
    return status::unavailable(where + ec.message());
  }

  // The one exit. Runs on the current connection's strand (or, via reject(), before the
  // exchange ever had one). `reuse`: the connection completed a keep-alive exchange.
  void finish(result<response> r, bool reuse) {
    if (finished_.exchange(true)) return;
    if (resolve_timer_) resolve_timer_->cancel();
    if (resolver_) resolver_->cancel();
    if (auto& c = conn_) {
      bool pooled = false;
      if (reuse) {
        c->stream().expires_never();  // the next exchange sets its own deadline
        pooled = st_.give_back(addr_.key, c);
      }
      // Closing aborts whatever is still pending; its handler then finds finished_ set.
      if (!pooled) c->stream().close();
    }
    {
      std::lock_guard lk(st_.mu);
      st_.live.erase(this);
    }
    auto done = std::move(done_);
    done_ = nullptr;
    try {
      done(std::move(r));
    } catch (const std::exception& e) {
      // Never let a callback take an I/O thread (and every later request) down.
      log()->error("peer {}: response callback threw: {}", addr_.key, e.what());
    } catch (...) {
      log()->error("peer {}: response callback threw a non-std exception", addr_.key);
    }
  }

  client_state& st_;
  const peer_address addr_;
  const clock_type::time_point deadline_;
  done_fn done_;
  // The request as written, kept whole: a retry writes it again.
  std::string req_head_;
  std::string req_body_;
  bool head_ = false;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser_;
  std::optional<tcp::resolver> resolver_;
  std::optional<net::steady_timer> resolve_timer_;
  clock_type::time_point connect_started_{};
  bool reused_ = false;   // conn_ came from the pool
  bool retried_ = false;  // the one stale-connection retry was used

  std::mutex mu_;
  std::shared_ptr<connection> conn_;  // written under mu_; read on the strand or under mu_
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

}  // namespace

struct client::impl {
  explicit impl(client_config cfg) : ioc(std::max(1, cfg.threads)), st(std::move(cfg), ioc), work(ioc.get_executor()) {}

  // Declared first: destroyed last, after everything holding sockets or timers.
  net::io_context ioc;
  client_state st;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
};

// TLS 1.2+ client context: the peers' certificates are verified against cfg.tls_ca_file
// (or the system's CAs); cfg.tls_cert_file/key_file are presented to peers that ask for
// a client certificate.
std::unique_ptr<net::ssl::context> make_client_tls(const client_config& cfg, std::string& error) {
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_client);
  beast::error_code ec;
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                       net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 | net::ssl::context::no_compression,
                   ec);
  if (!ec && SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION) != 1)
    ec = net::error::invalid_argument;
  if (ec) {
    error = "TLS setup: " + ec.message();
    return nullptr;
  }
  if (cfg.tls_ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    ctx->load_verify_file(cfg.tls_ca_file, ec);
  }
  if (ec) {
    error = "CA file '" + cfg.tls_ca_file + "': " + ec.message();
    return nullptr;
  }
  if (!cfg.tls_cert_file.empty()) {
    ctx->use_certificate_chain_file(cfg.tls_cert_file, ec);
    if (!ec) ctx->use_private_key_file(cfg.tls_key_file, net::ssl::context::pem, ec);
    if (ec) {
      error = "client certificate '" + cfg.tls_cert_file + "': " + ec.message();
      return nullptr;
    }
  }
  return ctx;
}

client::client(client_config cfg) : impl_(std::make_unique<impl>(std::move(cfg))) {
  impl_->st.tls = make_client_tls(impl_->st.cfg, impl_->st.tls_error);
  if (!impl_->st.tls) log()->error("peer client: https:// peers cannot be reached: {}", impl_->st.tls_error);
  const int n = std::max(1, impl_->st.cfg.threads);
  impl_->threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    impl_->threads.emplace_back([this] {
      name_this_thread("ks-http-client");
      impl_->ioc.run();
    });
  }
}

client::~client() {
  auto& st = impl_->st;
  std::vector<std::shared_ptr<exchange>> live;
  std::unordered_map<std::string, std::vector<std::shared_ptr<connection>>> idle;
  {
    std::lock_guard lk(st.mu);
    st.stopping = true;
    for (auto& [_, w] : st.live) {
      if (auto e = w.lock()) live.push_back(std::move(e));
    }
    idle.swap(st.idle);
  }
  for (auto& e : live) e->cancel();
  live.clear();
  idle.clear();  // no operation pending on idle connections: safe to close from here

  // With the guard gone, run() returns once the cancelled exchanges have unwound.
  impl_->work.reset();
  for (auto& t : impl_->threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      // Destroyed from its own callback (documented as unsupported): joining ourselves
      // would throw; detaching is the lesser evil, as in server::stop().
      t.detach();
    } else if (t.joinable()) {
      t.join();
    }
  }
}

void client::send(const std::string& endpoint, client_request req, std::function<void(result<response>)> done) {
  if (!done) return;  // nobody to tell: nothing worth sending
  auto& st = impl_->st;
  auto fail_later = [&](status s) {
    net::post(impl_->ioc, [done = std::move(done), s = std::move(s)]() mutable {
      try {
        done(std::move(s));
      } catch (...) {
        log()->error("peer request: response callback threw");
      }
    });
  };
  auto addr = parse_endpoint(endpoint);
  if (!addr.ok()) return fail_later(addr.error());
  if (status s = validate(req); !s.ok()) return fail_later(std::move(s));
  if (addr->tls && !st.tls) return fail_later(status::invalid_argument("peer " + addr->key + ": " + st.tls_error));

  const auto deadline = req.deadline.value_or(clock_type::now() + st.cfg.request_timeout);
  auto ex = std::make_shared<exchange>(st, std::move(*addr), std::move(req), deadline, std::move(done));
  {
    std::lock_guard lk(st.mu);
    if (!st.stopping) {
      st.live.emplace(ex.get(), ex);
    } else {
      ex->reject(status::unavailable("peer client is stopping"));
      return;
    }
  }
  ex->start();
}

size_t client::idle_connections(const std::string& endpoint) const {
  auto addr = parse_endpoint(endpoint);
  if (!addr.ok()) return 0;
  std::lock_guard lk(impl_->st.mu);
  auto it = impl_->st.idle.find(addr->key);
  return it == impl_->st.idle.end() ? 0 : it->second.size();
}

uint64_t client::connections_opened() const { return impl_->st.opened.load(std::memory_order_relaxed); }

std::string client::tls_error() const { return impl_->st.tls_error; }

}  // namespace kstate::http
