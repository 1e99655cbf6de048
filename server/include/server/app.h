#pragma once
// app: one kstate instance, wired: RocksDB state, the ingest engine, the query engine
// and the HTTP server. The binary (server/main.cc) is a thin shell around it; an
// application embedding kstate uses it the same way (or only queries(), without HTTP).
//
// Threading: create/start/stop from one controlling thread. queries() is safe to use
// from any thread between start() and stop().

#include <memory>

#include "core/membership.h"
#include "core/ownership.h"
#include "core/status.h"
#include "http/message.h"
#include "query/engine.h"
#include "server/config.h"

namespace kstate::server {

// Checks that a state directory is safe to use, creating it (mode 0700, parents as
// needed) when it does not exist: it must be a directory owned by this user and not
// writable by group or others (another user could otherwise plant or swap the files
// kstate trusts). The error says what is wrong and how to fix it. app::start() calls it.
status secure_state_dir(const std::string& path);

class app {
 public:
  static result<std::unique_ptr<app>> create(app_config cfg);
  ~app();

  // Opens the state, starts consuming and serving. Errors name what failed.
  status start();
  // /readyz turns 503 so load balancers stop sending traffic; everything else goes on.
  void begin_drain();
  // Answers every pending and later min_position wait at once (503, shutting down), so
  // that requests in flight finish before stop(). Any thread.
  void end_waits();
  // Asks the instance to stop: a start() still waiting for Kafka gives up, and wait()
  // returns. Safe from any thread (e.g. a signal-handling thread).
  void request_stop();
  // Blocks until request_stop() or a fatal ingest error; returns the exit code (0 on a
  // requested stop, 1 on a fatal error), or `restart_to_reopen` when the state must be
  // reopened (storage::db::must_reopen(): a file deleted under the running instance, or
  // RocksDB stopped on an error only a reopen clears): the caller stops this app and
  // starts a new one on the same configuration, whose start moves a damaged state aside
  // and rebuilds it (storage::db::open).
  int wait();
  static constexpr int restart_to_reopen = 75;
  // Stops HTTP (finishing in-flight requests), writes pending state, leaves the group,
  // flushes and closes RocksDB. Idempotent.
  void stop();

  // The graceful sequence for SIGTERM: /readyz turns 503, then (when `drain` and the
  // instance was serving) the configured drain delay passes so load balancers notice,
  // then stop(). In-flight requests finish within http.shutdown_grace_ms.
  void shutdown(bool drain);

  uint16_t http_port() const;
  const query::engine& queries() const;
  // The REST API as a function, for requests made inside this process (the embedding
  // library's queries): the same routes and answers as over HTTP, forwarding and
  // gathering from other instances included, without authentication (the caller is the
  // process itself) and without request metrics. Its own worker threads
  // (query.worker_threads). Empty before start() and after stop().
  http::async_handler in_process_handler() const;
  // Who holds which partition here, and who owns which in the group (for answers that
  // name another instance). Valid from start() to stop().
  const ownership_registry& ownership() const;
  const membership_registry& membership() const;
  // The endpoint other instances reach this one at (the port actually bound).
  const std::string& endpoint() const;
  // Non-empty when ingest stopped on an unrecoverable error.
  std::string fatal_error() const;

 private:
  struct impl;
  explicit app(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::server
