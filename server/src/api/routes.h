#pragma once
// The route table: every route the API answers, what it needs from the caller, which
// parameters it takes, and its handler. One table, so the OpenAPI test can compare it
// with docs/openapi.json and no route can forget its access rule.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/state.h"

namespace kstate::server::api {

// What a route needs from the caller when a token file is configured. A route that
// says nothing needs the store scope of its {store}: a new route is closed until
// someone decides otherwise.
enum class access {
  open,       // anyone: health probes and the API description
  any_token,  // any valid token; the answer shows only what its scopes cover
  store,      // a token whose stores scope covers the {store} in the path
  cluster,    // a token with the cluster scope
  metrics,    // a token with the metrics scope, unless auth.metrics is "open"
  peer,       // only another instance of the group (a signed request); not in the public API
};

struct route {
  std::string method;
  std::vector<std::string> pattern;  // literal segments; "{store}", "{key}" capture
  std::set<std::string> params;      // query parameters a client may give
  // Query parameters only another instance may give (DESIGN.md invariant 10).
  std::set<std::string> internal_params;
  bool waits = false;  // takes min_position / timeout_ms
  handler_fn fn = nullptr;
  access need = access::store;

  std::string path_template() const;
};

const std::vector<route>& routes();

// The route for `req`'s method and segments, with its captures filled in, or nullopt;
// `allow` then lists the methods the path does take (for 405).
struct matched {
  const route* r;
  std::string store, key;
};
std::optional<matched> match(const http::request& req, std::string& allow);

// nullopt when the caller may use the route; otherwise the 401 or 403 answer.
// `who` receives the caller's principal when tokens are on.
std::optional<http::response> authorize(const state& st, const http::request& req, const route& r,
                                        const std::string& store, std::shared_ptr<const principal>& who);

}  // namespace kstate::server::api
