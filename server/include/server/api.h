#pragma once
// The REST API: translates HTTP requests into query calls and query results into JSON
// or problem+json. Plain functions from request to response; no sockets here.

#include <atomic>
#include <functional>
#include <string>

#include "core/ownership.h"
#include "query/engine.h"
#include "server/http.h"

namespace prometheus { class Registry; }

namespace kstate::server {

struct api_context {
  const query::engine* queries = nullptr;
  const ownership_registry* ownership = nullptr;
  prometheus::Registry* metrics = nullptr;  // may be null: /metrics then answers 404
  std::string instance;                     // advertised endpoint, reported in answers
  const std::atomic<bool>* draining = nullptr;  // true once shutdown began: /readyz 503
};

// The handler serving /livez, /readyz, /metrics and /v1/... .
http_handler make_api_handler(api_context ctx);

}  // namespace kstate::server
