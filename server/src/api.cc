#include "server/api.h"

#include <openssl/evp.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "server/problem.h"

namespace kstate::server {
namespace {

using json = nlohmann::json;

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// A value as JSON by its format: validated JSON embedded, strings as strings, bytes
// base64.
json render(data_format f, std::string_view bytes) {
  switch (f) {
    case data_format::json: return json::parse(bytes.begin(), bytes.end(), nullptr, false);
    case data_format::string: return std::string(bytes);
    case data_format::bytes: return base64(bytes);
  }
  return nullptr;
}

json position_json(const position& p) {
  json o = json::object();
  for (const auto& [part, off] : p) o[std::to_string(part)] = off;
  return o;
}

http_response json_response(unsigned status, const json& body) {
  http_response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
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

class api {
 public:
  explicit api(api_context ctx) : ctx_(std::move(ctx)) {}

  http_response handle(const http_request& req) const {
    const auto& s = req.segments;
    if (s.size() == 1 && s[0] == "livez") return only_get(req, [&] { return json_response(200, {{"status", "ok"}}); });
    if (s.size() == 1 && s[0] == "readyz") return only_get(req, [&] { return readyz(); });
    if (s.size() == 1 && s[0] == "metrics") return only_get(req, [&] { return metrics(req); });
    if (s.size() >= 2 && s[0] == "v1" && s[1] == "stores") {
      if (s.size() == 2) return only_get(req, [&] { return list_stores(); });
      if (s.size() == 3) return only_get(req, [&] { return describe_store(req, s[2]); });
      if (s.size() == 5 && s[3] == "keys") return only_get(req, [&] { return get_key(req, s[2], s[4]); });
    }
    return problem(failure_reason::route_not_found, "no route for " + req.method + " " + req.path, req.path);
  }

 private:
  template <typename F>
  http_response only_get(const http_request& req, F&& f) const {
    if (req.method != "GET")
      return problem(failure_reason::method_not_allowed, req.method + " is not allowed here", req.path)
          .with_header("Allow", "GET");
    return f();
  }

  http_response readyz() const {
    bool draining = ctx_.draining && ctx_.draining->load();
    bool ready = !draining && ctx_.ownership->all_ready();
    json parts = json::array();
    for (const auto& v : ctx_.queries->views()) {
      auto t = ctx_.ownership->topic(v.topic);
      if (!t) continue;
      for (const auto& [p, st] : t->partitions)
        if (st.assigned) parts.push_back({{"topic", v.topic}, {"partition", p}, {"ready", st.ready}});
    }
    auto r = json_response(ready ? 200 : 503, {{"ready", ready}, {"draining", draining}, {"partitions", parts}});
    if (!ready) r.with_header("Retry-After", "1");
    return r;
  }

  http_response metrics(const http_request& req) const {
    if (!ctx_.metrics) return problem(failure_reason::route_not_found, "metrics are disabled", req.path);
    prometheus::TextSerializer ser;
    http_response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = ser.Serialize(ctx_.metrics->Collect());
    return r;
  }

  json store_json(const view_def& v) const {
    return {{"name", v.name},
            {"kind", to_string(v.kind)},
            {"topic", v.topic},
            {"key_format", to_string(v.key_format)},
            {"value_format", to_string(v.value_format)},
            {"partitioner", v.partitioner},
            {"partitions", ctx_.ownership->partition_count(v.topic)}};
  }

  http_response list_stores() const {
    json data = json::array();
    for (const auto& v : ctx_.queries->views()) data.push_back(store_json(v));
    return json_response(200, {{"data", data}, {"served_by", ctx_.instance}});
  }

  http_response describe_store(const http_request& req, const std::string& name) const {
    auto res = ctx_.queries->describe(name);
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
      if (p.position) pos[p.partition] = *p.position;
    }
    body["assigned_partitions"] = parts;
    body["position"] = position_json(pos);
    body["estimated_keys"] = info.stats.estimated_keys;
    body["size_on_disk_bytes"] = info.stats.live_sst_bytes;
    body["served_by"] = ctx_.instance;
    return json_response(200, body);
  }

  http_response get_key(const http_request& req, const std::string& store, const std::string& key) const {
    const auto* view = ctx_.queries->find_store(store);
    if (!view) return problem(failure_reason::unknown_store, "no store named '" + store + "'", req.path);
    if (view->key_format == data_format::string && !valid_utf8(key))
      return problem(failure_reason::bad_key_encoding, "the key is not valid UTF-8 (key_format string)", req.path);
    auto res = ctx_.queries->get({store, key});
    if (!res.ok()) return from_failure(*res.failure, res.message, req.path);
    const auto& a = *res.answer;
    if (!a.value) {
      auto r = problem(failure_reason::key_not_found, "no value for this key in store '" + store + "'", req.path);
      // The absence is as fresh as the position: say which.
      auto body = json::parse(r.body);
      body["partition"] = a.partition;
      body["position"] = position_json(a.pos);
      body["served_by"] = ctx_.instance;
      r.body = body.dump();
      return r;
    }
    json body{{"store", store},
              {"key", render(view->key_format, key)},
              {"value", render(view->value_format, *a.value)},
              {"partition", a.partition},
              {"offset", a.offset},
              {"position", position_json(a.pos)},
              {"served_by", ctx_.instance}};
    return json_response(200, body);
  }

  api_context ctx_;
};

}  // namespace

http_handler make_api_handler(api_context ctx) {
  auto a = std::make_shared<api>(std::move(ctx));
  return [a](const http_request& req) { return a->handle(req); };
}

}  // namespace kstate::server
