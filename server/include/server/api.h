#pragma once
// The REST API: translates HTTP requests into query calls and query results into JSON,
// NDJSON or problem+json, and sends what another instance must answer to that
// instance. No sockets here: the handler is a function from request to a (possibly
// later) response.
//
// Inside (server/src/api/): a route table (routes.cc), parameter parsing (params.cc),
// one file per family of handlers (keys.cc, ranges.cc, admin.cc), each handler
// returning what happens next as a value: an answer, local work (after a min_position
// wait, on a worker thread), a forward to the key's owner, or a gather of parts from
// several owners; dispatch.cc runs that, fanout.cc talks to the other instances.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/json_check.h"
#include "core/membership.h"
#include "core/ownership.h"
#include "ingest/change_feed.h"
#include "http/message.h"
#include "query/engine.h"
#include "query/freshness.h"

namespace prometheus {
class Registry;
class Collectable;
}  // namespace prometheus
namespace kstate::http {
class client;
}

namespace kstate::server {

class token_authenticator;
class snapshot_sender;

// The `query:` section of the configuration: limits of what one request may ask.
struct api_config {
  // Entries per range page when the request gives no limit. Default 100.
  uint32_t default_limit = 100;
  // Largest limit a request may ask for. Default 1,000.
  uint32_t max_limit = 1'000;
  // Most keys in one batchGet (after duplicates are removed). Default 1,000.
  uint32_t max_batch_keys = 1'000;
  // Streaming (NDJSON) scans open at once; more get 503 + Retry-After. Default 8.
  uint32_t max_concurrent_scans = 8;
  // Count answers are exact (a scan) up to this many keys (RocksDB's estimate),
  // estimated above it. Default 1,000,000.
  uint64_t exact_count_limit = 1'000'000;
  // min_position wait when the request gives no timeout_ms, and the most it may ask.
  std::chrono::milliseconds default_wait{5'000};
  std::chrono::milliseconds max_wait{60'000};
  // Largest body of one answer, bytes: a range page ends early (with a cursor) before
  // it; a batch that would exceed it is refused (400, 40009). Default 16 MiB.
  std::size_t max_response_bytes = 16u << 20;
  // Deepest nesting of JSON in a request (keys with key_format=json, request bodies);
  // deeper is 400. Default 128 (the top-level max_json_depth).
  int max_json_depth = default_max_json_depth;
  // Threads running the API's blocking work (exact counts, window pages, scans, reads
  // after a min_position wait, merges), and the most tasks that may wait for them;
  // beyond it 503 (50308). Defaults 2 and 1,024.
  int worker_threads = 2;
  std::size_t max_queued_work = 1'024;
  // Change subscriptions (GET .../changes) open at once; more get 503 (50309).
  // Default 64.
  uint32_t max_subscriptions = 64;
  // A subscription with nothing to send says where it is this often (not a YAML key:
  // the server sets it under http.read_timeout_ms, which would cut a silent stream).
  std::chrono::milliseconds feed_heartbeat{5'000};
};

// Coalescing of forwarded requests to one owner (the `http.peer_batch` section,
// docs/cluster.md#forwarding). While fewer than `max_in_flight` exchanges to an owner
// are under way, a forwarded GET goes at once on its own; beyond that it waits, and
// when an exchange ends the waiting requests go together, at most `max_requests` in
// one internal request, each answer passed on exactly as if it had gone alone.
struct peer_batch_config {
  // Exchanges of forwarded requests under way to one owner before further ones wait to
  // go together. 0: every forwarded request goes alone at once (no coalescing).
  // Default 2.
  uint32_t max_in_flight = 2;
  // Most requests in one batch (1 to 1,024). Default 64.
  uint32_t max_requests = 64;
};

// The secret every instance of the group shares (at least 16 bytes), which signs the
// requests instances send each other (server/src/api/peer_auth.h). Set once, when it is
// known (read from a file, or from Kafka once the instance reaches it); until then
// nothing is forwarded or gathered and no request is taken as a peer's.
// Thread safety: any thread.
class peer_secret {
 public:
  void set(std::string secret);
  // Null until set.
  std::shared_ptr<const std::string> get() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const std::string> secret_;  // guarded by mu_
};

struct api_context {
  const query::engine* queries = nullptr;
  query::freshness_waiter* waiter = nullptr;
  const ownership_registry* ownership = nullptr;
  // Who owns which partition, from the consumer group (may be null: single instance).
  const membership_registry* membership = nullptr;
  // Sends requests to other instances (may be null: no forwarding).
  http::client* peers = nullptr;
  // The group's shared secret (may be null: no forwarding, no peers).
  std::shared_ptr<const peer_secret> secret;
  // How long a request to another instance may take (plus the min_position wait it
  // carries).
  std::chrono::milliseconds forward_timeout{5'000};
  // How forwarded requests to one owner are coalesced.
  peer_batch_config peer_batch;
  std::string group;         // consumer group id (application_id)
  int standby_replicas = 0;  // standby copies per partition (to name them in answers)
  // High watermark of a partition as this instance last saw it (for the lag of stale
  // answers); may be empty.
  std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)> high_watermark;
  prometheus::Registry* metrics = nullptr;  // may be null: /metrics then answers 404
  // Read at every scrape, after `metrics`.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  // Open HTTP connections and connections refused at http.max_connections, reported
  // as metrics (may be empty).
  std::function<size_t()> open_connections;
  std::function<uint64_t()> refused_connections;
  std::string instance;                         // advertised endpoint, reported as served_by
  const std::atomic<bool>* draining = nullptr;  // true once shutdown began: /readyz 503
  std::string openapi_json;                     // served at /openapi.json
  std::string ui_dir;                           // built dashboard served at /ui/; empty: none
  // Bearer-token authentication and scopes (null: every route open). /livez, /readyz,
  // /openapi.json and /ui/ stay open; /metrics is open when `open_metrics`.
  std::shared_ptr<const token_authenticator> auth;
  bool open_metrics = false;
  api_config limits;
  // Sends copies of this instance's partitions to instances taking them over (internal
  // routes); null: none are sent.
  std::shared_ptr<snapshot_sender> snapshots;
  // Opens a reader of a view's changes from the given positions (partition -> next
  // offset; nullopt: the end), for change subscriptions (ingest/change_feed.h).
  // Empty: the changes route answers 503.
  std::function<result<std::unique_ptr<ingest::change_feed>>(
      const view_def&, const std::map<int32_t, std::optional<int64_t>>&, const ingest::feed_options&)>
      open_feed;
};

// One route: method and path template, e.g. GET /v1/stores/{store}/keys/{key}.
struct route_info {
  std::string method;
  std::string path;
  std::vector<std::string> params;  // query parameters a client may give, sorted
};
// Every route the API answers (the OpenAPI spec must describe exactly these).
std::vector<route_info> api_routes();

// The handler serving /livez, /readyz, /metrics, /openapi.json, /ui/ and /v1/... .
// Owns the API's worker threads; they stop when the last copy of the handler is
// destroyed.
http::async_handler make_api_handler(api_context ctx);

}  // namespace kstate::server
