// Handlers that describe the instance rather than read a store: health probes,
// metrics, the API description, the stores, and the cluster view.

#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <set>

#include "api/handlers.h"
#include "api/params.h"
#include "api/render.h"
#include "ingest/standby.h"
#include "server/problem.h"

namespace kstate::server::api {
namespace {

using json = nlohmann::json;

http::response json_response(unsigned status, const json& body) {
  http::response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

bool draining(const state& st) { return st.ctx.draining && st.ctx.draining->load(); }

// Topics whose partitions make an instance ready: every view's store topic and input.
std::set<std::string> readiness_topics(const state& st) {
  std::set<std::string> topics;
  for (const auto& v : st.ctx.queries->views()) {
    topics.insert(v.topic);
    topics.insert(v.input_topic());
  }
  return topics;
}

// This instance's part of /v1/cluster: readiness and the partitions it holds.
json local_cluster_view(const state& st) {
  json parts = json::array();
  std::set<std::string> topics;
  for (const auto& v : st.ctx.queries->views()) topics.insert(v.topic);
  for (const auto& topic : topics) {
    auto t = st.ctx.ownership->topic(topic);
    if (!t) continue;
    for (const auto& [p, ps] : t->partitions) {
      if (!ps.assigned) continue;
      json lag = nullptr;
      if (ps.applied >= 0 && ps.high_watermark >= 0) lag = std::max<int64_t>(0, ps.high_watermark - ps.applied);
      parts.push_back({{"topic", topic},
                       {"partition", p},
                       {"position", ps.applied >= 0 ? json(ps.applied) : json(nullptr)},
                       {"high_watermark", ps.high_watermark >= 0 ? json(ps.high_watermark) : json(nullptr)},
                       {"lag", lag},
                       {"ready", ps.ready}});
    }
  }
  return {{"endpoint", st.ctx.instance},
          {"ready", !draining(st) && st.ctx.ownership->all_ready()},
          {"version", KSTATE_VERSION},
          {"partitions", parts}};
}

// A partition still catching up to its end at assignment: how far, and when it should
// be done at the rate so far. Null when it is ready.
json catch_up_json(const partition_state& ps) {
  auto c = catch_up(ps, std::chrono::steady_clock::now());
  if (!c) return nullptr;
  return {{"position", c->position},
          {"target", c->target},
          {"left", c->left},
          {"records_per_second", std::round(c->records_per_second)},
          {"eta_seconds", c->eta_seconds ? json(std::round(*c->eta_seconds * 10) / 10) : json(nullptr)}};
}

// Adds a metric family with one unlabelled sample.
void add_sample(std::vector<prometheus::MetricFamily>& families, std::string name, std::string help,
                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f{std::move(name), std::move(help), type, {}};
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) m.counter.value = value;
  else m.gauge.value = value;
  f.metric.push_back(m);
  families.push_back(std::move(f));
}

}  // namespace

outcome livez(const state&, const call&) { return json_response(200, {{"status", "ok"}}); }

outcome readyz(const state& st, const call& c) {
  const bool drain = draining(st);
  const bool ready = !drain && st.ctx.ownership->all_ready();
  json body{{"ready", ready}, {"draining", drain}};
  // Ingest cannot write the state directory: the cause, for whoever looks at why.
  if (auto why = st.ctx.ownership->write_failure(); !why.empty()) body["write_failure"] = std::move(why);
  // The partitions (and so the topic names) only for whoever may read the cluster view:
  // an anonymous probe needs the status and nothing else.
  bool details = !st.ctx.auth;
  if (!details)
    if (auto who = st.ctx.auth->authenticate(c.r().header("authorization"))) details = who->scopes.cluster;
  if (details) {
    json parts = json::array();
    for (const auto& topic : readiness_topics(st)) {
      auto t = st.ctx.ownership->topic(topic);
      if (!t) continue;
      for (const auto& [p, ps] : t->partitions) {
        if (!ps.assigned) continue;
        json part{{"topic", topic}, {"partition", p}, {"ready", ps.ready}};
        // A partition catching up from its changelog, or to its end, says how far it is.
        if (ps.restore_total >= 0) part["restore"] = {{"restored", ps.restored}, {"total", ps.restore_total}};
        if (auto c = catch_up_json(ps); !c.is_null()) part["catch_up"] = std::move(c);
        parts.push_back(std::move(part));
      }
    }
    body["partitions"] = std::move(parts);
  }
  auto r = json_response(ready ? 200 : 503, body);
  if (!ready) r.with_header("Retry-After", "1");
  return r;
}

outcome metrics(const state& st, const call& c) {
  if (!st.ctx.metrics) return problem(failure_reason::route_not_found, "metrics are disabled", c.path());
  auto families = st.ctx.metrics->Collect();
  for (const auto& col : st.ctx.collectables) {
    auto more = col->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  using prometheus::MetricType;
  if (st.ctx.open_connections)
    add_sample(families, "kstate_http_open_connections", "HTTP connections currently open", MetricType::Gauge,
               static_cast<double>(st.ctx.open_connections()));
  if (st.ctx.refused_connections)
    add_sample(families, "kstate_http_refused_connections_total",
               "Connections refused or answered 503 because http.max_connections were open", MetricType::Counter,
               static_cast<double>(st.ctx.refused_connections()));
  if (st.ctx.waiter) {
    add_sample(families, "kstate_query_waiting_requests", "Requests waiting for their min_position", MetricType::Gauge,
               static_cast<double>(st.ctx.waiter->pending()));
    add_sample(families, "kstate_query_waits_refused_total",
               "Requests refused because query.max_waiting_requests or their bytes were waiting", MetricType::Counter,
               static_cast<double>(st.ctx.waiter->refused()));
  }
  add_sample(families, "kstate_query_worker_queue", "API tasks waiting for a worker thread", MetricType::Gauge,
             static_cast<double>(st.workers->queued()));
  add_sample(families, "kstate_query_open_scans", "NDJSON scans streaming now", MetricType::Gauge,
             static_cast<double>(st.open_scans.load()));
  add_sample(families, "kstate_query_open_subscriptions", "Change subscriptions streaming now", MetricType::Gauge,
             static_cast<double>(st.feeds->open()));
  http::response r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = prometheus::TextSerializer().Serialize(families);
  return r;
}

outcome openapi(const state& st, const call&) {
  http::response r;
  r.body = st.ctx.openapi_json;
  return r;
}

namespace {

json store_json(const state& st, const view_def& v) {
  json out{{"name", v.name},
           {"kind", to_string(v.kind)},
           {"topic", v.topic},
           {"key_format", to_string(v.key_format)},
           {"value_format", to_string(v.value_format)},
           {"partitioner", v.partitioner},
           {"partitions", st.ctx.ownership->partition_count(v.topic)}};
  if (v.is_aggregate()) {
    out["source"] = v.input_topic();
    out["group_by"] = v.group_by == group_by_kind::json ? "json:" + v.group_path : std::string(to_string(v.group_by));
    out["changelog_topic"] = v.changelog_topic;
    if (v.rekeyed()) out["repartition_topic"] = v.repartition_topic;
  }
  if (v.join) {
    out.erase("group_by");
    out["join"] = {{"type", to_string(v.join->type)}, {"right", v.join->right_topic}};
    if (v.join->by_foreign_key()) {
      out["join"]["foreign_key"] = v.join->foreign_key;
      out["join"]["subscription_topic"] = v.join->subscription_topic;
    }
  }
  if (v.window) {
    out["window"] = {{"type", to_string(v.window->type)},
                     {"size_ms", v.window->size_ms},
                     {"advance_ms", v.window->advance_ms},
                     {"grace_ms", v.window->grace_ms},
                     {"retention_ms", v.window->retention_ms}};
    if (is_session(*v.window)) out["window"]["inactivity_gap_ms"] = v.window->gap_ms;
    if (!v.window->time_field.empty()) out["window"]["time_field"] = v.window->time_field;
  }
  return out;
}

}  // namespace

outcome list_stores(const state& st, const call& c) {
  json data = json::array();
  for (const auto& v : st.ctx.queries->views())
    if (!c.who || c.who->scopes.store_allowed(v.name)) data.push_back(store_json(st, v));
  return json_response(200, {{"data", data}, {"served_by", st.ctx.instance}});
}

outcome describe_store(const state& st, const call& c) {
  auto res = st.ctx.queries->describe(c.store);
  if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
  const auto& info = res.answer();
  json body = store_json(st, *info.def);
  json parts = json::array();
  position pos;
  auto t = st.ctx.ownership->topic(info.def->topic);
  for (const auto& p : info.partitions) {
    parts.push_back({{"partition", p.partition},
                     {"ready", p.ready},
                     {"position", p.position ? json(*p.position) : json(nullptr)},
                     {"catch_up_target", p.catch_up_target}});
    if (t) {
      auto ps = t->partitions.find(p.partition);
      if (ps != t->partitions.end() && ps->second.assigned && ps->second.restore_total >= 0)
        parts.back()["restore"] = {{"restored", ps->second.restored}, {"total", ps->second.restore_total}};
      if (ps != t->partitions.end())
        if (auto c = catch_up_json(ps->second); !c.is_null()) parts.back()["catch_up"] = std::move(c);
    }
    if (p.position) pos.set(p.partition, *p.position);
  }
  body["assigned_partitions"] = parts;
  body["position"] = position_json(pos);
  body["estimated_keys"] = info.stats.estimated_keys;
  body["size_on_disk_bytes"] = info.stats.live_sst_bytes;
  body["memtable_bytes"] = info.stats.memtable_bytes;
  if (info.def->window) body["expired_windows"] = info.stats.expired_windows;
  body["served_by"] = st.ctx.instance;
  return json_response(200, body).with_header("X-Kstate-Position", position_header(pos));
}

namespace {

// Standby endpoints of a partition, from the group as last described.
std::vector<std::string> standbys(const state& st, const std::string& topic, int32_t p) {
  if (!st.ctx.membership) return {};
  return ingest::standbys_for(*st.ctx.membership->current(), topic, p, st.ctx.standby_replicas);
}

// /v1/cluster holding only this instance (scope=local, or a single instance).
http::response local_cluster(const state& st) {
  json local = local_cluster_view(st);
  json owned = json::array(), partitions = json::array();
  for (const auto& p : local["partitions"]) {
    owned.push_back({{"topic", p["topic"]}, {"partition", p["partition"]}});
    json e = p;
    e["owner"] = st.ctx.instance;
    e["standbys"] = standbys(st, p["topic"].get<std::string>(), p["partition"].get<int32_t>());
    partitions.push_back(e);
  }
  uint64_t version = 0;
  std::string group_state = "Unknown";
  int64_t read_at = 0;
  if (st.ctx.membership) {
    auto snap = st.ctx.membership->current();
    version = snap->version;
    if (!snap->group_state.empty()) group_state = snap->group_state;
    read_at = std::chrono::duration_cast<std::chrono::milliseconds>(snap->read_at.time_since_epoch()).count();
  }
  json instance{{"endpoint", st.ctx.instance},
                {"self", true},
                {"ready", local["ready"]},
                {"version", local["version"]},
                {"partitions", owned}};
  return json_response(200, {{"group", st.ctx.group},
                             {"group_state", group_state},
                             {"membership_version", version},
                             {"read_at_ms", read_at},
                             {"instances", json::array({instance})},
                             {"partitions", partitions},
                             {"served_by", st.ctx.instance}});
}

// The whole group's view from the membership snapshot and every member's local view
// (`views`: endpoint -> its view, or {"error": why}).
http::response merge_cluster(const state& st, const cluster_snapshot& snap, const std::map<std::string, json>& views) {
  json instances = json::array(), partitions = json::array();
  std::map<std::pair<std::string, int32_t>, json> held;  // (topic, partition) -> holder's numbers
  for (const auto& [endpoint, v] : views)
    if (v.contains("partitions"))
      for (const auto& p : v["partitions"]) held[{p["topic"].get<std::string>(), p["partition"].get<int32_t>()}] = p;
  for (const auto& m : snap.members) {
    json parts = json::array();
    for (const auto& [t, p] : m.partitions) parts.push_back({{"topic", t}, {"partition", p}});
    json inst{{"endpoint", m.endpoint},
              {"member_id", m.member_id},
              {"client_id", m.client_id},
              {"host", m.host},
              {"self", m.endpoint == st.ctx.instance},
              {"partitions", parts}};
    auto it = views.find(m.endpoint);
    if (it != views.end() && it->second.contains("ready")) {
      inst["ready"] = it->second["ready"];
      inst["version"] = it->second["version"];
    } else {
      inst["ready"] = nullptr;
      inst["version"] = nullptr;
      if (it != views.end() && it->second.contains("error")) inst["error"] = it->second["error"];
    }
    instances.push_back(inst);
    for (const auto& [t, p] : m.partitions) {
      json e{{"topic", t},          {"partition", p},
             {"owner", m.endpoint}, {"standbys", ingest::standbys_for(snap, t, p, st.ctx.standby_replicas)},
             {"position", nullptr}, {"high_watermark", nullptr},
             {"lag", nullptr},      {"ready", nullptr}};
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
  auto read_at = std::chrono::duration_cast<std::chrono::milliseconds>(snap.read_at.time_since_epoch()).count();
  return json_response(200, {{"group", st.ctx.group},
                             {"group_state", snap.group_state},
                             {"membership_version", snap.version},
                             {"read_at_ms", read_at},
                             {"instances", instances},
                             {"partitions", partitions},
                             {"served_by", st.ctx.instance}});
}

}  // namespace

outcome cluster(const state& st, const call& c) {
  // A peer asking for this instance's part of its cluster view.
  if (negotiate(c, false) == media::part) {
    http::response r;
    r.content_type = std::string(part_media_type);
    r.body = part_writer(local_cluster_view(st)).take();
    return r;
  }
  if (c.r().param("scope").value_or("") == "local" || !st.forwarding()) return local_cluster(st);
  auto snap = st.ctx.membership->current();
  std::vector<std::string> others;
  for (const auto& m : snap->members)
    if (st.peer_allowed(m.endpoint)) others.push_back(m.endpoint);
  gather_plan g;
  g.partial_ok = true;  // an instance that does not answer is shown with its error
  g.local = [&st]() -> part_result { return part_writer(local_cluster_view(st)).take(); };
  for (const auto& endpoint : others) {
    peer_part part;
    part.endpoint = endpoint;
    part.target = "/v1/cluster?scope=local";
    g.remote.push_back(std::move(part));
  }
  g.merge = [&st, snap, others](std::vector<std::string> parts) {
    std::map<std::string, json> views;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const std::string& endpoint = i == 0 ? st.ctx.instance : others[i - 1];
      auto pv = read_part(parts[i]);
      views[endpoint] = pv ? pv->header : json{{"error", parts[i].empty() ? "no answer" : "malformed answer"}};
    }
    return merge_cluster(st, *snap, views);
  };
  return g;
}

}  // namespace kstate::server::api
