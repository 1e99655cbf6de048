#pragma once
// The REST API: translates HTTP requests into query calls and query results into JSON,
// NDJSON or problem+json. No sockets here: the handler is a function from request to
// a (possibly later) response.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/json_check.h"
#include "core/membership.h"
#include "core/ownership.h"
#include "query/engine.h"
#include "query/freshness.h"
#include "server/http.h"

namespace prometheus { class Registry; class Collectable; }

namespace kstate::server {

class peer_client;
class token_authenticator;

struct api_config {
  // Entries per range page when the request gives no limit. Default 100.
  uint32_t default_limit = 100;
  // Largest limit a request may ask for. Default 1,000.
  uint32_t max_limit = 1'000;
  // Most keys in one batchGet. Default 1,000.
  uint32_t max_batch_keys = 1'000;
  // Streaming (NDJSON) scans open at once; more get 503 + Retry-After. Default 8.
  uint32_t max_concurrent_scans = 8;
  // Count answers are exact (a scan) up to this many keys (RocksDB's estimate),
  // estimated above it. Default 1,000,000.
  uint64_t exact_count_limit = 1'000'000;
  // min_position wait when the request gives no timeout_ms, and the most it may ask. 
  std::chrono::milliseconds default_wait{5'000};
  std::chrono::milliseconds max_wait{60'000};
  // Deepest nesting accepted in JSON a request brings (keys with key_format=json:
  // deeper is 400 bad key encoding). The top-level max_json_depth; default 128.
  int max_json_depth = default_max_json_depth;
};

struct api_context {
  const query::engine* queries = nullptr;
  query::freshness_waiter* waiter = nullptr;
  const ownership_registry* ownership = nullptr;
  // Who owns which partition, from the consumer group (may be null: single instance).
  const membership_registry* membership = nullptr;
  // Forwards requests to owners (may be null: no forwarding).
  peer_client* peers = nullptr;
  // How long a forwarded request may take.
  std::chrono::milliseconds forward_timeout{5'000};
  std::string group;  // consumer group id (application_id)
  int standby_replicas = 0;  // standby copies per partition (to name them in answers)
  // High watermark of a partition as this instance last saw it (for the lag of stale
  // answers); may be empty.
  std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)> high_watermark;
  prometheus::Registry* metrics = nullptr;  // may be null: /metrics then answers 404
  // Read at every scrape, after `metrics`.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  // Open HTTP connections, reported as kstate_http_open_connections (may be empty).
  std::function<size_t()> open_connections;
  std::string instance;                     // advertised endpoint, reported as served_by
  const std::atomic<bool>* draining = nullptr;  // true once shutdown began: /readyz 503
  std::string openapi_json;                 // served at /openapi.json
  std::string ui_dir;                       // built dashboard served at /ui/; empty: none
  // Bearer-token authentication and scopes (null: every route open). /livez, /readyz,
  // /openapi.json and /ui/ stay open; /metrics is open when `open_metrics`.
  std::shared_ptr<const token_authenticator> auth;
  bool open_metrics = false;
  api_config limits;
};

// One route: method and path template, e.g. GET /v1/stores/{store}/keys/{key}.
struct route_info {
  std::string method;
  std::string path;
  std::vector<std::string> params;  // query parameters the route accepts, sorted
};
// Every route the API answers (the OpenAPI spec must describe exactly these).
std::vector<route_info> api_routes();

// The handler serving /livez, /readyz, /metrics, /openapi.json and /v1/... .
async_http_handler make_api_handler(api_context ctx);

}  // namespace kstate::server
