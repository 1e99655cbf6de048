#pragma once
// Plain request/response types for handlers. Handlers are functions from request to
// response and never touch sockets; Boost.Beast stays inside server.cc.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kstate::http {

// The server makes each request with std::make_shared, so that a handler that answers
// later can keep it (weak_from_this().lock()) instead of copying it.
struct request : std::enable_shared_from_this<request> {
  request() = default;

  std::string method;                 // "GET", "POST", ...
  std::string target;                 // raw request target, e.g. "/v1/stores/a%2Fb/keys/x?key_format=string"
  std::string path;                   // raw (still percent-encoded) path part of target
  std::vector<std::string> segments;  // path segments, percent-decoded (may contain '/', NUL)
  std::multimap<std::string, std::string> query;             // decoded query parameters, in order of appearance
  std::vector<std::pair<std::string, std::string>> headers;  // as received; names lower-cased
  std::string body;
  std::string request_id;  // X-Request-Id from the client, or generated

  // First value of a header (name compared case-insensitively), if present.
  std::optional<std::string> header(std::string_view name) const;
  // First value of a query parameter, if present.
  std::optional<std::string> param(std::string_view name) const;
};

// A response body produced piece by piece (NDJSON scans), sent with chunked transfer
// encoding. The server asks for the next piece only after the previous one was written
// to the socket, so a slow client never makes the server hold more than one piece.
//
// next() is called on an I/O thread and must not block: a source whose pieces take
// work to produce (reading a store, asking other servers) does that work elsewhere and
// calls `done` from there. `done` must be called exactly once per next(), from any
// thread, possibly before next() returns. A piece with `failed` set, or an exception
// from next(), aborts the response: the connection closes without the final chunk, so
// the client sees a truncated body rather than a wrong one. The server releases the
// source (and what it holds) as soon as the body is complete or aborted, and when the
// client stops reading past the read timeout.
class body_source {
 public:
  struct piece {
    std::string data;     // may be empty (nothing yet) while `more`
    bool more = false;    // false: this is the last piece
    bool failed = false;  // the body cannot be completed
  };
  virtual ~body_source() = default;
  virtual void next(std::function<void(piece)> done) = 0;
};

// A source whose pieces are cheap to make in memory (bounded work, no I/O): produce()
// runs on the I/O thread.
class sync_body_source : public body_source {
 public:
  // Appends the next piece to `out`; returns false once the body is complete (`out`
  // may still hold a last piece then).
  virtual bool produce(std::string& out) = 0;
  void next(std::function<void(piece)> done) final {
    piece p;
    p.more = produce(p.data);
    done(std::move(p));
  }
};

struct response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After, Link, ...)
  // When set, `body` is ignored and the body is streamed from here (chunked).
  std::shared_ptr<body_source> stream;

  // Adds a header. On a temporary it yields the response to move from, so
  // `return make().with_header(...)` moves the body rather than copying it.
  response& with_header(std::string name, std::string value) & {
    headers.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  response&& with_header(std::string name, std::string value) && {
    headers.emplace_back(std::move(name), std::move(value));
    return std::move(*this);
  }
};

using handler = std::function<response(const request&)>;

// Completes a request. Call exactly once, from any thread; later calls are ignored.
using responder = std::function<void(response)>;
// A handler that may answer later (e.g. after waiting for ingest to reach a position)
// without holding an I/O thread. It must not block; it calls `reply` when it can.
using async_handler = std::function<void(const request&, responder reply)>;

}  // namespace kstate::http
