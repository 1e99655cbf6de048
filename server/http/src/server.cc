// The only translation unit that includes Beast: everything template-heavy about HTTP
// stays here, so handlers and the rest of the server compile against plain structs.
// That is why this file is long (over 1,000 lines): the session is one template over
// its stream (plain TCP and TLS), and splitting it would compile Beast's templates in
// several translation units, each taking as long as this one.
//
// Structure follows Beast's advanced server: one listener accepting on its own strand,
// one session per connection on its own strand. A session is strictly sequential:
// read one request, run the handler, wait for its reply (which may come later, from
// another thread), write the response, then read the next. That is the bound on
// pipelining: at most one request per connection is being handled, and anything the
// client pipelined behind it waits in the socket buffer (TCP flow control pushes back
// on the client), so a connection can never queue unbounded work. Streamed bodies obey
// the same rule: the next piece is produced only once the previous one was written.
//
// Synchronous handlers are wrapped into asynchronous ones that answer at once, so
// there is one code path.
//
// Threads: `threads` I/O threads all run the one io_context. A session's members are
// only touched on its strand; the shared_state is touched from any thread and is
// either immutable after start, atomic, or guarded by its mutex.

#include "http/server.h"

#include "core/log.h"
#include "syntax.h"

#include <boost/asio/dispatch.hpp>
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

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/problem.h"
#include "http/url.h"
#include "core/thread_name.h"

namespace kstate::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
// A connection's socket, bound to its strand by type: no type-erased executor to copy
// and query on every operation.
using strand_type = net::strand<net::io_context::executor_type>;
using socket_type = net::basic_stream_socket<tcp, strand_type>;

class session_base;

// The "http" logger: shared with an embedding application that registered one, else a
// clone of the default logger (same sinks and format).
const std::shared_ptr<spdlog::logger>& log() {
  static const std::shared_ptr<spdlog::logger> l = module_logger("http");
  return l;
}

// State shared by the listener, every session and the server. Sessions hold it by
// shared_ptr, so a session destroyed late (by the io_context's destructor, after a
// shutdown_grace ran out) still finds it alive.
struct shared_state {
  shared_state(server_config c, async_handler h) : cfg(std::move(c)), handler(std::move(h)) {}

  const server_config cfg;
  const async_handler handler;
  // cfg.render_error, or the library's default.
  const error_renderer render_error = cfg.render_error ? cfg.render_error : error_renderer(default_error);
  std::atomic<bool> stopping{false};
  // Connections refused or answered 503 because max_connections were open.
  std::atomic<uint64_t> refused{0};
  // Draining: every response says Connection: close, so keep-alive clients reconnect
  // (to another instance) before the listener closes, instead of being cut off.
  std::atomic<bool> draining{false};

  std::mutex mu;
  std::condition_variable sessions_done;                                    // signalled when `sessions` empties
  std::unordered_map<session_base*, std::weak_ptr<session_base>> sessions;  // guarded by mu

  // Set by start() when the port speaks TLS; immutable afterwards.
  std::unique_ptr<net::ssl::context> tls;

  // Generated request ids: a random per-server prefix plus a counter, so ids from
  // several instances behind one load balancer do not collide.
  std::string id_prefix;
  std::atomic<uint64_t> id_counter{0};

  std::string next_request_id() {
    std::string id;
    id.reserve(id_prefix.size() + 17);
    id += id_prefix;
    id += '-';
    char buf[16];
    auto end = std::to_chars(buf, buf + sizeof buf, ++id_counter, 16).ptr;
    id.append(buf, end);
    return id;
  }
};

// Client-supplied ids end up in logs and response headers: only short, boring ones
// are trusted, anything else is replaced.
bool sane_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-'; });
}

using syntax::iequals;
using syntax::valid_header_value;
// Header names from handlers must be tokens.
inline bool valid_header_name(std::string_view n) { return syntax::is_token(n); }

// Headers the server owns because they frame the message; a handler setting them
// would desynchronise the connection.
bool reserved_header(std::string_view n) {
  return iequals(n, "content-length") || iequals(n, "transfer-encoding") || iequals(n, "connection") ||
         iequals(n, "content-type") || iequals(n, "x-request-id") || iequals(n, "server");
}

// When Beast reports header_limit before the request line was complete, it cannot
// tell us the target; the unparsed line is still in the read buffer, so measure it
// there: if the target alone is over max_target_bytes the honest answer is 414, not 431.
bool target_too_long(std::string_view raw, std::size_t max_target) {
  const auto sp = raw.find(' ');
  if (sp > 32) return false;  // no method within 32 bytes (or no space at all): not a request line
  const auto rest = raw.substr(sp + 1);
  const auto end = rest.find_first_of(" \r\n");
  return (end == std::string_view::npos ? rest.size() : end) > max_target;
}

// Why the framing of a request is ambiguous (RFC 9112 section 6), or nullptr. The
// parser already refuses Transfer-Encoding together with Content-Length in either
// order, and two Content-Length fields that disagree; what it lets through, and what a
// front proxy might frame differently (request smuggling), is refused here:
//  - any Transfer-Encoding but exactly one field saying "chunked": "identity",
//    "chunked, gzip" (the parser would then read no body, and the body would become
//    the next request), "gzip, chunked" (a coding this server does not decode), a
//    second Transfer-Encoding field;
//  - Transfer-Encoding on an HTTP/1.0 request (section 6.1: the framing is faulty);
//  - Content-Length given twice, or as a list ("5, 5"): refused even when the values
//    agree, since another hop may pick a different one.
const char* ambiguous_framing(const bhttp::request_header<>& h) {
  int transfer_encodings = 0, content_lengths = 0;
  for (const auto& f : h) {
    if (f.name() == bhttp::field::transfer_encoding) {
      if (++transfer_encodings > 1) return "more than one Transfer-Encoding field";
      if (!iequals(f.value(), "chunked")) return "Transfer-Encoding other than chunked";
    } else if (f.name() == bhttp::field::content_length) {
      if (++content_lengths > 1) return "more than one Content-Length field";
      const auto v = f.value();
      if (v.empty() || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return "Content-Length is not a single decimal number";
    }
  }
  if (transfer_encodings > 0 && content_lengths > 0) return "Transfer-Encoding together with Content-Length";
  if (transfer_encodings > 0 && h.version() < 11) return "Transfer-Encoding in an HTTP/1.0 request";
  return nullptr;
}

// Bytes of a request's header block as sent: the request line and every field line.
std::size_t header_block_bytes(const bhttp::request_header<>& h) {
  std::size_t n = h.method_string().size() + 1 + h.target().size() + 1 + 8 + 2 + 2;
  for (const auto& f : h) n += f.name_string().size() + 2 + f.value().size() + 2;
  return n;
}

// Why a handler's response is unusable, or nullptr. A bad status or header is a
// handler bug and must become a 500, never a malformed response.
const char* invalid_response(const response& r) {
  if (r.status < 100 || r.status > 999) return "handler returned a bad status";
  for (const auto& [n, v] : r.headers) {
    if (!valid_header_name(n) || !valid_header_value(v)) return "handler returned a bad header";
  }
  if (!valid_header_value(r.content_type)) return "handler returned a bad content type";
  return nullptr;
}

// Statuses whose responses never carry a body (RFC 9110 6.4.1): nothing to stream.
bool bodyless_status(unsigned status) { return status < 200 || status == 204 || status == 304; }

// The completion side of one request handed to an async handler. The handler's
// responder copies share one reply_state; the first complete() posts the
// response onto the session's strand, later ones are ignored. If every copy is
// destroyed uncalled, the destructor answers 500 so the connection is not left hanging.
//
// It holds the session by shared_ptr (a session waiting for its reply has no I/O in
// flight, so nothing else keeps it alive). That reference must not outlive the
// io_context: server::stop() calls abandon() on replies still pending after the
// grace period, and complete() posts while holding mu_, so a reply racing with stop()
// is either queued before abandon() (and destroyed with the io_context) or dropped.
// Thread-safe: touched from the handler's threads and from stop().
class reply_state {
 public:
  reply_state(std::shared_ptr<session_base> s, std::shared_ptr<shared_state> st, std::string request_id,
              std::string instance)
      : target_(std::move(s)), st_(std::move(st)), request_id_(std::move(request_id)), instance_(std::move(instance)) {}
  reply_state(const reply_state&) = delete;
  reply_state& operator=(const reply_state&) = delete;

  ~reply_state() {
    bool answered;
    {
      std::lock_guard lk(mu_);
      answered = done_ || !target_;
    }
    if (answered) return;
    log()->error("request {}: handler dropped its responder without answering", request_id_);
    complete(st_->render_error(server_error::internal, "handler did not answer request " + request_id_, instance_));
  }

  // Returns false when the request was already completed (or abandoned).
  bool complete(response r);

  // Drops the session reference; a later complete() is silently ignored.
  void abandon() {
    std::shared_ptr<session_base> drop;
    std::lock_guard lk(mu_);
    drop = std::move(target_);
    done_ = true;
    // `drop` dies after the lock is released (declared before the guard).
  }

  const std::string& request_id() const { return request_id_; }
  const std::string& instance() const { return instance_; }

 private:
  std::mutex mu_;
  bool done_ = false;                     // guarded by mu_
  std::shared_ptr<session_base> target_;  // guarded by mu_; null once posted or abandoned
  const std::shared_ptr<shared_state> st_;
  const std::string request_id_;
  const std::string instance_;
};

// What reply_state, the listener and stop() need from a session, whatever its stream.
class session_base : public std::enable_shared_from_this<session_base> {
 public:
  virtual ~session_base() = default;
  virtual void on_stop() = 0;
  virtual void on_reply(response r) = 0;
  // A reply completed on the session's own thread from inside its handler call: kept
  // and answered when the handler returns, without a trip through the strand's queue.
  virtual void keep_inline_reply(response r) = 0;
  virtual void abandon_pending_reply() = 0;
  virtual net::any_io_executor executor() = 0;
};

// The session whose handler call is running on this thread, if any (set by handle()).
thread_local session_base* handling_session = nullptr;

// One connection. Owned by shared_ptrs held in its own pending completion handlers
// (and, while an async handler has not answered yet, by that request's reply_state):
// it lives exactly as long as it has an operation or a reply outstanding. Every member
// function runs on the session's strand (the stream's executor), except the
// constructor, run() (called by the listener before any operation is started),
// executor(), and abandon_pending_reply() (called by stop() after the I/O threads
// were joined).
//
// Generic over the stream: the socket itself (plain HTTP) or an ssl_stream over it
// (TLS, handshake first). Both are instantiated here, in the one TU that includes Beast.
template <class Stream>
class session : public session_base {
 public:
  static constexpr bool is_tls = !std::is_same_v<Stream, socket_type>;

  // `overloaded`: accepted beyond max_connections; the session reads one request
  // header, answers it 503 and closes.
  template <class... Args>
  session(std::shared_ptr<shared_state> st, bool overloaded, Args&&... args)
      : overloaded_(overloaded),
        stream_(std::forward<Args>(args)...),
        st_(std::move(st)),
        buffer_(std::size_t{st_->cfg.max_header_bytes} + 64 * 1024),
        watchdog_(stream_.get_executor()) {}

  ~session() override {
    std::lock_guard lk(st_->mu);
    st_->sessions.erase(this);
    if (st_->sessions.empty()) st_->sessions_done.notify_all();
  }

  void run() {
    {
      std::lock_guard lk(st_->mu);
      st_->sessions.emplace(this, weak_from_this());
    }
    // Small responses are written in one gather; Nagle would only add latency.
    beast::error_code ec;
    tcp_layer().set_option(tcp::no_delay(true), ec);  // best effort: ignore failure
    if constexpr (is_tls) {
      net::dispatch(stream_.get_executor(), [self = self()] {
        // The handshake is bounded like a request: a client that connects and says
        // nothing (or speaks plain HTTP and waits) is cut off.
        self->set_deadline(self->st_->cfg.read_timeout);
        self->stream_.async_handshake(net::ssl::stream_base::server,
                                      beast::bind_front_handler(&session::on_handshake, self));
      });
    } else {
      net::dispatch(stream_.get_executor(), beast::bind_front_handler(&session::do_read, self()));
    }
  }

  // Posted onto the strand by server::stop(). A connection idle between requests
  // is closed now; one with a request in progress (handler running or awaited,
  // response or stream being written) finishes it and then closes.
  void on_stop() override {
    close_after_response_ = true;
    if (phase_ == phase::draining || (phase_ == phase::reading && idle())) close();
  }

  // Runs on the strand, posted by reply_state::complete().
  void on_reply(response r) override {
    pending_.reset();
    if (phase_ != phase::handling) return;  // cannot happen: one reply_state per request, one completion
    if (const char* why = invalid_response(r)) {
      log()->error("request {}: {}", cur_.request_id, why);
      r = internal_error_response();
    }
    respond(std::move(r));
  }

  void keep_inline_reply(response r) override { inline_reply_.emplace(std::move(r)); }

  // Only after the I/O threads were joined (no strand is running): a reply the handler
  // still owes is abandoned, which releases the session.
  void abandon_pending_reply() override {
    if (auto rs = pending_.lock()) rs->abandon();
  }

  net::any_io_executor executor() override { return stream_.get_executor(); }

 private:
  enum class phase { reading, handling, writing, streaming, draining };

  // What the request log line and the response need to know about the current request.
  struct request_info {
    std::string method;
    std::string path;  // raw path, no query: query strings may carry secrets
    std::string request_id;
    unsigned version = 11;
    bool keep_alive = false;
    unsigned status = 0;
    std::optional<std::chrono::steady_clock::time_point> start;
  };

  bool idle() const { return buffer_.size() == 0 && (!parser_ || !parser_->got_some()); }

  std::shared_ptr<session> self() { return std::static_pointer_cast<session>(shared_from_this()); }
  socket_type& tcp_layer() { return beast::get_lowest_layer(stream_); }

  // A failed handshake (plain HTTP sent to a TLS port, an untrusted or missing client
  // certificate, a protocol below TLS 1.2) is the client's problem: logged at debug,
  // the connection closed, nothing else happens.
  void on_handshake(beast::error_code ec) {
    if (ec) {
      beast::error_code ignored;
      auto peer = tcp_layer().remote_endpoint(ignored);
      log()->debug("TLS handshake with {}:{} failed: {}", peer.address().to_string(), peer.port(), ec.message());
      return close();
    }
    do_read();
  }

  void close() {
    closed_ = true;
    watchdog_.cancel();
    beast::error_code ec;
    tcp_layer().shutdown(tcp::socket::shutdown_both, ec);  // peer may be gone already
    tcp_layer().close(ec);
  }

  // --- deadlines -------------------------------------------------------------------
  //
  // One timer per connection. tcp_stream's expires_after would start and cancel a
  // timer wait around every read and write (two more completions per request); here a
  // new deadline only moves a time point. The timer, when it fires before the current
  // deadline, waits again until it; once the deadline has passed it closes the socket,
  // which ends the pending read or write with an error (the same outcome as a timeout).
  using clock = std::chrono::steady_clock;

  void set_deadline(std::chrono::milliseconds d) {
    deadline_ = clock::now() + d;
    if (!watchdog_armed_ && !closed_) arm_watchdog();
  }

  // No deadline while the handler works on a request: it has its own limits.
  void clear_deadline() { deadline_ = clock::time_point::max(); }

  void arm_watchdog() {
    watchdog_armed_ = true;
    watchdog_.expires_at(deadline_);
    // A weak reference: a pending wait must not keep a finished connection alive.
    watchdog_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      if (auto s = weak.lock()) static_cast<session*>(s.get())->on_watchdog(ec);
    });
  }

  void on_watchdog(beast::error_code ec) {
    watchdog_armed_ = false;
    if (ec == net::error::operation_aborted || closed_) return;
    if (deadline_ == clock::time_point::max()) return;  // set_deadline() arms it again
    if (clock::now() < deadline_) return arm_watchdog();
    log()->debug("connection idle or stalled past its deadline: closed");
    close();
  }

  void do_read() {
    phase_ = phase::reading;
    cur_ = {};
    if ((st_->stopping || close_after_response_) && buffer_.size() == 0) {
      close();
      return;
    }
    // A fresh parser per request: limits are per request, and no state of the previous
    // message leaks into the next one.
    parser_.emplace();
    parser_->header_limit(st_->cfg.max_header_bytes);
    parser_->body_limit(st_->cfg.max_body_bytes);
    // Chunk extensions are metadata like header fields, and count against the same
    // limit (with the header block, measured in on_header, and the trailers).
    meta_bytes_ = 0;
    header_fields_ = 0;
    parser_->on_chunk_header(count_chunk_extensions_);
    // One deadline for the whole request (headers and body) and for the idle time
    // before it: a client trickling bytes (slowloris) is cut off at read_timeout. A
    // connection over the limit gets little time to say what it wanted.
    set_deadline(overloaded_ ? std::min<std::chrono::milliseconds>(st_->cfg.read_timeout, std::chrono::seconds(2))
                             : st_->cfg.read_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_, beast::bind_front_handler(&session::on_header, self()));
  }

  void on_header(beast::error_code ec, std::size_t) {
    if (ec) return on_read_error(ec);
    cur_.start = std::chrono::steady_clock::now();
    const auto& req = parser_->get();
    if (req.target().size() > st_->cfg.max_target_bytes) {
      return fail(server_error::uri_too_long, "request target is " + std::to_string(req.target().size()) +
                                                  " bytes, limit " + std::to_string(st_->cfg.max_target_bytes));
    }
    if (overloaded_)
      return fail(server_error::overloaded,
                  std::to_string(st_->cfg.max_connections) + " connections are open; retry shortly");
    if (const char* why = ambiguous_framing(req)) return fail(server_error::bad_request, why);
    meta_bytes_ = header_block_bytes(req);
    header_fields_ = static_cast<std::size_t>(std::distance(req.begin(), req.end()));
    if (parser_->is_done()) return handle();

    // Clients that ask first (curl does for bodies over 1 KiB) would otherwise wait a
    // second before sending the body. Body limits were already checked against
    // Content-Length while parsing the header.
    auto expect = req[bhttp::field::expect];
    if (iequals(expect, "100-continue")) {
      continue_.emplace(bhttp::status::continue_, req.version());
      bhttp::async_write(stream_, *continue_, [self = self()](beast::error_code ec, std::size_t) {
        if (ec) return;  // the socket is gone; nothing to answer
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    // No new deadline: the one set before the header covers the whole request.
    bhttp::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&session::on_body, self()));
  }

  void on_body(beast::error_code ec, std::size_t) {
    if (ec) return on_read_error(ec);
    handle();
  }

  void on_read_error(beast::error_code ec) {
    if (ec == bhttp::error::header_limit) {
      // Beast consumes the request line as soon as it is complete, so either the
      // message already has its target, or the unparsed line is still in the buffer.
      const auto data = buffer_.cdata();
      const std::string_view raw(static_cast<const char*>(data.data()), data.size());
      const auto target = parser_->get().target();
      if (target.empty() ? target_too_long(raw, st_->cfg.max_target_bytes)
                         : target.size() > st_->cfg.max_target_bytes) {
        return fail(server_error::uri_too_long,
                    "request target exceeds " + std::to_string(st_->cfg.max_target_bytes) + " bytes");
      }
      return fail(server_error::headers_too_large,
                  "request header block exceeds " + std::to_string(st_->cfg.max_header_bytes) + " bytes");
    }
    if (ec == bhttp::error::buffer_overflow) {
      // A chunk-size line or a trailer section longer than the read buffer.
      return fail(server_error::headers_too_large,
                  "a chunk line or the trailers exceed " + std::to_string(st_->cfg.max_header_bytes) + " bytes");
    }
    if (ec == bhttp::error::body_limit) {
      return fail(server_error::payload_too_large,
                  "request body exceeds " + std::to_string(st_->cfg.max_body_bytes) + " bytes");
    }
    // The client closed between requests (end_of_stream) or mid-request
    // (partial_message), the deadline passed (the watchdog closed the socket),
    // stop() closed us, or the socket failed: there is nobody to answer.
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == beast::error::timeout ||
        ec == net::error::operation_aborted ||
        ec.category() != bhttp::make_error_code(bhttp::error::bad_target).category()) {
      return close();
    }
    // Anything else from the HTTP category is a malformed message (request line,
    // header syntax, framing): the stream cannot be trusted after it, so answer and close.
    fail(server_error::bad_request, "malformed HTTP request: " + ec.message());
  }

  void handle() {
    phase_ = phase::handling;
    clear_deadline();
    auto& msg = parser_->get();

    // Fields after the header block are a chunked body's trailers. They count against the
    // header limit and are dropped: a trailer must not add to or override what the
    // header said (RFC 9110 section 6.5.1), and nothing here needs one.
    std::size_t index = 0, trailer_bytes = 0;
    for (const auto& f : msg)
      if (index++ >= header_fields_) trailer_bytes += f.name_string().size() + 2 + f.value().size() + 2;
    if (meta_bytes_ + trailer_bytes > st_->cfg.max_header_bytes)
      return fail(server_error::headers_too_large,
                  "chunk extensions and trailers exceed " + std::to_string(st_->cfg.max_header_bytes) + " bytes");

    // Shared, so that a handler that answers later keeps it instead of copying it.
    const auto shared_req = std::make_shared<request>();
    request& req = *shared_req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.headers.reserve(header_fields_);
    index = 0;
    for (const auto& f : msg) {
      if (index++ >= header_fields_) break;
      std::string name(f.name_string());
      // ASCII only (names are tokens), without the locale lookup of std::tolower.
      for (char& ch : name)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    auto client_id = req.header("x-request-id").value_or("");
    req.request_id = sane_request_id(client_id) ? client_id : st_->next_request_id();
    req.body = std::move(msg.body());
    cur_.method = req.method;
    cur_.request_id = req.request_id;
    cur_.keep_alive = msg.keep_alive();
    cur_.version = msg.version();

    if (status s = parse_target(req.target, req); !s.ok()) {
      // The request was well framed, only its target is bad: the connection stays usable.
      cur_.path = req.target.substr(0, req.target.find('?'));
      return respond(st_->render_error(server_error::bad_target, s.message(), cur_.path));
    }
    cur_.path = req.path;

    // Until the handler answers, this session reads nothing more from the connection:
    // a pipelined request waits in the socket buffer.
    auto rs = std::make_shared<reply_state>(self(), st_, req.request_id, req.path);
    pending_ = rs;
    handling_session = this;
    try {
      // Called concurrently from all I/O threads: handlers must be thread-safe.
      st_->handler(req, [rs](response r) { rs->complete(std::move(r)); });
    } catch (const std::exception& e) {
      // Never let a handler take the I/O thread down. The exception text may hold
      // internals: it goes to the log, the client gets only the request id to quote.
      log()->error("request {}: handler threw: {}", req.request_id, e.what());
      rs->complete(internal_error_response());
    } catch (...) {
      log()->error("request {}: handler threw a non-std exception", req.request_id);
      rs->complete(internal_error_response());
    }
    // If the handler neither answered nor kept a copy of the responder, releasing `rs`
    // here runs its destructor, which answers 500.
    rs.reset();
    handling_session = nullptr;
    if (inline_reply_) {
      auto r = std::move(*inline_reply_);
      inline_reply_.reset();
      on_reply(std::move(r));
    }
  }

  response internal_error_response() const {
    return st_->render_error(server_error::internal, "unexpected error while handling request " + cur_.request_id,
                             cur_.path);
  }

  // Sends the final response to the current request (plain or streamed).
  void respond(response&& r) {
    const bool keep_alive = cur_.keep_alive && !close_after_response_ && !st_->stopping && !st_->draining;
    cur_.status = r.status;
    if (r.stream && !bodyless_status(r.status) && cur_.method != "HEAD") return start_stream(std::move(r), keep_alive);
    r.stream.reset();  // a body that must not be sent: release whatever the source holds now
    write(std::move(r), keep_alive);
  }

  // A request that cannot be handled (over a limit, unparseable): answer with a
  // problem and close, since the rest of the stream cannot be framed reliably.
  void fail(server_error r, const std::string& detail) {
    std::string instance;
    std::string request_id;
    // Not is_header_done(): a Content-Length over the body limit fails the header
    // itself, yet the request line and fields parsed so far are in the message.
    if (parser_) {
      const auto& msg = parser_->get();
      instance = std::string(msg.target().substr(0, msg.target().find('?')));
      if (sane_request_id(msg["X-Request-Id"])) request_id = std::string(msg["X-Request-Id"]);
      cur_.method = std::string(msg.method_string());
    }
    if (instance.size() > 256) instance.clear();  // do not echo a huge target back
    if (request_id.empty()) request_id = st_->next_request_id();
    cur_.path = instance;
    cur_.request_id = request_id;
    cur_.version = 11;
    auto res = st_->render_error(r, detail, instance);
    cur_.status = res.status;
    write(std::move(res), false);
  }

  template <class Body>
  void fill_header(bhttp::response<Body>& m, const response& r) const {
    m.version(cur_.version);
    m.result(r.status);
    m.set(bhttp::field::server, "kstate");
    if (!r.content_type.empty()) m.set(bhttp::field::content_type, r.content_type);
    m.set("X-Request-Id", cur_.request_id);
    for (const auto& [n, v] : r.headers) {
      if (!reserved_header(n)) m.insert(n, v);
    }
  }

  // A complete response: the status line and header fields are written here into one
  // buffer, the body goes out as it is, both in one gather write. (Beast's serializer
  // walks the same bytes as a chain of buffer views, several times the cost for the
  // small answers that are most of the traffic.) Streamed bodies keep the serializer.
  void write(response&& r, bool keep_alive) {
    phase_ = phase::writing;
    body_ = std::move(r.body);
    // No body after a 1xx, 204 or 304 (RFC 9110 6.4.1), and none after the headers of
    // a HEAD: bytes there would be read as the start of the next response.
    const bool no_body = bodyless_status(r.status);
    head_.clear();
    head_ += cur_.version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ";
    append_decimal(head_, r.status);
    head_ += ' ';
    const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(r.status));
    head_.append(reason.data(), reason.size());
    head_ += "\r\nServer: kstate\r\n";
    if (!r.content_type.empty()) append_field(head_, "Content-Type", r.content_type);
    append_field(head_, "X-Request-Id", cur_.request_id);
    for (const auto& [n, v] : r.headers)
      if (!reserved_header(n)) append_field(head_, n, v);
    // HTTP/1.1 connections persist unless closed, HTTP/1.0 ones close unless kept.
    if (cur_.version >= 11 && !keep_alive) head_ += "Connection: close\r\n";
    if (cur_.version < 11 && keep_alive) head_ += "Connection: keep-alive\r\n";
    if (no_body) {
      body_.clear();
    } else {
      head_ += "Content-Length: ";
      append_decimal(head_, body_.size());
      head_ += "\r\n";
      if (cur_.method == "HEAD") body_.clear();
    }
    head_ += "\r\n";
    // A client that stops reading its response is cut off like one that stops sending.
    set_deadline(st_->cfg.read_timeout);
    const std::array<net::const_buffer, 2> bufs{net::buffer(head_), net::buffer(body_)};
    net::async_write(stream_, bufs, beast::bind_front_handler(&session::on_write, self(), !keep_alive));
  }

  static void append_field(std::string& out, std::string_view name, std::string_view value) {
    out.append(name.data(), name.size());
    out += ": ";
    out.append(value.data(), value.size());
    out += "\r\n";
  }

  static void append_decimal(std::string& out, std::uint64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
  }

  void on_write(bool close_after, beast::error_code ec, std::size_t) {
    // A large body is not kept for the lifetime of an idle connection.
    if (body_.capacity() > keep_body_capacity) body_ = std::string();
    log_request(ec ? "write failed" : "");
    if (ec) return close();
    if (close_after) return lingering_close();
    do_read();
  }

  // --- streamed (chunked) responses -------------------------------------------------
  //
  // Beast's buffer_body serializer: the header goes first, then each piece the source
  // hands out is written as one chunk; an async_write completes with need_buffer once
  // the piece is on the socket, and only then is the source asked for the next one.
  // So at most one piece per connection is in memory, and a client that stops reading
  // stalls the source instead of making the server buffer its output. Every write
  // carries the read_timeout deadline; when it passes, the connection is closed and the
  // source released.

  void start_stream(response&& r, bool keep_alive) {
    phase_ = phase::streaming;
    source_ = std::move(r.stream);
    empty_pieces_ = 0;
    sres_.emplace();
    fill_header(*sres_, r);
    if (cur_.version >= 11) {
      sres_->chunked(true);
    } else {
      keep_alive = false;  // HTTP/1.0 has no chunked encoding: the body ends when the connection closes
    }
    sres_->keep_alive(keep_alive);
    stream_close_after_ = !keep_alive;
    sres_->body().data = nullptr;
    sres_->body().more = true;
    ssr_.emplace(*sres_);
    set_deadline(st_->cfg.read_timeout);
    stream_writing_ = true;
    bhttp::async_write_header(stream_, *ssr_, beast::bind_front_handler(&session::on_stream_write, self()));
    watch_client(++stream_generation_);
  }

  // A source may make its next piece only seconds later (a change subscription with
  // nothing to say writes a heartbeat every few seconds), and a client that closed its
  // connection would be noticed only at that write. So while the stream lasts the socket
  // is watched: an end of input or an error aborts the stream at once, which releases
  // its source. Input the client sends meanwhile (a pipelined request) ends the watch
  // and stays unread for the parser. A TLS client's close_notify is input too: over TLS
  // the close is noticed at the next write.
  void watch_client(uint64_t generation) {
    tcp_layer().async_wait(tcp::socket::wait_read, [self = self(), generation](beast::error_code ec) {
      self->on_client_readable(ec, generation);
    });
  }

  void on_client_readable(beast::error_code ec, uint64_t generation) {
    if (generation != stream_generation_ || phase_ != phase::streaming || !source_ || closed_) return;
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      char c;
      const auto n = ::recv(tcp_layer().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // a request, not an end
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return watch_client(generation);
    }
    log()->debug("request {}: the client closed its connection during a streamed response", cur_.request_id);
    // A write in flight uses the serializer: closing the socket ends it with an error,
    // and its handler releases the stream. Otherwise the stream waits for its source,
    // and nothing in flight refers to what is released.
    if (stream_writing_) return close();
    abort_stream("client gone");
  }

  void on_stream_write(beast::error_code ec, std::size_t) {
    stream_writing_ = false;
    if (ec == bhttp::error::need_buffer) ec = {};  // the piece was written; the serializer wants the next one
    if (ec) {
      // The client went away or stopped reading past the deadline: not a server error.
      log()->debug("request {}: streamed response cut off: {}", cur_.request_id, ec.message());
      return abort_stream("client gone");
    }
    if (ssr_->is_done()) return finish_stream();
    next_piece();
  }

  // Asks the source for the next piece. The source answers from any thread, possibly
  // much later (it may read a store or ask other servers); the answer comes back to the
  // strand through on_piece(). The deadline covers the wait: a source that stalls is cut
  // off like a client that stops reading.
  void next_piece() {
    set_deadline(st_->cfg.read_timeout);
    auto ex = stream_.get_executor();
    try {
      source_->next([self = self(), ex](body_source::piece p) {
        net::post(ex, [self, p = std::move(p)]() mutable { self->on_piece(std::move(p)); });
      });
    } catch (const std::exception& e) {
      log()->error("request {}: streamed response aborted, body source threw: {}", cur_.request_id, e.what());
      abort_stream("source failed");
    } catch (...) {
      log()->error("request {}: streamed response aborted, body source threw a non-std exception", cur_.request_id);
      abort_stream("source failed");
    }
  }

  void on_piece(body_source::piece p) {
    if (!source_) return;  // aborted while the piece was being made
    if (closed_) {
      // The deadline passed while the source worked: nobody to write to.
      release_stream();
      log_request("stalled");
      return;
    }
    if (p.failed) {
      log()->error("request {}: streamed response aborted: its body source failed", cur_.request_id);
      return abort_stream("source failed");
    }
    if (p.data.empty() && p.more) {
      // Nothing to write yet. Yield the strand before asking again, so other work on
      // this thread runs in between; a source that keeps doing this is broken.
      if (++empty_pieces_ > max_empty_pieces) {
        log()->error("request {}: streamed response aborted, body source returned {} empty pieces in a row",
                     cur_.request_id, empty_pieces_);
        return abort_stream("source stalled");
      }
      net::post(stream_.get_executor(), beast::bind_front_handler(&session::next_piece, self()));
      return;
    }
    empty_pieces_ = 0;
    piece_ = std::move(p.data);
    if (!p.more) source_.reset();  // the body is complete: release the source (and its snapshot) now
    auto& body = sres_->body();
    body.data = piece_.empty() ? nullptr : piece_.data();
    body.size = piece_.size();
    body.more = p.more;  // false: the serializer appends the last chunk after this piece
    set_deadline(st_->cfg.read_timeout);
    stream_writing_ = true;
    bhttp::async_write(stream_, *ssr_, beast::bind_front_handler(&session::on_stream_write, self()));
  }

  void release_stream() {
    ssr_.reset();  // the serializer refers to the message: destroy it first
    sres_.reset();
    source_.reset();
    piece_ = {};  // a piece can be large; do not keep its capacity for the connection's lifetime
  }

  void finish_stream() {
    release_stream();
    log_request("");
    if (stream_close_after_) return lingering_close();
    do_read();
  }

  // Ends the connection without the terminating chunk, so the client sees a truncated
  // body (an error for any HTTP client) rather than a complete-looking wrong one.
  void abort_stream(std::string_view why) {
    release_stream();
    log_request(why);
    close();
  }

  // --- logging ---------------------------------------------------------------------

  // One debug line per request. Never headers (Authorization, tokens) and never the
  // query string.
  void log_request(std::string_view outcome) {
    const auto& l = log();
    if (!l->should_log(spdlog::level::debug)) return;
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - cur_.start.value_or(now)).count();
    std::string_view path(cur_.path);
    if (path.size() > 256) path = path.substr(0, 256);
    l->debug("{} {} {} {:.1f}ms id={}{}{}", cur_.method, path, cur_.status, ms, cur_.request_id,
             outcome.empty() ? "" : " ", outcome);
  }

  // Closing a socket with unread input makes the kernel send RST, which can destroy
  // the response we just wrote before the client reads it (typical after a 413 or 431,
  // where the client is still sending). So: stop sending, discard input until the
  // client closes or a short bound passes, then close.
  void lingering_close() {
    phase_ = phase::draining;
    if (st_->stopping) return close();
    set_deadline(std::min<std::chrono::milliseconds>(st_->cfg.read_timeout, std::chrono::seconds(2)));
    if constexpr (is_tls) {
      // TLS ends with close_notify both ways; waiting for the client's also consumes
      // what it was still sending, within the same bound.
      stream_.async_shutdown([self = self()](beast::error_code) { self->close(); });
      return;
    }
    beast::error_code ec;
    tcp_layer().shutdown(tcp::socket::shutdown_send, ec);  // peer may be gone already
    do_drain();
  }

  void do_drain() {
    stream_.async_read_some(net::buffer(drain_buf_), [self = self()](beast::error_code ec, std::size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > max_drain_bytes) return self->close();
      self->do_drain();
    });
  }

  static constexpr std::size_t max_drain_bytes = 16 * 1024 * 1024;
  // A source returning this many empty pieces in a row is treated as broken: it would
  // otherwise keep an I/O thread spinning on a connection that makes no progress.
  static constexpr int max_empty_pieces = 1000;

  const bool overloaded_;
  Stream stream_;
  std::shared_ptr<shared_state> st_;
  // Persists across requests: it may hold pipelined bytes. Bounded (see the
  // constructor), so that a header, chunk line or trailer section that never ends
  // cannot grow it; the parser's own header limit covers the header block only.
  beast::flat_buffer buffer_;
  // Header block, chunk extension and trailer bytes of the current request.
  std::size_t meta_bytes_ = 0;
  // The parser's chunk header callback (it keeps a reference, so it lives here).
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> count_chunk_extensions_ =
      [this](std::uint64_t, beast::string_view extensions, beast::error_code& ec) {
        meta_bytes_ += extensions.size();
        if (meta_bytes_ > st_->cfg.max_header_bytes) ec = bhttp::error::header_limit;
      };
  // Fields of the current request's header block (later ones are trailers).
  std::size_t header_fields_ = 0;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::response<bhttp::empty_body>> continue_;
  // The response being written: status line and fields, then the body. Both must
  // outlive the write; their capacity is reused by the connection's next response.
  std::string head_;
  std::string body_;
  static constexpr std::size_t keep_body_capacity = 64 * 1024;
  request_info cur_;
  std::weak_ptr<reply_state> pending_;  // the reply the handler owes, while phase_ == handling
  // Streaming state, set only while phase_ == streaming. The serializer refers to sres_,
  // and sres_'s body points into piece_; all must outlive the write in flight.
  std::shared_ptr<body_source> source_;
  std::optional<bhttp::response<bhttp::buffer_body>> sres_;
  std::optional<bhttp::response_serializer<bhttp::buffer_body>> ssr_;
  std::string piece_;
  int empty_pieces_ = 0;
  bool stream_close_after_ = false;
  uint64_t stream_generation_ = 0;  // numbers the streams of the connection (watch_client)
  bool stream_writing_ = false;     // a write of the stream's header or a piece is in flight
  phase phase_ = phase::reading;
  bool close_after_response_ = false;
  std::array<char, 8192> drain_buf_{};
  std::size_t drained_ = 0;
  net::steady_timer watchdog_;
  clock::time_point deadline_ = clock::time_point::max();
  bool watchdog_armed_ = false;
  bool closed_ = false;
  std::optional<response> inline_reply_;
};

bool reply_state::complete(response r) {
  std::lock_guard lk(mu_);
  if (done_) return false;
  done_ = true;
  if (!target_) return false;
  if (target_.get() == handling_session) {
    // Called from inside handle(), on the session's strand: handle() answers it when
    // the handler returns. The session must not re-enter itself from here.
    target_->keep_inline_reply(std::move(r));
    target_.reset();
    return true;
  }
  // Posted, never dispatched: the session must not be re-entered from a thread that
  // runs its strand. Posting under mu_ is what makes abandon() safe (see the class
  // comment); post never runs the handler inline.
  auto ex = target_->executor();
  net::post(ex, [s = std::move(target_), r = std::move(r)]() mutable { s->on_reply(std::move(r)); });
  return true;
}

// Accepts connections. Owned by server::impl and by its pending accept handler;
// its handlers run on the acceptor's strand.
class listener : public std::enable_shared_from_this<listener> {
 public:
  listener(net::io_context& ioc, std::shared_ptr<shared_state> st)
      : ioc_(ioc), acceptor_(net::make_strand(ioc)), backoff_(acceptor_.get_executor()), st_(std::move(st)) {}

  // Synchronous, before the I/O threads start, so errors reach start()'s caller.
  status open(const tcp::endpoint& ep) {
    beast::error_code ec;
    if (acceptor_.open(ep.protocol(), ec)) return status::io_error("open: " + ec.message());
    if (acceptor_.set_option(net::socket_base::reuse_address(true), ec))
      return status::io_error("reuse_address: " + ec.message());
    if (acceptor_.bind(ep, ec)) {
      return status::io_error("bind " + ep.address().to_string() + ":" + std::to_string(ep.port()) + ": " +
                              ec.message());
    }
    if (acceptor_.listen(net::socket_base::max_listen_connections, ec))
      return status::io_error("listen: " + ec.message());
    auto local = acceptor_.local_endpoint(ec);
    if (ec) return status::io_error("local_endpoint: " + ec.message());
    port_ = local.port();
    return {};
  }

  uint16_t port() const { return port_; }

  void run() { do_accept(); }

  void close() {
    net::post(acceptor_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->acceptor_.close(ec);  // already closed is fine
      self->backoff_.cancel();
    });
  }

 private:
  void do_accept() {
    // Each connection gets its own strand, so its handlers never run concurrently.
    acceptor_.async_accept(net::make_strand(ioc_), beast::bind_front_handler(&listener::on_accept, shared_from_this()));
  }

  void on_accept(beast::error_code ec, socket_type socket) {
    if (!acceptor_.is_open() || st_->stopping) return;
    if (ec) {
      // Out of file descriptors and similar: retrying at once would spin a core, and
      // the condition usually clears as connections close.
      backoff_.expires_after(std::chrono::milliseconds(50));
      backoff_.async_wait([self = shared_from_this()](beast::error_code ec) {
        if (!ec) self->do_accept();
      });
      return;
    }
    // At max_connections a few more connections are accepted only to be told so (503,
    // then closed, each within a short deadline); beyond those, a connection is closed
    // at once. Either way the connections already open keep their descriptors, and
    // RocksDB and Kafka theirs.
    std::size_t open;
    {
      std::lock_guard lk(st_->mu);
      open = st_->sessions.size();
    }
    const bool overloaded = open >= st_->cfg.max_connections;
    if (overloaded && open >= st_->cfg.max_connections + overload_answers) {
      beast::error_code ignored;
      socket.close(ignored);
      ++st_->refused;
      return do_accept();
    }
    if (overloaded) ++st_->refused;
    if (st_->tls) {
      std::make_shared<session<beast::ssl_stream<socket_type>>>(st_, overloaded, std::move(socket), *st_->tls)->run();
    } else {
      std::make_shared<session<socket_type>>(st_, overloaded, std::move(socket))->run();
    }
    do_accept();
  }

  // Connections beyond max_connections that still get a 503 before being closed.
  static constexpr std::size_t overload_answers = 64;

  net::io_context& ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer backoff_;
  std::shared_ptr<shared_state> st_;
  uint16_t port_ = 0;
};

// The one code path: a synchronous handler is an asynchronous one that answers at once.
// An exception escapes to session::handle(), which turns it into a 500.
async_handler wrap_sync(handler h) {
  if (!h) return {};
  return [h = std::move(h)](const request& req, const responder& reply) { reply(h(req)); };
}

// TLS 1.2 and 1.3 only. TLS 1.3 suites are OpenSSL's (all AEAD); for 1.2, only
// forward-secret AEAD suites. Errors name the file that could not be used.
result<std::unique_ptr<net::ssl::context>> make_server_tls(const tls_config& tls) {
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  beast::error_code ec;
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                       net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 | net::ssl::context::no_compression |
                       net::ssl::context::single_dh_use,
                   ec);
  if (ec) return status::invalid_argument("http.tls: " + ec.message());
  SSL_CTX* native = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1)
    return status::invalid_argument("http.tls: cannot require TLS 1.2");
  if (SSL_CTX_set_cipher_list(native, "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!SHA1:!DSS") != 1)
    return status::invalid_argument("http.tls: no usable TLS 1.2 cipher suite");
  SSL_CTX_set_options(native, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION);
  ctx->use_certificate_chain_file(tls.cert_file, ec);
  if (ec) return status::invalid_argument("http.tls.cert_file '" + tls.cert_file + "': " + ec.message());
  ctx->use_private_key_file(tls.key_file, net::ssl::context::pem, ec);
  if (ec) return status::invalid_argument("http.tls.key_file '" + tls.key_file + "': " + ec.message());
  if (SSL_CTX_check_private_key(native) != 1)
    return status::invalid_argument("http.tls.key_file '" + tls.key_file + "' does not match http.tls.cert_file");
  if (!tls.client_ca_file.empty()) {
    ctx->load_verify_file(tls.client_ca_file, ec);
    if (ec) return status::invalid_argument("http.tls.client_ca_file '" + tls.client_ca_file + "': " + ec.message());
    ctx->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert, ec);
    if (ec) return status::invalid_argument("http.tls.client_ca_file: " + ec.message());
  }
  return ctx;
}

std::string random_prefix() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

}  // namespace

struct server::impl {
  impl(server_config cfg, async_handler h)
      : st(std::make_shared<shared_state>(std::move(cfg), std::move(h))), ioc(std::max(1, st->cfg.threads)) {
    st->id_prefix = random_prefix();
  }

  std::shared_ptr<shared_state> st;
  std::mutex lifecycle_mu;  // serialises start() and stop()
  bool started = false;
  bool stopped = false;
  uint16_t port = 0;
  // Declared after st and before listener: the listener's acceptor must die before
  // the io_context, and sessions destroyed by the io_context still need st.
  net::io_context ioc;
  // Keeps ioc.run() from returning while stop() still posts on_stop() to sessions:
  // without it the threads can run out of work (acceptor closed, last handler done)
  // just before the post, and the posted handler, holding a session, never runs.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::shared_ptr<listener> lst;
  std::vector<std::thread> threads;
};

server::server(server_config cfg, handler h) : impl_(std::make_unique<impl>(std::move(cfg), wrap_sync(std::move(h)))) {}

server::server(server_config cfg, async_handler h) : impl_(std::make_unique<impl>(std::move(cfg), std::move(h))) {}

server::~server() { stop(); }

status server::start() {
  std::lock_guard lk(impl_->lifecycle_mu);
  if (impl_->started) return status::internal("server already started");
  if (!impl_->st->handler) return status::invalid_argument("server needs a handler");

  const auto& cfg = impl_->st->cfg;
  beast::error_code ec;
  auto addr = net::ip::make_address(cfg.listen_address, ec);
  if (ec) return status::invalid_argument("listen_address '" + cfg.listen_address + "': " + ec.message());

  if (cfg.tls.enabled()) {
    auto ctx = make_server_tls(cfg.tls);
    if (!ctx.ok()) return ctx.error();
    impl_->st->tls = std::move(ctx.value());
  }
  auto lst = std::make_shared<listener>(impl_->ioc, impl_->st);
  if (status s = lst->open(tcp::endpoint(addr, cfg.port)); !s.ok()) return s;
  impl_->port = lst->port();
  impl_->lst = std::move(lst);
  impl_->lst->run();
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->started = true;

  const int n = std::max(1, cfg.threads);
  impl_->threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    impl_->threads.emplace_back([this] {
      name_this_thread("ks-http");
      impl_->ioc.run();
    });
  }
  return {};
}

void server::stop() {
  std::lock_guard lk(impl_->lifecycle_mu);
  if (!impl_->started || impl_->stopped) {
    impl_->stopped = true;
    return;
  }
  impl_->stopped = true;
  auto& st = *impl_->st;

  // Set `stopping` under the session mutex: a session registering after we take the
  // snapshot below sees the flag in its first do_read and closes itself.
  std::vector<std::shared_ptr<session_base>> live;
  {
    std::lock_guard slk(st.mu);
    st.stopping = true;
    for (auto& [_, w] : st.sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  impl_->lst->close();
  for (auto& s : live) {
    net::post(s->executor(), [s] { s->on_stop(); });
  }
  live.clear();  // our references must not keep sessions alive while we wait

  {
    std::unique_lock slk(st.mu);
    st.sessions_done.wait_for(slk, st.cfg.shutdown_grace, [&] { return st.sessions.empty(); });
  }
  // Whatever is still running after the grace period is abandoned: its handlers are
  // destroyed with the io_context, which closes the sockets.
  impl_->work.reset();
  impl_->ioc.stop();
  bool detached = false;
  for (auto& t : impl_->threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      // stop() called from a handler (not supported: it waits out the whole grace for
      // its own request). Joining ourselves would throw; detaching is the lesser evil.
      t.detach();
      detached = true;
    } else if (t.joinable()) {
      t.join();
    }
  }
  impl_->threads.clear();

  // Sessions still waiting for an async handler's reply are kept alive only by that
  // reply: cut them loose now, so their sockets close and nothing refers to the
  // io_context once the server is gone. A late reply is then dropped silently. With
  // the I/O threads joined, no strand runs, so touching the sessions here is safe
  // (not so if a thread had to be detached; then they are left to the io_context).
  if (!detached) {
    std::vector<std::shared_ptr<session_base>> left;
    {
      std::lock_guard slk(st.mu);
      for (auto& [_, w] : st.sessions) {
        if (auto s = w.lock()) left.push_back(std::move(s));
      }
    }
    if (!left.empty())
      log()->warn("stop: {} connection(s) still busy after the shutdown grace; closing them", left.size());
    for (auto& s : left) s->abandon_pending_reply();
    left.clear();  // outside st.mu: a session's destructor takes it
  }
}

uint16_t server::port() const { return impl_->port; }

void server::begin_drain() {
  if (impl_->st) impl_->st->draining = true;
}

uint64_t server::refused_connections() const { return impl_->st ? impl_->st->refused.load() : 0; }

size_t server::open_connections() const {
  if (!impl_->st) return 0;
  std::lock_guard lk(impl_->st->mu);
  return impl_->st->sessions.size();
}

}  // namespace kstate::http
