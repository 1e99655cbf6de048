#pragma once
// client: the HTTP/1.1 client one kstate instance uses to forward a request to the
// instance that owns the key (Boost.Beast on Asio, kept inside client.cc like the
// server keeps Beast inside server.cc).
//
// Connections are pooled per endpoint and kept alive between requests, so forwarding
// costs one request/response on an open socket, not a TCP handshake each time.
//
// Ownership and threads: the caller owns the client. It runs its own io_context on
// `threads` I/O threads, started by the constructor and joined by the destructor. Every
// `done` callback runs on one of those threads, so it must not block for long (post
// heavy work elsewhere), and it must not destroy the client. All member functions
// are thread-safe; send() may be called from any thread (a done callback included),
// but not concurrently with or after the destructor, except from a done callback
// (which then gets unavailable).
//
// Retries: a pooled connection the peer closed while it sat idle fails on first use (the
// write or the read hits a reset or EOF before any response byte). Such a request is
// sent once more on a fresh connection, automatically. That is only safe because every
// request kstate forwards is a read (point get, batchGet, range page, count): a peer
// that did see the first copy and died before answering has changed nothing. Do not
// send non-idempotent requests through this client without revisiting that rule.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "http/message.h"

namespace kstate::http {

struct client_config {
  // I/O threads of the client's own io_context (values below 1 mean 1).
  int threads = 1;
  // Longest time resolving and connecting may take before the peer counts as
  // unreachable (unavailable). The request's deadline still applies when it is sooner.
  std::chrono::milliseconds connect_timeout{1000};
  // Default deadline for a whole exchange (resolve + connect + write + read) when the
  // request carries none.
  std::chrono::milliseconds request_timeout{5000};
  // Idle keep-alive connections kept per endpoint; a connection returned to a full pool
  // is closed.
  size_t max_idle_per_peer = 16;
  // Largest response body accepted, bytes (after chunked decoding); a larger one fails
  // with resource_exhausted and its connection is closed.
  size_t max_response_bytes = 64 * 1024 * 1024;
  // For https:// endpoints (TLS 1.2+): the CA bundle (PEM) peers' certificates must
  // chain to, empty for the system's CAs; the certificate must also name the
  // endpoint's host (DNS name, or IP address in subjectAltName).
  std::string tls_ca_file;
  // Client certificate chain and key (PEM) presented to peers that require one
  // (mutual TLS). Empty: none.
  std::string tls_cert_file;
  std::string tls_key_file;
};

struct client_request {
  // Request method, an RFC 9110 token.
  std::string method = "GET";
  // Origin-form target, e.g. "/v1/stores/s/keys/k%2F1?key_format=string": must start
  // with '/' and contain no spaces or control characters (percent-encode them).
  std::string target;
  // Extra headers, e.g. X-Kstate-Hop, X-Request-Id, Accept, Content-Type. Host and the
  // framing headers (Content-Length, Transfer-Encoding, Connection, Keep-Alive, TE,
  // Upgrade) are set by the client; values given for them here are ignored.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Absolute deadline for the whole exchange; overrides request_timeout.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// Outcome codes passed to `done`:
//   ok (a response, whatever its HTTP status: a peer's 404 or 503 is an answer)
//   invalid_argument    bad endpoint or request (not "http[s]://host[:port]", bad target/header,
//                       https:// with a TLS setup that failed: unreadable CA file ...)
//   unavailable         peer unreachable: refused, reset, closed mid-response, DNS failure,
//                       TLS handshake failed (certificate not trusted or not for this host),
//                       no connection within connect_timeout (a black-holed host: a longer
//                       deadline would not help), or the client is being destroyed. Retry
//                       later or elsewhere.
//   deadline_exceeded   the request's deadline passed before the response was complete.
//   resource_exhausted  the response was over max_response_bytes (or its header block
//                       over 64 KiB)
//   io_error            the peer sent something that is not HTTP/1.1
class client {
 public:
  explicit client(client_config cfg);
  // Stops: requests still in flight complete at once with unavailable, then the I/O
  // threads are joined (a host name still being resolved is waited for: getaddrinfo
  // cannot be interrupted). Must not run on one of the client's own threads.
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  // Sends `req` to `endpoint` ("http://host:port" or "https://host:port"; a host name is resolved, a numeric
  // address is used as is). Never blocks and never calls `done` inline: `done` is called
  // exactly once, later, on a client thread, with the response (any status) or an error
  // status (see above); an empty `done` makes the call a no-op. The response's `headers`
  // hold every header except Content-Type (in `content_type`, empty when absent) and the
  // hop-by-hop ones; a chunked body is decoded and returned whole.
  void send(const std::string& endpoint, client_request req, std::function<void(result<response>)> done);

  // Idle pooled connections to `endpoint` right now (0 for an invalid endpoint). For
  // tests and metrics.
  size_t idle_connections(const std::string& endpoint) const;
  // TCP connections opened so far (successful connects), over all endpoints.
  uint64_t connections_opened() const;
  // Why https:// endpoints cannot be used (an unreadable CA file, a client certificate
  // that does not load), or empty when they can.
  std::string tls_error() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::http
