#include "api/routes.h"

#include <spdlog/spdlog.h>

#include "api/handlers.h"
#include "server/problem.h"
#include "log.h"

namespace kstate::server::api {

std::string route::path_template() const {
  std::string s;
  for (const auto& p : pattern) s += "/" + p;
  return s;
}

const std::vector<route>& routes() {
  static const std::vector<route> r = {
      {"GET", {"livez"}, {}, {}, false, &livez, access::open},
      {"GET", {"readyz"}, {}, {}, false, &readyz, access::open},
      {"GET", {"metrics"}, {}, {}, false, &metrics, access::metrics},
      {"GET", {"openapi.json"}, {}, {}, false, &openapi, access::open},
      {"GET", {"v1", "stores"}, {}, {}, false, &list_stores, access::any_token},
      {"GET", {"v1", "stores", "{store}"}, {}, {}, false, &describe_store},
      {"GET",
       {"v1", "stores", "{store}", "keys", "{key}"},
       {"key_format", "min_position", "timeout_ms", "allow_stale", "as_of"},
       {},
       true,
       &get_key},
      {"GET",
       {"v1", "stores", "{store}", "keys"},
       {"from", "to", "prefix", "limit", "cursor", "order", "key_format", "min_position", "timeout_ms", "allow_stale",
        "as_of"},
       {"partitions", "after"},
       true,
       &range},
      {"GET",
       {"v1", "stores", "{store}", "changes"},
       {"key", "keys", "prefix", "from", "to", "from_position", "key_format", "snapshot"},
       {},
       false,
       &changes},
      {"POST",
       {"v1", "stores", "{store}", "keys:batchGet"},
       {"key_format", "min_position", "timeout_ms", "as_of"},
       {},
       true,
       &batch_get},
      {"GET",
       {"v1", "stores", "{store}", "count"},
       {"min_position", "timeout_ms", "as_of"},
       {"partitions"},
       true,
       &count},
      {"GET", {"v1", "stores", "{store}", "keys", "{key}", "metadata"}, {"key_format"}, {}, false, &key_metadata},
      {"GET",
       {"v1", "stores", "{store}", "keys", "{key}", "versions"},
       {"from", "to", "limit", "key_format"},
       {},
       false,
       &key_versions},
      {"GET", {"v1", "stores", "{store}", "windows", "{key}"}, {"from", "to", "key_format"}, {}, false, &key_windows},
      {"GET",
       {"v1", "stores", "{store}", "windows"},
       {"from", "to", "key_from", "key_to", "limit", "cursor", "key_format"},
       {"partitions", "after"},
       false,
       &windows_range},
      {"GET", {"v1", "cluster"}, {"scope"}, {}, false, &cluster, access::cluster},
      {"GET",
       {"v1", "stores", "{store}", "partitions", "{key}", "snapshot"},
       {},
       {"session", "page"},
       false,
       &snapshot_get,
       access::peer},
      {"POST",
       {"v1", "stores", "{store}", "partitions", "{key}", "snapshot"},
       {},
       {},
       false,
       &snapshot_open,
       access::peer},
      {"POST", {"v1", "internal", "forwards"}, {}, {}, false, &internal_forwards, access::peer},
  };
  return r;
}

std::optional<matched> match(const http::request& req, std::string& allow) {
  for (const auto& r : routes()) {
    if (r.pattern.size() != req.segments.size()) continue;
    matched m{&r, {}, {}};
    bool ok = true;
    for (size_t i = 0; ok && i < req.segments.size(); ++i) {
      const auto& p = r.pattern[i];
      if (p == "{store}") m.store = req.segments[i];
      else if (p == "{key}") m.key = req.segments[i];
      else ok = p == req.segments[i];
    }
    if (!ok) continue;
    if (r.method == req.method) return m;
    allow += (allow.empty() ? "" : ", ") + r.method;
  }
  return std::nullopt;
}

std::optional<http::response> authorize(const state& st, const http::request& req, const route& r,
                                        const std::string& store, std::shared_ptr<const principal>& who) {
  if (!st.ctx.auth) return std::nullopt;
  if (r.need == access::open || (r.need == access::metrics && st.ctx.open_metrics)) return std::nullopt;
  who = st.ctx.auth->authenticate(req.header("authorization"));
  if (!who) {
    const bool presented = req.header("authorization").has_value();
    return problem(failure_reason::unauthenticated,
                   presented ? "the bearer token is not valid" : "this route needs an Authorization: Bearer token",
                   req.path)
        .with_header("WWW-Authenticate",
                     presented ? "Bearer realm=\"kstate\", error=\"invalid_token\"" : "Bearer realm=\"kstate\"");
  }
  bool allowed = false;
  std::string what;
  switch (r.need) {
    case access::open:
    case access::any_token: allowed = true; break;
    case access::store:
      allowed = who->scopes.store_allowed(store);
      what = "store '" + store + "'";
      break;
    case access::cluster:
      allowed = who->scopes.cluster;
      what = "cluster metadata";
      break;
    case access::metrics:
      allowed = who->scopes.metrics;
      what = "metrics";
      break;
    case access::peer: what = "internal routes"; break;  // never a client's (dispatch refuses them first)
  }
  if (allowed) return std::nullopt;
  // The token's name (never the token) says whose request was refused.
  server_log()->debug("request {}: token '{}' may not read {}", req.request_id, who->name, what);
  return problem(failure_reason::forbidden, "this token may not read " + what, req.path)
      .with_header("WWW-Authenticate", "Bearer realm=\"kstate\", error=\"insufficient_scope\"");
}

}  // namespace kstate::server::api
