#include "server/api.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <charconv>
#include <limits>
#include <condition_variable>
#include <nlohmann/json.hpp>
#include <mutex>
#include <set>
#include <spdlog/spdlog.h>
#include <sstream>

#include "core/utf8.h"
#include "query/cursor.h"
#include "query/key_format.h"
#include "ingest/standby.h"
#include "server/auth.h"
#include "server/json_render.h"
#include "server/peer_client.h"
#include "server/problem.h"
#include "server/ui.h"

namespace kstate::server {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

// ---- rendering ------------------------------------------------------------------

// Keys of bytes stores render as base64url, so they can be pasted into a URL with
// key_format=base64url; byte values render as standard base64.
json render_key(data_format f, std::string_view bytes) {
  switch (f) {
    case data_format::json: return json::parse(bytes.begin(), bytes.end(), nullptr, false);
    case data_format::string: return std::string(bytes);
    case data_format::bytes: return query::base64url_encode(bytes);
  }
  return nullptr;
}

json render_value(data_format f, std::string_view bytes) {
  switch (f) {
    // Validated at ingest; embedded as JSON.
    case data_format::json: return json::parse(bytes.begin(), bytes.end(), nullptr, false);
    case data_format::string: return std::string(bytes);
    case data_format::bytes: return query::base64_encode(bytes);
  }
  return nullptr;
}

json position_json(const position& p) {
  json o = json::object();
  for (const auto& [part, off] : p) o[std::to_string(part)] = off;
  return o;
}

// "0:12,3:40": the same position as a header value.
std::string position_header(const position& p) {
  std::string out;
  for (const auto& [part, off] : p) {
    if (!out.empty()) out += ',';
    append_int(out, part);
    out += ':';
    append_int(out, off);
  }
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

http_response json_response(unsigned status, const json& body) {
  http_response r;
  r.status = status;
  r.body = dump(body);
  return r;
}

http_response from_failure(query::failure_reason r, const std::string& msg, const std::string& path) {
  switch (r) {
    case query::failure_reason::unknown_query_store: return problem(failure_reason::unknown_store, msg, path);
    case query::failure_reason::not_active: return problem(failure_reason::not_owner, msg, path);
    case query::failure_reason::not_up_to_date: return problem(failure_reason::not_caught_up, msg, path);
    case query::failure_reason::store_exception: return problem(failure_reason::internal, msg, path);
  }
  return problem(failure_reason::internal, msg, path);
}

// ---- parameters -----------------------------------------------------------------

// Parses "p:o[,p:o...]" (offsets of records that must be applied).
std::optional<position> parse_position(std::string_view s) {
  position out;
  if (s.empty()) return std::nullopt;
  while (!s.empty()) {
    auto comma = s.find(',');
    auto item = s.substr(0, comma);
    auto colon = item.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    int32_t p;
    int64_t o;
    auto ps = item.substr(0, colon), os = item.substr(colon + 1);
    auto r1 = std::from_chars(ps.data(), ps.data() + ps.size(), p);
    auto r2 = std::from_chars(os.data(), os.data() + os.size(), o);
    if (r1.ec != std::errc() || r1.ptr != ps.data() + ps.size() || ps.empty() || p < 0) return std::nullopt;
    if (r2.ec != std::errc() || r2.ptr != os.data() + os.size() || os.empty() || o < 0) return std::nullopt;
    out[p] = std::max(out[p], o);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
    if (s.empty()) return std::nullopt;
  }
  return out;
}

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

query::key_format default_key_format(const view_def& v) {
  switch (v.key_format) {
    case data_format::json: return query::key_format::json;
    case data_format::bytes: return query::key_format::base64url;
    case data_format::string: return query::key_format::string;
  }
  return query::key_format::string;
}

// Appends a length-prefixed field, so distinct queries never share a fingerprint.
void fingerprint_add(std::string& fp, const std::optional<std::string>& v) {
  if (!v) {
    fp += '-';
    return;
  }
  fp += std::to_string(v->size()) + ':' + *v;
}

std::string query_escape(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The event-time interval [from, to) of a window query: epoch ms or RFC 3339, `from`
// defaulting to the epoch and `to` to unbounded. nullopt after filling `err`.
std::optional<std::pair<int64_t, int64_t>> interval_of(const http_request& req, http_response& err) {
  std::pair<int64_t, int64_t> out{0, std::numeric_limits<int64_t>::max()};
  for (auto [name, field] : {std::pair{"from", &out.first}, std::pair{"to", &out.second}}) {
    auto text = req.param(name);
    if (!text) continue;
    auto t = parse_timestamp_ms(*text);
    if (!t.ok()) {
      err = problem(failure_reason::bad_request, std::string(name) + ": " + t.error().message(), req.path);
      return std::nullopt;
    }
    *field = t.value();
  }
  if (out.first >= out.second) {
    err = problem(failure_reason::bad_request, "from must be before to", req.path);
    return std::nullopt;
  }
  return out;
}

// A windowed store's stored keys are (group key, window start) pairs: reading them as
// plain keys would show encoded bytes, so the key routes send the caller to /windows.
http_response windowed_store_problem(const std::string& store, const std::string& route, const std::string& path) {
  return problem(failure_reason::bad_request,
                 "store '" + store + "' is windowed; read its windows at /v1/stores/" + store + route, path);
}

// ---- routes ---------------------------------------------------------------------

struct captures {
  std::string store, key;
  // The caller, when authentication is on (set before the route runs).
  std::shared_ptr<const principal> who;
  // Set by a handler that found the answer lives on another instance: the request is
  // then forwarded there (once; a forwarded request is never forwarded again).
  mutable std::string forward_to;
  // Set by the range handler when partitions of the range are owned elsewhere: the page
  // is then gathered from every owner and merged.
  struct scatter {
    query::range_query q;
    uint32_t limit;
    std::string fingerprint;
    // Set for the windows of a windowed store: the event-time interval [from, to), ms.
    std::optional<std::pair<int64_t, int64_t>> windows;
  };
  mutable std::optional<scatter> scatter_range;
  // Set by count and batchGet when partitions they need are owned elsewhere.
  mutable bool scatter_count = false;
  struct batch {
    std::vector<std::string> keys;   // serialized
    std::vector<std::string> texts;  // as the client wrote them
    std::string key_format;
  };
  mutable std::optional<batch> scatter_batch;
};

// One entry of a range page: its serialized key (the merge order) and its JSON.
using page_entry = std::pair<std::string, json>;
bool merge_range_part(json& body, std::vector<page_entry>& entries, position* pos);
void sort_page(std::vector<page_entry>& entries, bool descending);

// Marks a request forwarded by another instance; its value is the hop count.
constexpr const char* hop_header = "X-Kstate-Hop";

// A request sent to another instance on a caller's behalf carries the caller's
// credentials unchanged, so the owner checks the same scopes again: forwarding never
// lets a caller read more than asking the owner directly would.
void carry_identity(const http_request& req, peer_request& pr) {
  if (auto a = req.header("authorization")) pr.headers.emplace_back("Authorization", *a);
}

// What a route needs from the caller when a token file is configured. A route that
// says nothing needs the store scope of its {store}: a new route is closed until
// someone decides otherwise.
enum class access {
  open,       // anyone: health probes and the API description
  any_token,  // any valid token; the answer shows only what its scopes cover
  store,      // a token whose stores scope covers the {store} in the path
  cluster,    // a token with the cluster scope
  metrics,    // a token with the metrics scope, unless auth.metrics is "open"
};

class api;
using route_fn = http_response (api::*)(const http_request&, const captures&) const;

struct route {
  std::string method;
  std::vector<std::string> pattern;  // literal segments; "{store}", "{key}" capture
  std::set<std::string> params;      // allowed query parameters
  bool waits;                        // takes min_position / timeout_ms
  route_fn fn;
  access need = access::store;
  std::string path_template() const {
    std::string s;
    for (const auto& p : pattern) s += "/" + p;
    return s;
  }
};

class api {
 public:
  explicit api(api_context ctx);
  void handle(const http_request& req, http_responder reply);
  static const std::vector<route>& routes();
  // 401 or 403 when the caller may not use route `r`; sets `c.who` otherwise.
  std::optional<http_response> authorize(const http_request& req, const route& r, captures& c) const;

  http_response livez(const http_request&, const captures&) const {
    return json_response(200, {{"status", "ok"}});
  }
  http_response readyz(const http_request&, const captures&) const;
  http_response metrics(const http_request& req, const captures&) const;
  http_response openapi(const http_request&, const captures&) const {
    http_response r;
    r.body = ctx_.openapi_json;
    return r;
  }
  http_response list_stores(const http_request&, const captures&) const;
  http_response describe_store(const http_request& req, const captures& c) const;
  http_response get_key(const http_request& req, const captures& c) const;
  http_response key_windows(const http_request& req, const captures& c) const;
  http_response range(const http_request& req, const captures& c) const;
  http_response windows_range(const http_request& req, const captures& c) const;
  http_response batch_get(const http_request& req, const captures& c) const;
  http_response count(const http_request& req, const captures& c) const;
  http_response key_metadata(const http_request& req, const captures& c) const;
  // An answer from this instance's own copy of the key's partition, marked stale with
  // its lag; nullopt when there is no copy here.
  // A key whose partition is not held here: sets c.forward_to to its owner (and
  // returns an empty response), or answers 503 not_owner for a request that was
  // already forwarded; nullopt when no owner is known.
  std::optional<http_response> to_owner(const http_request& req, const captures& c, const std::string& key) const;
  std::optional<http_response> stale_answer(const http_request& req, const std::string& store,
                                            const std::string& key) const;
  http_response cluster(const http_request& req, const captures& c) const;
  // This instance's part of /v1/cluster: readiness and the partitions it holds.
  json local_cluster_view() const;
  // /v1/cluster for the whole group: membership plus every instance's local view.
  void cluster_async(const http_request& req, std::function<void(http_response)> finish) const;
  void forward(const http_request& req, const std::string& owner, std::function<void(http_response)> finish) const;
  void range_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const;
  void count_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const;
  void batch_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const;
  // Partitions of the store's topic: those held here, and the others by owner. nullopt
  // (with `err` set) when some partition has no owner that can answer.
  struct partition_plan {
    std::vector<int32_t> local;
    std::map<std::string, std::vector<int32_t>> remote;
  };
  std::optional<partition_plan> plan_partitions(const view_def& view, const std::string& path,
                                                http_response& err) const;
  // One merged page of a range across the plan's owners, synchronously (bounded by the
  // forwarding deadline): for streaming scans, which pull page by page.
  struct gathered_page {
    std::vector<page_entry> entries;
    bool more = false;
  };
  result<gathered_page> gather_page(const http_request& req, const view_def& view, const query::range_query& q,
                                    const partition_plan& plan, uint32_t limit) const;
  // A request to another instance on behalf of `req`: never forwarded again (hop
  // header), same request id, the forwarding deadline.
  peer_request part_request(const http_request& req) const;
  // The target asking an owner for its partitions' part of the range in `req`.
  static std::string range_part_target(const http_request& req, uint32_t limit, const std::vector<int32_t>& parts,
                                       const std::optional<std::string>& after);
  // Sends a part request; its answer goes into `g`, and the last answer calls `complete`.
  void send_part(const std::string& endpoint, peer_request pr, std::shared_ptr<struct peer_gather> g,
                 std::function<void()> complete) const;
  // A page of a range from the partitions held here (q.partitions, else all): plain
  // entries, or with `windows` ([from, to) in ms) the windows of a windowed store.
  // Entries in stored key order; `raw` adds each one's stored key as raw_key, for the
  // instance that merges the parts.
  struct local_page {
    std::vector<page_entry> entries;
    bool more = false;
    position pos;
  };
  query::query_result<local_page> read_local(const view_def& view, const query::range_query& q,
                                             const std::optional<std::pair<int64_t, int64_t>>& windows,
                                             uint32_t limit, bool raw) const;
  // Parameters shared by the range routes; nullopt after filling `err`.
  std::optional<uint32_t> limit_of(const http_request& req, http_response& err) const;
  // A scatter-gather part asked by another instance: its partitions and `after` go into
  // `q` and `part` is set. A client may not set them: 400.
  std::optional<http_response> part_params(const http_request& req, query::range_query& q, bool& part) const;
  // A range page in the API's shape from entries already in order.
  http_response range_page(const http_request& req, const std::string& fp, std::vector<page_entry> entries, bool more,
                           const position& pos) const;

 private:
  json store_json(const view_def& v) const;
  // The serialized key a request names: its store must exist and the key text must
  // decode in the request's key_format. nullopt after filling `err` (404 or 400).
  std::optional<std::string> request_key(const http_request& req, const std::string& store, const std::string& text,
                                         const view_def*& view, http_response& err) const;
  // The request's key_format (or the store's default); nullopt after filling `err`.
  std::optional<query::key_format> key_format_of(const http_request& req, const view_def& v,
                                                 http_response& err) const;

  api_context ctx_;
  mutable std::atomic<uint32_t> open_scans_{0};
  prometheus::Family<prometheus::Histogram>* m_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_forwarded_ = nullptr;
  friend class scan_body;
};

const std::vector<route>& api::routes() {
  static const std::vector<route> r = {
      {"GET", {"livez"}, {}, false, &api::livez, access::open},
      {"GET", {"readyz"}, {}, false, &api::readyz, access::open},
      {"GET", {"metrics"}, {}, false, &api::metrics, access::metrics},
      {"GET", {"openapi.json"}, {}, false, &api::openapi, access::open},
      {"GET", {"v1", "stores"}, {}, false, &api::list_stores, access::any_token},
      {"GET", {"v1", "stores", "{store}"}, {}, false, &api::describe_store},
      {"GET", {"v1", "stores", "{store}", "keys", "{key}"}, {"key_format", "min_position", "timeout_ms", "allow_stale"},
       true, &api::get_key},
      {"GET",
       {"v1", "stores", "{store}", "keys"},
       {"from", "to", "prefix", "limit", "cursor", "order", "key_format", "min_position", "timeout_ms", "partitions",
        "after"},
       true,
       &api::range},
      {"POST", {"v1", "stores", "{store}", "keys:batchGet"}, {"key_format", "min_position", "timeout_ms"}, true,
       &api::batch_get},
      {"GET", {"v1", "stores", "{store}", "count"}, {"min_position", "timeout_ms", "partitions"}, true, &api::count},
      {"GET", {"v1", "stores", "{store}", "keys", "{key}", "metadata"}, {"key_format"}, false, &api::key_metadata},
      {"GET", {"v1", "stores", "{store}", "windows", "{key}"}, {"from", "to", "key_format"}, false, &api::key_windows},
      {"GET",
       {"v1", "stores", "{store}", "windows"},
       {"from", "to", "key_from", "key_to", "limit", "cursor", "key_format", "partitions", "after"},
       false,
       &api::windows_range},
      {"GET", {"v1", "cluster"}, {"scope"}, false, &api::cluster, access::cluster},
  };
  return r;
}

api::api(api_context ctx) : ctx_(std::move(ctx)) {
  if (ctx_.metrics) {
    m_duration_ = &prometheus::BuildHistogram()
                       .Name("kstate_http_request_duration_seconds")
                       .Help("HTTP request duration by route template, method and status")
                       .Register(*ctx_.metrics);
    m_forwarded_ = &prometheus::BuildCounter()
                        .Name("kstate_http_forwarded_requests_total")
                        .Help("Requests forwarded to the instance owning the partition, by result")
                        .Register(*ctx_.metrics);
  }
}

bool match(const route& r, const std::vector<std::string>& segs, captures& c) {
  if (r.pattern.size() != segs.size()) return false;
  for (size_t i = 0; i < segs.size(); ++i) {
    const auto& p = r.pattern[i];
    if (p == "{store}") c.store = segs[i];
    else if (p == "{key}") c.key = segs[i];
    else if (p != segs[i]) return false;
  }
  return true;
}

void api::handle(const http_request& req, http_responder reply) {
  auto start = clock_type::now();
  // The dashboard's static files are not API routes (and not in the OpenAPI spec).
  if (!req.segments.empty() && req.segments[0] == "ui") {
    if (ctx_.ui_dir.empty())
      return reply(problem(failure_reason::route_not_found, "the dashboard is not installed (http.ui_dir)", req.path));
    if (auto r = serve_ui(req, ctx_.ui_dir)) return reply(std::move(*r));
  }
  const route* found = nullptr;
  captures caps;
  std::string allow;
  for (const auto& r : routes()) {
    captures c;
    if (!match(r, req.segments, c)) continue;
    if (r.method == req.method) {
      found = &r;
      caps = std::move(c);
      break;
    }
    allow += (allow.empty() ? "" : ", ") + r.method;
  }
  std::string tmpl = found ? found->path_template() : "unmatched";
  // Observe every answer once, labelled by route template (never the raw path).
  auto finish = [this, start, tmpl, method = req.method, reply](http_response r) {
    if (m_duration_) {
      static const prometheus::Histogram::BucketBoundaries buckets{
          0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
      m_duration_->Add({{"route", tmpl}, {"method", method}, {"status", std::to_string(r.status)}}, buckets)
          .Observe(std::chrono::duration<double>(clock_type::now() - start).count());
    }
    reply(std::move(r));
  };
  if (!found) {
    if (!allow.empty())
      return finish(problem(failure_reason::method_not_allowed, req.method + " is not allowed on " + req.path, req.path)
                        .with_header("Allow", allow));
    return finish(problem(failure_reason::route_not_found, "no route for " + req.method + " " + req.path, req.path));
  }
  if (ctx_.auth)
    if (auto denied = authorize(req, *found, caps)) return finish(std::move(*denied));
  for (const auto& [k, v] : req.query) {
    if (!found->params.count(k))
      return finish(problem(failure_reason::unknown_parameter, "unknown query parameter '" + k + "'", req.path));
  }

  if (found->fn == &api::cluster && req.param("scope").value_or("") != "local" && ctx_.membership && ctx_.peers)
    return cluster_async(req, finish);

  // Runs the route; a handler that found the key on another instance gets it forwarded.
  auto run = [this, fn = found->fn, finish](const http_request& r, const captures& c) {
    auto response = (this->*fn)(r, c);
    if (c.scatter_range) return range_scatter(r, c, finish);
    if (c.scatter_count) return count_scatter(r, c, finish);
    if (c.scatter_batch) return batch_scatter(r, c, finish);
    if (c.forward_to.empty()) return finish(std::move(response));
    forward(r, c.forward_to, finish);
  };

  std::optional<std::string> min_pos = req.param("min_position");
  if (!min_pos) min_pos = req.header("x-kstate-min-position");
  if (!found->waits || !min_pos) return run(req, caps);
  // A key held elsewhere: its owner waits for the position, not this instance.
  if (found->fn == &api::get_key) {
    if (auto loc = ctx_.queries->locate(caps.store, caps.key)) {
      auto t = ctx_.ownership->topic(loc->first);
      auto it = t ? t->partitions.find(loc->second) : decltype(t->partitions.end()){};
      if (!t || it == t->partitions.end() || !it->second.assigned) return run(req, caps);
    }
  }

  auto bound = parse_position(*min_pos);
  if (!bound)
    return finish(problem(failure_reason::bad_position,
                          "min_position must be partition:offset pairs separated by commas, e.g. 0:42,3:7", req.path));
  auto wait = ctx_.limits.default_wait;
  if (auto t = req.param("timeout_ms")) {
    auto v = parse_int(*t);
    if (!v || *v < 0 || *v > ctx_.limits.max_wait.count())
      return finish(problem(failure_reason::bad_request,
                            "timeout_ms must be 0.." + std::to_string(ctx_.limits.max_wait.count()), req.path));
    wait = std::chrono::milliseconds(*v);
  }
  if (!ctx_.queries->find_store(caps.store))
    return finish(problem(failure_reason::unknown_store, "no store named '" + caps.store + "'", req.path));
  // The request is copied into the callback: it outlives this call.
  ctx_.waiter->wait(caps.store, *bound, clock_type::now() + wait,
                    [this, req, caps, run, finish](bool reached) {
                      if (reached) return run(req, caps);
                      auto now = ctx_.queries->current_position(caps.store);
                      auto r = problem(failure_reason::position_not_reached,
                                       "min_position was not applied within the timeout", req.path);
                      if (now.ok()) {
                        auto body = json::parse(r.body);
                        body["position"] = position_json(*now.answer);
                        r.body = dump(body);
                        r.with_header("X-Kstate-Position", position_header(*now.answer));
                      }
                      finish(std::move(r));
                    });
}

std::optional<http_response> api::authorize(const http_request& req, const route& r, captures& c) const {
  if (r.need == access::open || (r.need == access::metrics && ctx_.open_metrics)) return std::nullopt;
  c.who = ctx_.auth->authenticate(req.header("authorization"));
  if (!c.who) {
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
      allowed = c.who->scopes.store_allowed(c.store);
      what = "store '" + c.store + "'";
      break;
    case access::cluster:
      allowed = c.who->scopes.cluster;
      what = "cluster metadata";
      break;
    case access::metrics:
      allowed = c.who->scopes.metrics;
      what = "metrics";
      break;
  }
  if (allowed) return std::nullopt;
  // The token's name (never the token) says whose request was refused.
  spdlog::debug("request {}: token '{}' may not read {}", req.request_id, c.who->name, what);
  return problem(failure_reason::forbidden, "this token may not read " + what, req.path)
      .with_header("WWW-Authenticate", "Bearer realm=\"kstate\", error=\"insufficient_scope\"");
}

http_response api::readyz(const http_request&, const captures&) const {
  bool draining = ctx_.draining && ctx_.draining->load();
  bool ready = !draining && ctx_.ownership->all_ready();
  json parts = json::array();
  std::set<std::string> topics;
  for (const auto& v : ctx_.queries->views()) {
    topics.insert(v.topic);
    topics.insert(v.input_topic());
  }
  for (const auto& topic : topics) {
    auto t = ctx_.ownership->topic(topic);
    if (!t) continue;
    for (const auto& [p, st] : t->partitions) {
      if (!st.assigned) continue;
      json part{{"topic", topic}, {"partition", p}, {"ready", st.ready}};
      // An aggregate partition catching up from its changelog says how far it is.
      if (st.restore_total >= 0) part["restore"] = {{"restored", st.restored}, {"total", st.restore_total}};
      parts.push_back(std::move(part));
    }
  }
  auto r = json_response(ready ? 200 : 503, {{"ready", ready}, {"draining", draining}, {"partitions", parts}});
  if (!ready) r.with_header("Retry-After", "1");
  return r;
}

http_response api::metrics(const http_request& req, const captures&) const {
  if (!ctx_.metrics) return problem(failure_reason::route_not_found, "metrics are disabled", req.path);
  prometheus::TextSerializer ser;
  http_response r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  auto families = ctx_.metrics->Collect();
  for (const auto& c : ctx_.collectables) {
    auto more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  if (ctx_.open_connections) {
    prometheus::MetricFamily f{"kstate_http_open_connections", "HTTP connections currently open",
                               prometheus::MetricType::Gauge, {}};
    prometheus::ClientMetric m;
    m.gauge.value = static_cast<double>(ctx_.open_connections());
    f.metric.push_back(m);
    families.push_back(std::move(f));
  }
  r.body = ser.Serialize(families);
  return r;
}

json api::store_json(const view_def& v) const {
  json out{{"name", v.name},
          {"kind", to_string(v.kind)},
          {"topic", v.topic},
          {"key_format", to_string(v.key_format)},
          {"value_format", to_string(v.value_format)},
          {"partitioner", v.partitioner},
          {"partitions", ctx_.ownership->partition_count(v.topic)}};
  if (v.is_aggregate()) {
    out["source"] = v.input_topic();
    out["group_by"] = v.group_by == group_by_kind::json ? "json:" + v.group_path : std::string(to_string(v.group_by));
    out["changelog_topic"] = v.changelog_topic;
    if (v.rekeyed()) out["repartition_topic"] = v.repartition_topic;
  }
  if (v.window) {
    out["window"] = {{"type", to_string(v.window->type)},
                     {"size_ms", v.window->size_ms},
                     {"advance_ms", v.window->advance_ms},
                     {"grace_ms", v.window->grace_ms},
                     {"retention_ms", v.window->retention_ms}};
    if (!v.window->time_field.empty()) out["window"]["time_field"] = v.window->time_field;
  }
  return out;
}

http_response api::list_stores(const http_request&, const captures& c) const {
  json data = json::array();
  for (const auto& v : ctx_.queries->views())
    if (!c.who || c.who->scopes.store_allowed(v.name)) data.push_back(store_json(v));
  return json_response(200, {{"data", data}, {"served_by", ctx_.instance}});
}

http_response api::describe_store(const http_request& req, const captures& c) const {
  auto res = ctx_.queries->describe(c.store);
  if (!res.ok()) return from_failure(*res.failure, res.message, req.path);
  const auto& info = *res.answer;
  json body = store_json(*info.def);
  json parts = json::array();
  position pos;
  for (const auto& p : info.partitions) {
    parts.push_back({{"partition", p.partition},
                     {"ready", p.ready},
                     {"position", p.position ? json(*p.position) : json(nullptr)},
                     {"catch_up_target", p.catch_up_target}});
    if (auto t = ctx_.ownership->topic(info.def->topic)) {
      auto st = t->partitions.find(p.partition);
      if (st != t->partitions.end() && st->second.assigned && st->second.restore_total >= 0)
        parts.back()["restore"] = {{"restored", st->second.restored}, {"total", st->second.restore_total}};
    }
    if (p.position) pos[p.partition] = *p.position;
  }
  body["assigned_partitions"] = parts;
  body["position"] = position_json(pos);
  body["estimated_keys"] = info.stats.estimated_keys;
  body["size_on_disk_bytes"] = info.stats.live_sst_bytes;
  body["memtable_bytes"] = info.stats.memtable_bytes;
  if (info.def->window) body["expired_windows"] = info.stats.expired_windows;
  body["served_by"] = ctx_.instance;
  return json_response(200, body).with_header("X-Kstate-Position", position_header(pos));
}

std::optional<query::key_format> api::key_format_of(const http_request& req, const view_def& v,
                                                    http_response& err) const {
  auto name = req.param("key_format");
  if (!name) return default_key_format(v);
  query::key_format f;
  if (!query::parse_key_format(*name, f)) {
    err = problem(failure_reason::bad_request,
                  "key_format must be one of: string, base64url, long, json (got '" + *name + "')", req.path);
    return std::nullopt;
  }
  return f;
}

std::optional<std::string> api::request_key(const http_request& req, const std::string& store,
                                            const std::string& text, const view_def*& view,
                                            http_response& err) const {
  view = ctx_.queries->find_store(store);
  if (!view) {
    err = problem(failure_reason::unknown_store, "no store named '" + store + "'", req.path);
    return std::nullopt;
  }
  auto fmt = key_format_of(req, *view, err);
  if (!fmt) return std::nullopt;
  auto key = query::decode_key(*fmt, text, ctx_.limits.max_json_depth);
  if (!key.ok()) {
    err = problem(failure_reason::bad_key_encoding, key.error().message(), req.path);
    return std::nullopt;
  }
  return std::move(*key);
}

std::optional<http_response> api::to_owner(const http_request& req, const captures& c,
                                           const std::string& key) const {
  if (!ctx_.membership || !ctx_.peers) return std::nullopt;
  if (req.header(hop_header))
    return problem(failure_reason::not_owner,
                   "a forwarded request reached an instance that does not own the partition; the group is "
                   "rebalancing",
                   req.path);
  auto loc = ctx_.queries->locate(c.store, key);
  auto owner = loc ? ctx_.membership->current()->owner(loc->first, loc->second) : std::nullopt;
  if (!owner || *owner == ctx_.instance) return std::nullopt;
  c.forward_to = *owner;
  return http_response{};
}

http_response api::get_key(const http_request& req, const captures& c) const {
  const view_def* view = nullptr;
  http_response err;
  auto key = request_key(req, c.store, c.key, view, err);
  if (!key) return err;
  if (view->window) return windowed_store_problem(c.store, "/windows/{key}", req.path);
  auto res = ctx_.queries->get({c.store, *key});
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active)
      if (auto routed = to_owner(req, c, *key)) return std::move(*routed);
    if (req.param("allow_stale") == "true") {
      if (auto stale = stale_answer(req, c.store, *key)) return std::move(*stale);
    }
    return from_failure(*res.failure, res.message, req.path);
  }
  const auto& a = *res.answer;
  if (!a.value) {
    auto r = problem(failure_reason::key_not_found, "no value for this key in store '" + c.store + "'", req.path);
    // The absence is as fresh as the position: say which.
    auto body = json::parse(r.body);
    body["partition"] = a.partition;
    body["position"] = position_json(a.pos);
    body["served_by"] = ctx_.instance;
    r.body = dump(body);
    return r.with_header("X-Kstate-Position", position_header(a.pos));
  }
  // Written straight into the body: the bytes json_response() prints for the object
  // {store, key, value, partition, offset, position, served_by} (dump() orders members
  // by name), without a DOM and without re-parsing the stored value.
  http_response r;
  std::string& b = r.body;
  b.reserve(112 + key->size() + a.value->size() + c.store.size() + ctx_.instance.size());
  b += "{\"key\":";
  append_rendered_key(b, view->key_format, *key);
  b += ",\"offset\":";
  append_int(b, a.offset);
  b += ",\"partition\":";
  append_int(b, a.partition);
  b += ",\"position\":";
  append_position(b, a.pos);
  b += ",\"served_by\":";
  append_json_string(b, ctx_.instance);
  b += ",\"store\":";
  append_json_string(b, c.store);
  b += ",\"value\":";
  append_rendered_value(b, view->value_format, *a.value);
  b += '}';
  r.with_header("X-Kstate-Position", position_header(a.pos));
  return r;
}

http_response api::key_windows(const http_request& req, const captures& c) const {
  const view_def* view = nullptr;
  http_response err;
  auto key = request_key(req, c.store, c.key, view, err);
  if (!key) return err;
  if (!view->window)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is not windowed; read its keys at /v1/stores/" + c.store + "/keys/{key}",
                   req.path);
  auto interval = interval_of(req, err);
  if (!interval) return err;
  query::window_query q{c.store, *key, interval->first, interval->second};
  auto res = ctx_.queries->windows(q);
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active)
      if (auto routed = to_owner(req, c, *key)) return std::move(*routed);
    return from_failure(*res.failure, res.message, req.path);
  }
  const auto& a = *res.answer;
  json data = json::array();
  for (const auto& w : a.windows)
    data.push_back(json{{"start", w.start},
                        {"end", w.end},
                        {"start_time", format_timestamp_ms(w.start)},
                        {"end_time", format_timestamp_ms(w.end)},
                        {"value", render_value(data_format::json, w.value)},
                        {"offset", w.offset}});
  json body{{"store", c.store},
            {"key", render_key(view->key_format, *key)},
            {"data", std::move(data)},
            {"partition", a.partition},
            {"stream_time", a.stream_time},
            {"position", position_json(a.pos)},
            {"served_by", ctx_.instance}};
  return json_response(200, body).with_header("X-Kstate-Position", position_header(a.pos));
}

// NDJSON body of a streaming scan: pieces of at most 256 entries, each pulled only when
// the previous one is on the wire. Holds one of the limited scan slots while alive.
class scan_body final : public body_source {
 public:
  scan_body(std::unique_ptr<query::range_stream> s, const view_def& v, std::atomic<uint32_t>& slots)
      : stream_(std::move(s)), view_(v), slots_(slots) {}
  ~scan_body() override { --slots_; }
  bool next(std::string& out) override {
    batch_.clear();
    bool more = stream_->next(batch_, 256);
    if (!stream_->error().ok()) throw std::runtime_error("scan failed: " + stream_->error().to_string());
    for (const auto& e : batch_) {
      out += dump(json{{"key", render_key(view_.key_format, e.key)},
                       {"value", render_value(view_.value_format, e.value)},
                       {"partition", e.partition},
                       {"offset", e.offset}});
      out += '\n';
    }
    return more;
  }

 private:
  std::unique_ptr<query::range_stream> stream_;
  const view_def& view_;
  std::atomic<uint32_t>& slots_;
  std::vector<query::range_entry> batch_;
};

// NDJSON body of a scan whose partitions live on several instances: pages of 256 keys,
// each gathered from every owner (a local range plus one request per other owner) and
// merged, pulled only when the previous page is on the wire. A pull waits for the owners
// at most the forwarding deadline; an owner that fails ends the stream early (the client
// sees it truncated, without the final chunk). Holds one of the scan slots while alive.
class cluster_scan_body final : public body_source {
 public:
  cluster_scan_body(const api* a, http_request req, const view_def& v, query::range_query q, api::partition_plan plan,
                    std::atomic<uint32_t>& slots)
      : api_(a), req_(std::move(req)), view_(v), q_(std::move(q)), plan_(std::move(plan)), slots_(slots) {}
  ~cluster_scan_body() override { --slots_; }
  bool next(std::string& out) override {
    auto page = api_->gather_page(req_, view_, q_, plan_, 256);
    if (!page.ok()) throw std::runtime_error("cluster scan: " + page.error().to_string());
    for (auto& [raw, j] : page->entries) {
      out += dump(j);
      out += '\n';
    }
    if (!page->entries.empty()) q_.after = page->entries.back().first;
    return page->more && !page->entries.empty();
  }

 private:
  const api* api_;
  http_request req_;
  const view_def& view_;
  query::range_query q_;
  api::partition_plan plan_;
  std::atomic<uint32_t>& slots_;
};

enum class media { json, ndjson, none };

media negotiate(const http_request& req, bool ndjson_ok) {
  auto accept = req.header("accept");
  if (!accept || accept->empty()) return media::json;
  const auto& a = *accept;
  if (ndjson_ok && a.find("application/x-ndjson") != std::string::npos) return media::ndjson;
  if (a.find("application/json") != std::string::npos || a.find("*/*") != std::string::npos ||
      a.find("application/*") != std::string::npos || a.find("application/problem+json") != std::string::npos)
    return media::json;
  return media::none;
}

http_response api::range(const http_request& req, const captures& c) const {
  const auto* view = ctx_.queries->find_store(c.store);
  if (!view) return problem(failure_reason::unknown_store, "no store named '" + c.store + "'", req.path);
  if (view->window) return windowed_store_problem(c.store, "/windows", req.path);
  auto m = negotiate(req, true);
  if (m == media::none)
    return problem(failure_reason::not_acceptable, "this route answers application/json or application/x-ndjson",
                   req.path);
  http_response err;
  auto fmt = key_format_of(req, *view, err);
  if (!fmt) return err;

  query::range_query q;
  q.store = c.store;
  for (auto [name, field] : {std::pair{"from", &q.from}, std::pair{"to", &q.to}, std::pair{"prefix", &q.prefix}}) {
    if (auto v = req.param(name)) {
      auto k = query::decode_key(*fmt, *v, ctx_.limits.max_json_depth);
      if (!k.ok()) return problem(failure_reason::bad_key_encoding, std::string(name) + ": " + k.error().message(), req.path);
      *field = *k;
    }
  }
  auto order = req.param("order").value_or("asc");
  if (order != "asc" && order != "desc")
    return problem(failure_reason::bad_request, "order must be asc or desc (got '" + order + "')", req.path);
  q.descending = order == "desc";

  auto limit = limit_of(req, err);
  if (!limit) return err;

  std::string fp = c.store + '\0' + order + '\0';
  fingerprint_add(fp, q.from);
  fingerprint_add(fp, q.to);
  fingerprint_add(fp, q.prefix);
  if (auto cur = req.param("cursor")) {
    auto decoded = query::decode_cursor(*cur, fp);
    if (!decoded.ok()) return problem(failure_reason::bad_cursor, decoded.error().message(), req.path);
    q.after = decoded->last_key;
  }
  bool part = false;
  if (auto bad = part_params(req, q, part)) return std::move(*bad);

  if (m == media::ndjson) {
    if (open_scans_.fetch_add(1) >= ctx_.limits.max_concurrent_scans) {
      --open_scans_;
      return problem(failure_reason::scan_capacity, "too many scans in progress; retry shortly", req.path);
    }
    // A stream may read the whole store: its blocks stay out of the lookups' cache.
    auto opened = ctx_.queries->open_range(q, storage::scan_use::sweep);
    if (!opened.ok() && opened.failure == query::failure_reason::not_active && !req.header(hop_header) &&
        ctx_.membership && ctx_.peers) {
      http_response err;
      auto plan = plan_partitions(*view, req.path, err);
      if (!plan) {
        --open_scans_;
        return err;
      }
      http_response r;
      r.content_type = "application/x-ndjson";
      r.stream = std::make_shared<cluster_scan_body>(this, req, *view, q, std::move(*plan), open_scans_);
      return r;
    }
    if (!opened.ok()) {
      --open_scans_;
      return from_failure(*opened.failure, opened.message, req.path);
    }
    http_response r;
    r.content_type = "application/x-ndjson";
    r.with_header("X-Kstate-Position", position_header((*opened.answer)->pos()));
    r.stream = std::make_shared<scan_body>(std::move(*opened.answer), *view, open_scans_);
    return r;
  }

  auto res = read_local(*view, q, std::nullopt, *limit, part);
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active && !req.header(hop_header) && ctx_.membership &&
        ctx_.peers) {
      c.scatter_range = captures::scatter{q, *limit, fp, std::nullopt};
      return {};
    }
    return from_failure(*res.failure, res.message, req.path);
  }
  auto& a = *res.answer;
  return range_page(req, fp, std::move(a.entries), a.more, a.pos);
}

http_response api::windows_range(const http_request& req, const captures& c) const {
  const auto* view = ctx_.queries->find_store(c.store);
  if (!view) return problem(failure_reason::unknown_store, "no store named '" + c.store + "'", req.path);
  if (!view->window)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is not windowed; read its keys at /v1/stores/" + c.store + "/keys",
                   req.path);
  if (negotiate(req, false) == media::none)
    return problem(failure_reason::not_acceptable, "this route answers application/json", req.path);
  http_response err;
  auto fmt = key_format_of(req, *view, err);
  if (!fmt) return err;
  query::range_query q;
  q.store = c.store;
  for (auto [name, field] : {std::pair{"key_from", &q.from}, std::pair{"key_to", &q.to}}) {
    if (auto v = req.param(name)) {
      auto k = query::decode_key(*fmt, *v, ctx_.limits.max_json_depth);
      if (!k.ok()) return problem(failure_reason::bad_key_encoding, std::string(name) + ": " + k.error().message(), req.path);
      *field = *k;
    }
  }
  auto interval = interval_of(req, err);
  if (!interval) return err;
  auto limit = limit_of(req, err);
  if (!limit) return err;

  // Distinct from every key range fingerprint: a keys cursor is refused here.
  std::string fp = c.store + '\0' + "windows" + '\0';
  fingerprint_add(fp, q.from);
  fingerprint_add(fp, q.to);
  fp += std::to_string(interval->first) + ':' + std::to_string(interval->second);
  if (auto cur = req.param("cursor")) {
    auto decoded = query::decode_cursor(*cur, fp);
    if (!decoded.ok()) return problem(failure_reason::bad_cursor, decoded.error().message(), req.path);
    q.after = decoded->last_key;
  }
  bool part = false;
  if (auto bad = part_params(req, q, part)) return std::move(*bad);

  auto res = read_local(*view, q, interval, *limit, part);
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active && !req.header(hop_header) && ctx_.membership &&
        ctx_.peers) {
      c.scatter_range = captures::scatter{q, *limit, fp, interval};
      return {};
    }
    return from_failure(*res.failure, res.message, req.path);
  }
  auto& a = *res.answer;
  return range_page(req, fp, std::move(a.entries), a.more, a.pos);
}

std::optional<uint32_t> api::limit_of(const http_request& req, http_response& err) const {
  auto l = req.param("limit");
  if (!l) return ctx_.limits.default_limit;
  auto v = parse_int(*l);
  if (!v || *v < 1 || *v > ctx_.limits.max_limit) {
    err = problem(failure_reason::bad_limit, "limit must be 1.." + std::to_string(ctx_.limits.max_limit), req.path);
    return std::nullopt;
  }
  return static_cast<uint32_t>(*v);
}

std::optional<http_response> api::part_params(const http_request& req, query::range_query& q, bool& part) const {
  // One instance's part of a scatter-gather, asked by another instance: only these
  // partitions, strictly after `after` (base64url of the stored key).
  part = req.header(hop_header).has_value() && req.param("partitions").has_value();
  if (!part) {
    if (req.param("partitions") || req.param("after"))
      return problem(failure_reason::unknown_parameter, "partitions and after are set by kstate on forwarded requests",
                     req.path);
    return std::nullopt;
  }
  std::vector<int32_t> ps;
  std::stringstream list(*req.param("partitions"));
  std::string item;
  while (std::getline(list, item, ',')) {
    auto v = parse_int(item);
    if (!v || *v < 0) return problem(failure_reason::bad_request, "partitions must be a list of numbers", req.path);
    ps.push_back(static_cast<int32_t>(*v));
  }
  q.partitions = std::move(ps);
  if (auto after = req.param("after")) {
    auto raw = query::base64url_decode(*after);
    if (!raw.ok()) return problem(failure_reason::bad_cursor, "after: " + raw.error().message(), req.path);
    q.after = *raw;
  }
  return std::nullopt;
}

query::query_result<api::local_page> api::read_local(const view_def& view, const query::range_query& q,
                                                     const std::optional<std::pair<int64_t, int64_t>>& windows,
                                                     uint32_t limit, bool raw) const {
  using R = query::query_result<local_page>;
  local_page page;
  if (windows) {
    auto res = ctx_.queries->window_range({q, windows->first, windows->second}, limit);
    if (!res.ok()) return R::fail(*res.failure, res.message);
    auto& a = *res.answer;
    page.entries.reserve(a.entries.size());
    for (auto& e : a.entries) {
      json j{{"key", render_key(view.key_format, e.key)},
             {"start", e.window.start},
             {"end", e.window.end},
             {"start_time", format_timestamp_ms(e.window.start)},
             {"end_time", format_timestamp_ms(e.window.end)},
             {"value", render_value(data_format::json, e.window.value)},
             {"offset", e.window.offset},
             {"partition", e.partition}};
      if (raw) j["raw_key"] = query::base64url_encode(e.stored_key);
      page.entries.emplace_back(std::move(e.stored_key), std::move(j));
    }
    page.more = a.more;
    page.pos = std::move(a.pos);
    return R::success(std::move(page));
  }
  auto res = ctx_.queries->range(q, limit);
  if (!res.ok()) return R::fail(*res.failure, res.message);
  auto& a = *res.answer;
  page.entries.reserve(a.entries.size());
  for (const auto& e : a.entries) {
    json j{{"key", render_key(view.key_format, e.key)},
           {"value", render_value(view.value_format, e.value)},
           {"partition", e.partition},
           {"offset", e.offset}};
    if (raw) j["raw_key"] = query::base64url_encode(e.key);
    page.entries.emplace_back(e.key, std::move(j));
  }
  page.more = a.more;
  page.pos = std::move(a.pos);
  return R::success(std::move(page));
}

http_response api::range_page(const http_request& req, const std::string& fp, std::vector<page_entry> entries,
                              bool more, const position& pos) const {
  json data = json::array();
  for (auto& [raw, j] : entries) data.push_back(std::move(j));
  json next = nullptr;
  std::string link;
  if (more && !entries.empty()) {
    auto token = query::encode_cursor({entries.back().first}, fp);
    next = token;
    // The same query with the new cursor; every other parameter kept as given.
    std::string target = req.path + "?";
    bool first = true;
    for (const auto& [k, v] : req.query) {
      if (k == "cursor") continue;
      target += (first ? "" : "&") + query_escape(k) + "=" + query_escape(v);
      first = false;
    }
    target += (first ? "" : "&") + std::string("cursor=") + token;
    link = "<" + target + ">; rel=\"next\"";
  }
  auto r = json_response(200, {{"data", data},
                               {"metadata", {{"next", next}, {"position", position_json(pos)}}},
                               {"served_by", ctx_.instance}});
  r.with_header("X-Kstate-Position", position_header(pos));
  if (!link.empty()) r.with_header("Link", link);
  return r;
}

std::optional<api::partition_plan> api::plan_partitions(const view_def& view, const std::string& path,
                                                        http_response& err) const {
  auto snap = ctx_.membership->current();
  int32_t count = ctx_.ownership->partition_count(view.topic);
  partition_plan plan;
  for (int32_t p = 0; p < count; ++p) {
    if (ctx_.ownership->serves(view.topic, p)) {
      plan.local.push_back(p);
      continue;
    }
    auto owner = snap->owner(view.topic, p);
    if (!owner || *owner == ctx_.instance) {
      err = problem(failure_reason::not_owner,
                    "partition " + std::to_string(p) + " of '" + view.topic +
                        "' has no owner that can answer yet (the group is rebalancing or restoring)",
                    path);
      return std::nullopt;
    }
    plan.remote[*owner].push_back(p);
  }
  return plan;
}

// Collects the answers of several owners; the last one to arrive completes the request.
struct peer_gather {
  std::mutex mu;
  size_t pending = 0;
  std::vector<std::pair<std::string, json>> answers;  // endpoint -> body of a 200 answer
  std::optional<http_response> failure;               // the first failure, answered instead

  // Records one answer; true for the last.
  bool add(const std::string& endpoint, result<http_response>& r, const std::string& path) {
    std::lock_guard lock(mu);
    if (!r.ok()) {
      if (!failure)
        failure = problem(failure_reason::not_owner, "the owner at " + endpoint + " did not answer: " + r.error().message(),
                          path);
    } else if (r->status != 200) {
      if (!failure) failure = std::move(r.value());
    } else {
      auto body = json::parse(r->body, nullptr, false);
      if (body.is_object()) answers.emplace_back(endpoint, std::move(body));
      else if (!failure) failure = problem(failure_reason::internal, "bad answer from " + endpoint, path);
    }
    return --pending == 0;
  }
};

result<api::gathered_page> api::gather_page(const http_request& req, const view_def& view,
                                            const query::range_query& base, const partition_plan& plan,
                                            uint32_t limit) const {
  gathered_page page;
  if (!plan.local.empty()) {
    auto q = base;
    q.partitions = plan.local;
    auto res = read_local(view, q, std::nullopt, limit, false);
    if (!res.ok()) return unavailable(res.message);
    page.entries = std::move(res.answer->entries);
    page.more = res.answer->more;
  }
  struct wait_state {
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = 0;
    std::vector<result<http_response>> answers;
  };
  auto w = std::make_shared<wait_state>();
  w->pending = plan.remote.size();
  for (const auto& [endpoint, parts] : plan.remote) {
    auto pr = part_request(req);
    pr.target = range_part_target(req, limit, parts, base.after);
    pr.headers.emplace_back("Accept", "application/json");
    ctx_.peers->send(endpoint, std::move(pr), [w](result<http_response> r) {
      std::lock_guard lock(w->mu);
      w->answers.push_back(std::move(r));
      if (--w->pending == 0) w->cv.notify_all();
    });
  }
  {
    // A bounded wait on an I/O thread: a scan page needs every owner's part.
    std::unique_lock lock(w->mu);
    if (!w->cv.wait_for(lock, ctx_.forward_timeout + std::chrono::seconds(1), [&] { return w->pending == 0; }))
      return status(status_code::deadline_exceeded, "owners did not answer in time");
  }
  for (auto& r : w->answers) {
    if (!r.ok()) return r.error();
    if (r->status != 200) return unavailable("an owner answered " + std::to_string(r->status));
    auto body = json::parse(r->body, nullptr, false);
    if (!body.is_object() || !body.contains("data")) return internal_error("bad answer from an owner");
    page.more = merge_range_part(body, page.entries, nullptr) || page.more;
  }
  sort_page(page.entries, base.descending);
  if (page.entries.size() > limit) {
    page.entries.resize(limit);
    page.more = true;
  }
  return page;
}

// Adds a range part's entries (keys decoded from raw_key) and positions; true when the
// part had more entries than it returned.
bool merge_range_part(json& body, std::vector<page_entry>& entries, position* pos) {
  if (!body.contains("data")) return false;
  for (auto& e : body["data"]) {
    auto raw = query::base64url_decode(e.value("raw_key", std::string()));
    if (!raw.ok()) continue;
    e.erase("raw_key");
    entries.emplace_back(std::move(*raw), std::move(e));
  }
  if (pos)
    for (auto& [p, off] : body["metadata"]["position"].items()) (*pos)[std::stoi(p)] = off.get<int64_t>();
  return !body["metadata"]["next"].is_null();
}

// Orders merged parts by serialized key: each part is in order, the page is their merge.
void sort_page(std::vector<page_entry>& entries, bool descending) {
  std::sort(entries.begin(), entries.end(), [descending](const page_entry& a, const page_entry& b) {
    return descending ? b.first < a.first : a.first < b.first;
  });
}

peer_request api::part_request(const http_request& req) const {
  peer_request pr;
  pr.headers = {{hop_header, "1"}, {"X-Request-Id", req.request_id}};
  carry_identity(req, pr);
  pr.deadline = clock_type::now() + ctx_.forward_timeout;
  return pr;
}

std::string api::range_part_target(const http_request& req, uint32_t limit, const std::vector<int32_t>& parts,
                                   const std::optional<std::string>& after) {
  std::string target = req.path + "?";
  for (const auto& [k, v] : req.query)
    if (k != "cursor" && k != "limit") target += query_escape(k) + "=" + query_escape(v) + "&";
  std::string list;
  for (auto p : parts) list += (list.empty() ? "" : ",") + std::to_string(p);
  target += "limit=" + std::to_string(limit) + "&partitions=" + list;
  if (after) target += "&after=" + query::base64url_encode(*after);
  return target;
}

void api::send_part(const std::string& endpoint, peer_request pr, std::shared_ptr<peer_gather> g,
                    std::function<void()> complete) const {
  auto counter = m_forwarded_;
  ctx_.peers->send(endpoint, std::move(pr),
                   [g, endpoint, path = pr.target, complete, counter](result<http_response> r) mutable {
                     if (counter) counter->Add({{"result", r.ok() ? "ok" : "error"}}).Increment();
                     if (g->add(endpoint, r, path)) complete();
                   });
}

void api::count_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const {
  const auto* view = ctx_.queries->find_store(c.store);
  http_response err;
  auto plan = plan_partitions(*view, req.path, err);
  if (!plan) return finish(std::move(err));
  uint64_t local_count = 0;
  bool local_exact = true;
  position pos;
  if (!plan->local.empty()) {
    auto res = ctx_.queries->count(c.store, ctx_.limits.exact_count_limit, plan->local);
    if (!res.ok()) return finish(from_failure(*res.failure, res.message, req.path));
    local_count = res.answer->count;
    local_exact = res.answer->exact;
    pos = res.answer->pos;
  }
  auto g = std::make_shared<peer_gather>();
  auto complete = [this, g, store = c.store, local_count, local_exact, pos, finish]() mutable {
    if (g->failure) return finish(std::move(*g->failure));
    uint64_t count = local_count;
    bool exact = local_exact;
    for (auto& [endpoint, body] : g->answers) {
      count += body.value("count", uint64_t{0});
      exact = exact && body.value("exact", false);
      for (auto& [p, off] : body["metadata"]["position"].items()) pos[std::stoi(p)] = off.get<int64_t>();
    }
    finish(json_response(200, {{"store", store},
                               {"count", count},
                               {"exact", exact},
                               {"metadata", {{"position", position_json(pos)}}},
                               {"served_by", ctx_.instance}})
               .with_header("X-Kstate-Position", position_header(pos)));
  };
  if (plan->remote.empty()) return complete();
  g->pending = plan->remote.size();
  for (const auto& [endpoint, parts] : plan->remote) {
    std::string list;
    for (auto p : parts) list += (list.empty() ? "" : ",") + std::to_string(p);
    auto pr = part_request(req);
    pr.target = req.path + "?partitions=" + list;
    send_part(endpoint, std::move(pr), g, complete);
  }
}

void api::batch_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const {
  const auto* view = ctx_.queries->find_store(c.store);
  const auto& b = *c.scatter_batch;
  auto snap = ctx_.membership->current();
  // Which keys go where, by index in the request.
  std::vector<size_t> local;
  std::map<std::string, std::vector<size_t>> remote;
  for (size_t i = 0; i < b.keys.size(); ++i) {
    auto loc = ctx_.queries->locate(c.store, b.keys[i]);
    if (loc && ctx_.ownership->serves(loc->first, loc->second)) {
      local.push_back(i);
      continue;
    }
    auto owner = loc ? snap->owner(loc->first, loc->second) : std::nullopt;
    if (!owner || *owner == ctx_.instance)
      return finish(problem(failure_reason::not_owner,
                            "a key's partition has no owner that can answer yet (the group is rebalancing or restoring)",
                            req.path));
    remote[*owner].push_back(i);
  }
  // Answers by rendered key, so every part's answer lands in request order.
  auto found = std::make_shared<std::map<std::string, json>>();
  auto pos = std::make_shared<position>();
  if (!local.empty()) {
    std::vector<std::string> keys;
    for (auto i : local) keys.push_back(b.keys[i]);
    auto res = ctx_.queries->get_many(c.store, keys);
    if (!res.ok()) return finish(from_failure(*res.failure, res.message, req.path));
    for (const auto& e : res.answer->entries)
      if (e.value)
        (*found)[dump(render_key(view->key_format, e.key))] = {{"key", render_key(view->key_format, e.key)},
                                                                {"value", render_value(view->value_format, *e.value)},
                                                                {"partition", e.partition},
                                                                {"offset", e.offset}};
    *pos = res.answer->pos;
  }
  auto g = std::make_shared<peer_gather>();
  auto complete = [this, g, found, pos, keys = b.keys, view, finish]() {
    if (g->failure) return finish(std::move(*g->failure));
    for (auto& [endpoint, body] : g->answers) {
      for (auto& e : body["data"]) (*found)[dump(e["key"])] = e;
      for (auto& [p, off] : body["metadata"]["position"].items()) (*pos)[std::stoi(p)] = off.get<int64_t>();
    }
    json data = json::array(), missing = json::array();
    for (const auto& k : keys) {
      auto rendered = render_key(view->key_format, k);
      auto it = found->find(dump(rendered));
      if (it != found->end()) data.push_back(it->second);
      else missing.push_back(rendered);
    }
    finish(json_response(200, {{"data", data},
                               {"missing", missing},
                               {"metadata", {{"position", position_json(*pos)}}},
                               {"served_by", ctx_.instance}})
               .with_header("X-Kstate-Position", position_header(*pos)));
  };
  if (remote.empty()) return complete();
  g->pending = remote.size();
  for (const auto& [endpoint, idx] : remote) {
    json body{{"keys", json::array()}, {"key_format", b.key_format}};
    for (auto i : idx) body["keys"].push_back(b.texts[i]);
    auto pr = part_request(req);
    pr.method = "POST";
    pr.target = req.path;
    pr.body = body.dump();
    pr.headers.emplace_back("Content-Type", "application/json");
    send_part(endpoint, std::move(pr), g, complete);
  }
}

void api::range_scatter(const http_request& req, const captures& c, std::function<void(http_response)> finish) const {
  const auto& sc = *c.scatter_range;
  const auto* view = ctx_.queries->find_store(c.store);
  http_response err;
  auto plan = plan_partitions(*view, req.path, err);
  if (!plan) return finish(std::move(err));
  // The partitions held here are read now; every other owner is asked once, in parallel.
  std::vector<page_entry> entries;
  bool more = false;
  position pos;
  if (!plan->local.empty()) {
    auto q = sc.q;
    q.partitions = plan->local;
    auto res = read_local(*view, q, sc.windows, sc.limit, false);
    if (!res.ok()) return finish(from_failure(*res.failure, res.message, req.path));
    entries = std::move(res.answer->entries);
    more = res.answer->more;
    pos = std::move(res.answer->pos);
  }
  auto g = std::make_shared<peer_gather>();
  auto complete = [this, g, req, fp = sc.fingerprint, limit = sc.limit, descending = sc.q.descending,
                   entries = std::move(entries), more, pos, finish]() mutable {
    if (g->failure) return finish(std::move(*g->failure));
    for (auto& [endpoint, body] : g->answers) more = merge_range_part(body, entries, &pos) || more;
    sort_page(entries, descending);
    if (entries.size() > limit) {
      entries.resize(limit);
      more = true;
    }
    finish(range_page(req, fp, std::move(entries), more, pos));
  };
  if (plan->remote.empty()) return complete();
  g->pending = plan->remote.size();
  for (const auto& [endpoint, parts] : plan->remote) {
    auto pr = part_request(req);
    pr.target = range_part_target(req, sc.limit, parts, sc.q.after);
    pr.headers.emplace_back("Accept", "application/json");
    send_part(endpoint, std::move(pr), g, complete);
  }
}

http_response api::batch_get(const http_request& req, const captures& c) const {
  const auto* view = ctx_.queries->find_store(c.store);
  if (!view) return problem(failure_reason::unknown_store, "no store named '" + c.store + "'", req.path);
  if (view->window) return windowed_store_problem(c.store, "/windows/{key}", req.path);
  auto ct = req.header("content-type").value_or("");
  if (ct.rfind("application/json", 0) != 0)
    return problem(failure_reason::unsupported_media, "send the body as application/json", req.path);
  if (negotiate(req, false) == media::none)
    return problem(failure_reason::not_acceptable, "this route answers application/json", req.path);
  auto body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("keys") || !body["keys"].is_array())
    return problem(failure_reason::bad_body, R"(expected {"keys": ["k1", "k2", ...]})", req.path);
  for (const auto& [k, v] : body.items())
    if (k != "keys" && k != "key_format")
      return problem(failure_reason::bad_body, "unknown field '" + k + "' in the body", req.path);
  const auto& keys = body["keys"];
  if (keys.size() > ctx_.limits.max_batch_keys)
    return problem(failure_reason::payload_too_large,
                   "at most " + std::to_string(ctx_.limits.max_batch_keys) + " keys per batch", req.path);
  http_response err;
  auto fmt = key_format_of(req, *view, err);
  if (!fmt) return err;
  if (body.contains("key_format")) {
    query::key_format f;
    if (!body["key_format"].is_string() || !query::parse_key_format(body["key_format"].get<std::string>(), f))
      return problem(failure_reason::bad_body, "key_format must be one of: string, base64url, long, json", req.path);
    fmt = f;
  }
  std::vector<std::string> decoded;
  decoded.reserve(keys.size());
  for (const auto& k : keys) {
    // json keys may be given as JSON values; every other format as strings.
    std::string text;
    if (k.is_string()) text = k.get<std::string>();
    else if (*fmt == query::key_format::json) text = k.dump();
    else return problem(failure_reason::bad_body, "keys must be strings", req.path);
    auto d = query::decode_key(*fmt, text, ctx_.limits.max_json_depth);
    if (!d.ok()) return problem(failure_reason::bad_key_encoding, d.error().message(), req.path);
    decoded.push_back(std::move(*d));
  }
  auto res = ctx_.queries->get_many(c.store, decoded);
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active && !req.header(hop_header) && ctx_.membership &&
        ctx_.peers) {
      captures::batch b;
      b.keys = decoded;
      for (const auto& k : keys) b.texts.push_back(k.is_string() ? k.get<std::string>() : k.dump());
      b.key_format = query::to_string(*fmt);
      c.scatter_batch = std::move(b);
      return {};
    }
    return from_failure(*res.failure, res.message, req.path);
  }
  json data = json::array(), missing = json::array();
  for (const auto& e : res.answer->entries) {
    if (e.value)
      data.push_back({{"key", render_key(view->key_format, e.key)},
                      {"value", render_value(view->value_format, *e.value)},
                      {"partition", e.partition},
                      {"offset", e.offset}});
    else missing.push_back(render_key(view->key_format, e.key));
  }
  return json_response(200, {{"data", data},
                             {"missing", missing},
                             {"metadata", {{"position", position_json(res.answer->pos)}}},
                             {"served_by", ctx_.instance}})
      .with_header("X-Kstate-Position", position_header(res.answer->pos));
}

http_response api::count(const http_request& req, const captures& c) const {
  std::optional<std::vector<int32_t>> subset;
  if (auto list = req.param("partitions")) {
    if (!req.header(hop_header))
      return problem(failure_reason::unknown_parameter, "partitions is set by kstate on forwarded requests", req.path);
    std::vector<int32_t> ps;
    std::stringstream in(*list);
    std::string item;
    while (std::getline(in, item, ',')) {
      auto v = parse_int(item);
      if (!v || *v < 0) return problem(failure_reason::bad_request, "partitions must be a list of numbers", req.path);
      ps.push_back(static_cast<int32_t>(*v));
    }
    subset = std::move(ps);
  }
  auto res = ctx_.queries->count(c.store, ctx_.limits.exact_count_limit, subset);
  if (!res.ok()) {
    if (res.failure == query::failure_reason::not_active && !req.header(hop_header) && ctx_.membership &&
        ctx_.peers) {
      c.scatter_count = true;
      return {};
    }
    return from_failure(*res.failure, res.message, req.path);
  }
  return json_response(200, {{"store", c.store},
                             {"count", res.answer->count},
                             {"exact", res.answer->exact},
                             {"metadata", {{"position", position_json(res.answer->pos)}}},
                             {"served_by", ctx_.instance}})
      .with_header("X-Kstate-Position", position_header(res.answer->pos));
}

std::optional<http_response> api::stale_answer(const http_request& req, const std::string& store,
                                               const std::string& key) const {
  const auto* view = ctx_.queries->find_store(store);
  auto res = ctx_.queries->get_stale({store, key});
  if (!view || !res.ok()) return std::nullopt;
  const auto& a = *res.answer;
  int64_t pos = a.pos.begin()->second;
  json lag = nullptr;
  if (ctx_.high_watermark)
    if (auto hw = ctx_.high_watermark(view->topic, a.partition)) lag = std::max<int64_t>(0, *hw - pos);
  if (!a.value) {
    auto r = problem(failure_reason::key_not_found, "no value for this key in this instance's stale copy", req.path);
    auto body = json::parse(r.body);
    body["partition"] = a.partition;
    body["position"] = position_json(a.pos);
    body["stale"] = true;
    body["lag"] = lag;
    body["served_by"] = ctx_.instance;
    r.body = dump(body);
    return r.with_header("X-Kstate-Position", position_header(a.pos)).with_header("X-Kstate-Stale", "true");
  }
  json body{{"store", store},
            {"key", render_key(view->key_format, key)},
            {"value", render_value(view->value_format, *a.value)},
            {"partition", a.partition},
            {"offset", a.offset},
            {"position", position_json(a.pos)},
            {"stale", true},
            {"lag", lag},
            {"served_by", ctx_.instance}};
  return json_response(200, body)
      .with_header("X-Kstate-Position", position_header(a.pos))
      .with_header("X-Kstate-Stale", "true");
}

http_response api::key_metadata(const http_request& req, const captures& c) const {
  const view_def* view = nullptr;
  http_response err;
  auto key = request_key(req, c.store, c.key, view, err);
  if (!key) return err;
  auto loc = ctx_.queries->locate(c.store, *key);
  if (!loc) return problem(failure_reason::not_caught_up, "partition count of '" + view->topic + "' not known yet", req.path);
  json owner = nullptr;
  uint64_t version = 0;
  if (ctx_.membership) {
    auto snap = ctx_.membership->current();
    version = snap->version;
    if (auto o = snap->owner(loc->first, loc->second)) owner = *o;
  }
  auto t = ctx_.ownership->topic(loc->first);
  bool here = false;
  if (t) {
    auto it = t->partitions.find(loc->second);
    here = it != t->partitions.end() && it->second.assigned;
  }
  if (owner.is_null() && here) owner = ctx_.instance;
  return json_response(200, {{"store", c.store},
                             {"key", render_key(view->key_format, *key)},
                             {"topic", loc->first},
                             {"partition", loc->second},
                             {"partitioner", view->partitioner},
                             {"active_owner", owner},
                             {"standbys", ctx_.membership ? ingest::standbys_for(*ctx_.membership->current(), loc->first,
                                                                                   loc->second, ctx_.standby_replicas)
                                                          : std::vector<std::string>{}},
                             {"owned_here", here},
                             {"membership_version", version},
                             {"served_by", ctx_.instance}});
}

json api::local_cluster_view() const {
  json parts = json::array();
  std::set<std::string> topics;
  for (const auto& v : ctx_.queries->views()) topics.insert(v.topic);
  for (const auto& topic : topics) {
    auto t = ctx_.ownership->topic(topic);
    if (!t) continue;
    for (const auto& [p, st] : t->partitions) {
      if (!st.assigned) continue;
      json lag = nullptr;
      if (st.applied >= 0 && st.high_watermark >= 0) lag = std::max<int64_t>(0, st.high_watermark - st.applied);
      parts.push_back({{"topic", topic},
                       {"partition", p},
                       {"position", st.applied >= 0 ? json(st.applied) : json(nullptr)},
                       {"high_watermark", st.high_watermark >= 0 ? json(st.high_watermark) : json(nullptr)},
                       {"lag", lag},
                       {"ready", st.ready}});
    }
  }
  bool draining = ctx_.draining && ctx_.draining->load();
  return {{"endpoint", ctx_.instance},
          {"ready", !draining && ctx_.ownership->all_ready()},
          {"version", KSTATE_VERSION},
          {"partitions", parts}};
}

http_response api::cluster(const http_request& req, const captures&) const {
  // scope=local (or no membership): the same shape, holding only this instance.
  json local = local_cluster_view();
  json owned = json::array(), partitions = json::array();
  for (const auto& p : local["partitions"]) {
    owned.push_back({{"topic", p["topic"]}, {"partition", p["partition"]}});
    json e = p;
    e["owner"] = ctx_.instance;
    e["standbys"] = json::array();
    partitions.push_back(e);
  }
  uint64_t version = 0;
  std::string state = "Unknown";
  int64_t read_at = 0;
  if (ctx_.membership) {
    auto snap = ctx_.membership->current();
    version = snap->version;
    state = snap->group_state.empty() ? state : snap->group_state;
    read_at = std::chrono::duration_cast<std::chrono::milliseconds>(snap->read_at.time_since_epoch()).count();
  }
  json instance{{"endpoint", ctx_.instance}, {"self", true}, {"ready", local["ready"]},
                {"version", local["version"]}, {"partitions", owned}};
  return json_response(200, {{"group", ctx_.group},
                             {"group_state", state},
                             {"membership_version", version},
                             {"read_at_ms", read_at},
                             {"instances", json::array({instance})},
                             {"partitions", partitions},
                             {"served_by", ctx_.instance}});
}

void api::cluster_async(const http_request& req, std::function<void(http_response)> finish) const {
  auto snap = ctx_.membership->current();
  struct gather {
    std::mutex mu;
    size_t pending = 0;
    std::map<std::string, json> views;  // endpoint -> its local view (or an error)
  };
  auto g = std::make_shared<gather>();
  g->views[ctx_.instance] = local_cluster_view();
  std::vector<std::string> others;
  for (const auto& m : snap->members)
    if (!m.endpoint.empty() && m.endpoint != ctx_.instance) others.push_back(m.endpoint);
  auto complete = [this, g, snap, finish]() {
    json instances = json::array(), partitions = json::array();
    std::map<std::pair<std::string, int32_t>, json> held;  // (topic, partition) -> holder's numbers
    for (auto& [endpoint, v] : g->views)
      if (v.contains("partitions"))
        for (auto& p : v["partitions"]) held[{p["topic"].get<std::string>(), p["partition"].get<int32_t>()}] = p;
    for (const auto& m : snap->members) {
      json parts = json::array();
      for (const auto& [t, p] : m.partitions) parts.push_back({{"topic", t}, {"partition", p}});
      json inst{{"endpoint", m.endpoint}, {"member_id", m.member_id}, {"client_id", m.client_id}, {"host", m.host},
                {"self", m.endpoint == ctx_.instance}, {"partitions", parts}};
      auto it = g->views.find(m.endpoint);
      if (it != g->views.end() && it->second.contains("ready")) {
        inst["ready"] = it->second["ready"];
        inst["version"] = it->second["version"];
      } else {
        inst["ready"] = nullptr;
        inst["version"] = nullptr;
        if (it != g->views.end() && it->second.contains("error")) inst["error"] = it->second["error"];
      }
      instances.push_back(inst);
      for (const auto& [t, p] : m.partitions) {
        json e{{"topic", t}, {"partition", p}, {"owner", m.endpoint},
               {"standbys", ingest::standbys_for(*snap, t, p, ctx_.standby_replicas)},
               {"position", nullptr}, {"high_watermark", nullptr}, {"lag", nullptr}, {"ready", nullptr}};
        auto h = held.find({t, p});
        if (h != held.end())
          for (const char* k : {"position", "high_watermark", "lag", "ready"}) e[k] = h->second[k];
        partitions.push_back(e);
      }
    }
    std::sort(partitions.begin(), partitions.end(), [](const json& a, const json& b) {
      return std::make_pair(a["topic"].get<std::string>(), a["partition"].get<int>()) <
             std::make_pair(b["topic"].get<std::string>(), b["partition"].get<int>());
    });
    auto read_at = std::chrono::duration_cast<std::chrono::milliseconds>(snap->read_at.time_since_epoch()).count();
    finish(json_response(200, {{"group", ctx_.group},
                               {"group_state", snap->group_state},
                               {"membership_version", snap->version},
                               {"read_at_ms", read_at},
                               {"instances", instances},
                               {"partitions", partitions},
                               {"served_by", ctx_.instance}}));
  };
  if (others.empty()) return complete();
  g->pending = others.size();
  for (const auto& endpoint : others) {
    peer_request pr;
    pr.target = "/v1/cluster?scope=local";
    pr.headers = {{hop_header, "1"}, {"X-Request-Id", req.request_id}};
    carry_identity(req, pr);
    pr.deadline = clock_type::now() + ctx_.forward_timeout;
    ctx_.peers->send(endpoint, std::move(pr), [g, endpoint, complete](result<http_response> r) {
      json v;
      if (r.ok() && r->status == 200) {
        auto full = json::parse(r->body, nullptr, false);
        if (full.is_object() && full.contains("instances") && !full["instances"].empty()) {
          v = full["instances"][0];
          v["partitions"] = full["partitions"];
        }
      }
      if (!v.is_object()) v = json{{"error", r.ok() ? "status " + std::to_string(r->status) : r.error().to_string()}};
      bool last;
      {
        std::lock_guard lock(g->mu);
        g->views[endpoint] = std::move(v);
        last = --g->pending == 0;
      }
      if (last) complete();
    });
  }
}

void api::forward(const http_request& req, const std::string& owner, std::function<void(http_response)> finish) const {
  peer_request pr;
  pr.method = req.method;
  pr.target = req.target;
  pr.body = req.body;
  pr.headers = {{hop_header, "1"}, {"X-Request-Id", req.request_id}};
  for (const char* h : {"accept", "content-type", "x-kstate-min-position"})
    if (auto v = req.header(h)) pr.headers.emplace_back(h, *v);
  carry_identity(req, pr);
  pr.deadline = clock_type::now() + ctx_.forward_timeout;
  auto counter = m_forwarded_;
  // With allow_stale, a lookup whose owner does not answer falls back to a local copy.
  std::function<std::optional<http_response>()> stale;
  if (req.param("allow_stale") == "true" && req.segments.size() == 5) {
    stale = [this, req]() -> std::optional<http_response> {
      const view_def* view = nullptr;
      http_response err;
      auto key = request_key(req, req.segments[2], req.segments[4], view, err);
      if (!key) return std::nullopt;
      return stale_answer(req, req.segments[2], *key);
    };
  }
  ctx_.peers->send(owner, std::move(pr), [owner, path = req.path, finish, counter, stale](result<http_response> r) {
    if (counter) counter->Add({{"result", r.ok() ? "ok" : "error"}}).Increment();
    if (r.ok() && r->status != 503) {
      http_response out = std::move(r.value());
      out.with_header("X-Kstate-Forwarded-To", owner);
      return finish(std::move(out));
    }
    if (stale)
      if (auto s = stale()) return finish(std::move(*s));
    if (r.ok()) return finish(std::move(r.value()));
    finish(problem(failure_reason::not_owner, "the owner at " + owner + " did not answer: " + r.error().message(), path));
  });
}

}  // namespace

std::vector<route_info> api_routes() {
  std::vector<route_info> out;
  for (const auto& r : api::routes())
    out.push_back({r.method, r.path_template(), {r.params.begin(), r.params.end()}});
  return out;
}

async_http_handler make_api_handler(api_context ctx) {
  auto a = std::make_shared<api>(std::move(ctx));
  return [a](const http_request& req, http_responder reply) { a->handle(req, std::move(reply)); };
}

}  // namespace kstate::server
