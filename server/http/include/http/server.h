#pragma once
// server: an asynchronous HTTP/1.1 server (Boost.Beast on Boost.Asio).
//
// Modelled on Beast's advanced server: a listener accepts on an acceptor, each
// connection is a session on its own strand; a fresh parser per request with header and
// body limits; a deadline set before every read (slow clients are cut off); keep-alive;
// handlers run on the I/O threads and must not block for long.
//
// Ownership: the caller owns the server; start() spawns `threads` I/O threads,
// stop() (also called by the destructor) closes the listener, lets in-flight requests
// finish within `shutdown_grace`, then joins the threads.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "http/message.h"
#include "http/problem.h"

namespace kstate::http {

// TLS on a listening port. With a certificate configured the port speaks TLS only
// (TLS 1.2 and 1.3, OpenSSL's default ciphers minus the weak ones); a plain HTTP client
// gets its connection closed, never an answer.
struct tls_config {
  // PEM certificate chain (server certificate first) and its PEM private key. Both or
  // neither. Empty: plain HTTP.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle. When set, every client must present a certificate signed by one of
  // these CAs (mutual TLS); a client without one fails the handshake.
  std::string client_ca_file;
  bool enabled() const { return !cert_file.empty(); }
};

struct server_config {
  // Address to listen on. Default: loopback only.
  std::string listen_address = "127.0.0.1";
  // TCP port; 0 picks a free port (see server::port()).
  uint16_t port = 8080;
  // Number of I/O threads running handlers.
  int threads = 2;
  // Connections open at once. Beyond it a new connection is answered 503 (the
  // error renderer's `overloaded`) and closed, or closed at once when even those
  // answers are backed up, so a flood of connections cannot take the file descriptors
  // the rest of the process needs. Default 1,024.
  std::size_t max_connections = 1024;
  // Largest request header block accepted, bytes; larger -> 431.
  uint32_t max_header_bytes = 16 * 1024;
  // Largest request body accepted, bytes; larger -> 413.
  uint64_t max_body_bytes = 1024 * 1024;
  // Largest request target (path + query), bytes; longer -> 414.
  uint32_t max_target_bytes = 8 * 1024;
  // Deadline for reading one whole request (headers + body), and idle time allowed
  // between keep-alive requests.
  std::chrono::milliseconds read_timeout{10'000};
  // Time stop() lets in-flight requests finish before connections are closed.
  std::chrono::milliseconds shutdown_grace{5'000};
  // TLS; disabled by default.
  tls_config tls;
  // Renders the answers the server gives by itself (malformed requests, limits, a
  // handler that failed). Empty: http::default_error.
  error_renderer render_error;
};

class server {
 public:
  server(server_config cfg, handler h);
  server(server_config cfg, async_handler h);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Binds, listens and starts the I/O threads. Error when the address cannot be bound.
  status start();
  // Stops accepting, finishes in-flight requests (bounded by shutdown_grace), joins.
  void stop();
  // The bound port (useful when the configured port was 0). Valid after start().
  uint16_t port() const;
  // From now on every response closes its connection (Connection: close), so clients
  // move away before stop(). Any thread.
  void begin_drain();
  // Connections currently open.
  size_t open_connections() const;
  // Connections refused (or answered 503 and closed) at max_connections, since start.
  uint64_t refused_connections() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::http
