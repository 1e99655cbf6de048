#include "server/config.h"

#include "config_parse.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <map>
#include <set>
#include <sstream>

namespace kstate::server {
namespace {

using config_detail::check_keys;
using config_detail::config_error;
using config_detail::fail;
using config_detail::get_bool;
using config_detail::get_number;
using config_detail::get_string;

void parse_listen(const std::string& s, http::server_config& http) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) fail("http.listen", "must be host:port (got '" + s + "')");
  http.listen_address = s.substr(0, colon);
  if (http.listen_address.size() > 2 && http.listen_address.front() == '[' && http.listen_address.back() == ']')
    http.listen_address = http.listen_address.substr(1, http.listen_address.size() - 2);
  YAML::Node port(s.substr(colon + 1));
  http.port = static_cast<uint16_t>(get_number<int>(port, "http.listen", 0, 65535));
}

const std::regex& name_pattern() {
  static const std::regex re("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  return re;
}

void parse_store_options(const YAML::Node& r, const std::string& where, storage::store_options& o) {
  if (r["write_buffer_mb"])
    o.write_buffer_bytes = get_number<uint64_t>(r["write_buffer_mb"], where + ".write_buffer_mb", 1, 1 << 16) << 20;
  if (r["max_write_buffers"])
    o.max_write_buffers = get_number<int>(r["max_write_buffers"], where + ".max_write_buffers", 2, 64);
  if (r["bloom_bits_per_key"])
    o.bloom_bits_per_key = get_number<int>(r["bloom_bits_per_key"], where + ".bloom_bits_per_key", 0, 64);
  if (r["compression"]) {
    o.compression = get_string(r["compression"], where + ".compression");
    static const std::set<std::string> ok{"none", "snappy", "lz4", "zstd"};
    if (!ok.count(o.compression))
      fail(where + ".compression", "must be one of: none, snappy, lz4, zstd (got '" + o.compression + "')");
  }
  if (r["compaction_style"]) {
    o.compaction_style = get_string(r["compaction_style"], where + ".compaction_style");
    if (o.compaction_style != "level" && o.compaction_style != "universal")
      fail(where + ".compaction_style", "must be one of: level, universal (got '" + o.compaction_style + "')");
  }
}

void parse_tls(const YAML::Node& t, app_config& c) {
  check_keys(t, "http.tls", {"cert_file", "key_file", "client_ca_file", "peer_ca_file"});
  auto& tls = c.http.tls;
  if (t["cert_file"]) tls.cert_file = get_string(t["cert_file"], "http.tls.cert_file");
  if (t["key_file"]) tls.key_file = get_string(t["key_file"], "http.tls.key_file");
  if (t["client_ca_file"]) tls.client_ca_file = get_string(t["client_ca_file"], "http.tls.client_ca_file");
  if (t["peer_ca_file"]) c.peer_ca_file = get_string(t["peer_ca_file"], "http.tls.peer_ca_file");
  if (tls.cert_file.empty() != tls.key_file.empty())
    fail(tls.cert_file.empty() ? "http.tls.cert_file" : "http.tls.key_file",
         "is required when http.tls." + std::string(tls.cert_file.empty() ? "key_file" : "cert_file") + " is set");
  if (!tls.enabled() && (!tls.client_ca_file.empty() || !c.peer_ca_file.empty()))
    fail("http.tls", "client_ca_file and peer_ca_file need cert_file and key_file (TLS on)");
}

void parse_cors(const YAML::Node& n, cors_config& cors) {
  check_keys(n, "http.cors", {"allowed_origins", "max_age_s"});
  if (auto o = n["allowed_origins"]) {
    if (!o.IsSequence()) fail("http.cors.allowed_origins", "must be a list of origins");
    static const std::regex origin("https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\\[[0-9A-Fa-f:.]+\\](:[0-9]{1,5})?");
    for (size_t i = 0; i < o.size(); ++i) {
      auto key = "http.cors.allowed_origins[" + std::to_string(i) + "]";
      auto v = get_string(o[i], key);
      if (v == "*") fail(key, "'*' is not allowed: list each origin (tokens are credentials)");
      // "https://" + a DNS name (at most 253) + ":65535". Checked first: std::regex
      // matches recursively, one stack frame per character, and a long enough value
      // overflowed the stack instead of getting this message.
      constexpr size_t max_origin = 8 + 253 + 6;
      if (v.size() > max_origin)
        fail(key, "must be an origin: scheme://host[:port], at most " + std::to_string(max_origin) + " characters");
      if (!std::regex_match(v, origin))
        fail(key, "must be an origin: scheme://host[:port] without a path (got '" + v + "')");
      cors.allowed_origins.push_back(v);
    }
  }
  if (n["max_age_s"]) cors.max_age_s = get_number<int>(n["max_age_s"], "http.cors.max_age_s", 0, 86'400);
}

// The aggregate-only keys of a view: group_by, value, reduce, fields, repartition and
// changelog settings, cache.
void parse_aggregate(const YAML::Node& n, const std::string& where, view_def& v) {
  auto path_ok = [](const std::string& p) {
    if (p.empty() || p.front() == '.' || p.back() == '.') return false;
    return p.find("..") == std::string::npos;
  };
  if (auto g = n["group_by"]) {
    if (g.IsScalar()) {
      auto s = g.as<std::string>();
      if (s == "key") v.group_by = group_by_kind::key;
      else if (s == "words") v.group_by = group_by_kind::words;
      else fail(where + ".group_by", "must be key, words or {json: <path>} (got '" + s + "')");
    } else if (g.IsMap()) {
      check_keys(g, where + ".group_by", {"json"});
      if (!g["json"]) fail(where + ".group_by.json", "is required: the dotted path of the field to group by");
      v.group_by = group_by_kind::json;
      v.group_path = get_string(g["json"], where + ".group_by.json");
      if (!path_ok(v.group_path))
        fail(where + ".group_by.json", "must be a dotted path such as user.id (got '" + v.group_path + "')");
    } else {
      fail(where + ".group_by", "must be key, words or {json: <path>}");
    }
  }
  if (n["value"]) {
    v.value_path = get_string(n["value"], where + ".value");
    if (!path_ok(v.value_path))
      fail(where + ".value", "must be a dotted path such as order.amount (got '" + v.value_path + "')");
  }
  if (v.kind == view_kind::reduce) {
    if (!n["reduce"]) fail(where + ".reduce", "is required for kind reduce: latest, min or max");
    auto r = get_string(n["reduce"], where + ".reduce");
    if (!parse_reduce_op(r, v.reduce)) fail(where + ".reduce", "must be one of: latest, min, max (got '" + r + "')");
  } else if (n["reduce"]) {
    fail(where + ".reduce", "applies to kind reduce only");
  }
  if (v.kind == view_kind::aggregate) {
    if (auto f = n["fields"]) {
      if (!f.IsSequence() || f.size() == 0) fail(where + ".fields", "must be a list of count, sum, min, max, mean");
      for (size_t i = 0; i < f.size(); ++i) {
        auto s = get_string(f[i], where + ".fields[" + std::to_string(i) + "]");
        agg_field af;
        if (!parse_agg_field(s, af))
          fail(where + ".fields[" + std::to_string(i) + "]",
               "must be one of: count, sum, min, max, mean (got '" + s + "')");
        if (std::find(v.fields.begin(), v.fields.end(), af) != v.fields.end())
          fail(where + ".fields[" + std::to_string(i) + "]", "duplicate field '" + s + "'");
        v.fields.push_back(af);
      }
    } else {
      v.fields = {agg_field::count, agg_field::sum, agg_field::min, agg_field::max, agg_field::mean};
    }
    auto has = [&](agg_field x) { return std::find(v.fields.begin(), v.fields.end(), x) != v.fields.end(); };
    if (has(agg_field::mean) && !(has(agg_field::count) && has(agg_field::sum)))
      fail(where + ".fields", "mean needs count and sum in the list too (it is derived from them)");
  } else if (n["fields"]) {
    fail(where + ".fields", "applies to kind aggregate only");
  }
  if (v.group_by == group_by_kind::words && v.kind != view_kind::count)
    fail(where + ".group_by", "words can only be counted (kind count), got kind " + std::string(to_string(v.kind)));
  if (v.group_by == group_by_kind::words && !v.value_path.empty())
    fail(where + ".value", "does not apply to group_by words");
  if (n["repartition_partitions"]) {
    if (v.group_by == group_by_kind::key)
      fail(where + ".repartition_partitions", "applies to re-keyed views only (group_by json or words)");
    v.repartition_partitions =
        get_number<int32_t>(n["repartition_partitions"], where + ".repartition_partitions", 1, 100'000);
  }
  if (n["replication_factor"])
    v.replication_factor = get_number<int>(n["replication_factor"], where + ".replication_factor", -1, 32);
  if (auto c = n["changelog_configs"]) {
    if (!c.IsMap()) fail(where + ".changelog_configs", "must map topic config names to values");
    for (const auto& kv : c) {
      auto k = kv.first.as<std::string>();
      v.changelog_configs[k] = get_string(kv.second, where + ".changelog_configs." + k);
      // A changelog keeps the latest update of each key. Windowed views may also let
      // Kafka delete old segments (their keys expire); any other view needs every key.
      if (k == "cleanup.policy" && v.changelog_configs[k] != "compact" && v.changelog_configs[k] != "compact,delete")
        fail(where + ".changelog_configs.cleanup.policy", "must be compact, or compact,delete for a windowed view");
    }
  }
  if (auto w = n["window"]) {
    const std::string ww = where + ".window";
    if (!w.IsMap())
      fail(ww,
           "must be a map: {type: tumbling|hopping|session, size: 1m, advance: 10s, inactivity_gap: 5m, grace: 30s, "
           "retention: 24h, max_future: 1d}");
    check_keys(w, ww, {"type", "size", "advance", "inactivity_gap", "grace", "retention", "time_field", "max_future"});
    window_spec spec;
    if (w["type"]) {
      auto t = get_string(w["type"], ww + ".type");
      if (!parse_window_type(t, spec.type))
        fail(ww + ".type", "must be tumbling, hopping or session (got '" + t + "')");
    }
    auto duration = [&](const char* key, int64_t& out) {
      if (!w[key]) return;
      auto d = parse_duration_ms(get_string(w[key], ww + "." + key));
      if (!d.ok()) fail(ww + "." + key, d.error().message());
      out = d.value();
    };
    if (spec.type == window_type::session) {
      if (!w["inactivity_gap"]) fail(ww + ".inactivity_gap", "is required for session windows (e.g. 5m)");
    } else if (!w["size"]) {
      fail(ww + ".size", "is required (e.g. 1m)");
    }
    duration("size", spec.size_ms);
    duration("advance", spec.advance_ms);
    duration("inactivity_gap", spec.gap_ms);
    duration("grace", spec.grace_ms);
    duration("retention", spec.retention_ms);
    duration("max_future", spec.max_future_ms);
    if (spec.type == window_type::hopping && !w["advance"]) fail(ww + ".advance", "is required for hopping windows");
    if (w["time_field"]) {
      spec.time_field = get_string(w["time_field"], ww + ".time_field");
      if (!path_ok(spec.time_field))
        fail(ww + ".time_field", "must be a dotted path such as event.time (got '" + spec.time_field + "')");
    }
    if (auto s = normalize(spec); !s.ok()) {
      // normalize() names the field first: "size: ..." -> <view>.window.size
      const auto& m = s.message();
      auto colon = m.find(": ");
      fail(ww + "." + m.substr(0, colon), colon == std::string::npos ? m : m.substr(colon + 2));
    }
    v.window = spec;
  }
  if (auto it = v.changelog_configs.find("cleanup.policy");
      it != v.changelog_configs.end() && it->second != "compact" && !v.window)
    fail(where + ".changelog_configs.cleanup.policy", "may be compact,delete only for a windowed view");
  if (n["cache"]) v.cache = get_bool(n["cache"], where + ".cache");
}

view_def parse_view(const YAML::Node& n, const std::string& where) {
  check_keys(n, where,
             {"name", "kind", "topic", "key_format", "value_format", "partitioner", "dead_letter_topic", "group_by",
              "value", "reduce", "fields", "repartition_partitions", "replication_factor", "changelog_configs", "cache",
              "window", "ttl", "join", "versioned"});
  view_def v;
  if (!n["name"]) fail(where + ".name", "is required");
  v.name = get_string(n["name"], where + ".name");
  if (!std::regex_match(v.name, name_pattern()))
    fail(where + ".name", "must match [A-Za-z0-9][A-Za-z0-9._-]* (got '" + v.name + "')");
  std::string kind = n["kind"] ? get_string(n["kind"], where + ".kind") : "table";
  if (!parse_view_kind(kind, v.kind))
    fail(where + ".kind", "must be one of: table, count, sum, reduce, aggregate, join (got '" + kind + "')");
  if (n["join"] && !v.is_join()) fail(where + ".join", "applies to join views only (kind join)");
  if (!n["topic"]) fail(where + ".topic", "is required");
  v.topic = get_string(n["topic"], where + ".topic");
  if (v.topic.empty()) fail(where + ".topic", "must not be empty");
  v.source = v.topic;
  if (v.is_join()) {
    config_detail::parse_join(n, where, v);
  } else if (v.is_aggregate()) {
    parse_aggregate(n, where, v);
  } else {
    for (const char* k : {"group_by", "value", "reduce", "fields", "repartition_partitions", "replication_factor",
                          "changelog_configs", "cache", "window"})
      if (n[k]) fail(where + "." + k, "applies to aggregate views only (kind count, sum, reduce, aggregate)");
  }
  auto format = [&](const char* key, data_format& out) {
    if (!n[key]) return;
    auto s = get_string(n[key], where + "." + key);
    if (!parse_data_format(s, out)) fail(where + "." + key, "must be one of: string, json, bytes (got '" + s + "')");
  };
  format("key_format", v.key_format);
  format("value_format", v.value_format);
  if (v.is_aggregate() && v.value_format != data_format::json)
    fail(where + ".value_format", "an aggregate's values are JSON (got '" + std::string(to_string(v.value_format)) +
                                      "'); what it reads is set by group_by and value");
  if (n["partitioner"]) {
    if (v.rekeyed() && !v.is_join()) fail(where + ".partitioner", "re-keyed views are partitioned by kstate (murmur2)");
    v.partitioner = get_string(n["partitioner"], where + ".partitioner");
    if (v.partitioner != "murmur2" && v.partitioner != "consistent" && v.partitioner != "fnv1a")
      fail(where + ".partitioner", "must be one of: murmur2, consistent, fnv1a (got '" + v.partitioner + "')");
  }
  if (n["dead_letter_topic"]) v.dead_letter_topic = get_string(n["dead_letter_topic"], where + ".dead_letter_topic");
  if (auto t = n["ttl"]) {
    const std::string tw = where + ".ttl";
    if (v.is_aggregate()) fail(tw, "applies to table views only (kind table)");
    if (!t.IsMap()) fail(tw, "must be a map: {after: 24h, clock: record_time|ingest_time}");
    check_keys(t, tw, {"after", "clock"});
    ttl_spec spec;
    if (!t["after"]) fail(tw + ".after", "is required (e.g. 24h): how long after its last update a key expires");
    auto d = parse_duration_ms(get_string(t["after"], tw + ".after"));
    if (!d.ok()) fail(tw + ".after", d.error().message());
    if (d.value() <= 0) fail(tw + ".after", "must be positive (got '" + t["after"].Scalar() + "')");
    spec.after_ms = d.value();
    if (t["clock"]) {
      auto c = get_string(t["clock"], tw + ".clock");
      if (!parse_ttl_clock(c, spec.clock)) fail(tw + ".clock", "must be record_time or ingest_time (got '" + c + "')");
    }
    v.ttl = spec;
  }
  if (auto h = n["versioned"]) {
    const std::string vw = where + ".versioned";
    if (v.is_aggregate()) fail(vw, "applies to table views only (kind table)");
    if (!h.IsMap()) fail(vw, "must be a map: {history: 7d, max_future: 24h}");
    check_keys(h, vw, {"history", "max_future"});
    if (!h["history"]) fail(vw + ".history", "is required (e.g. 7d): how far behind stream time versions are kept");
    auto d = parse_duration_ms(get_string(h["history"], vw + ".history"));
    if (!d.ok()) fail(vw + ".history", d.error().message());
    if (d.value() <= 0) fail(vw + ".history", "must be positive (got '" + h["history"].Scalar() + "')");
    // A ttl hides a key whose versions the history would still answer for, and expires
    // by the wall clock what versions keep by stream time: one would contradict the other.
    if (v.ttl)
      fail(vw,
           "cannot be combined with ttl: a versioned view keeps old values by record time (history), a ttl "
           "drops them by age; choose one");
    versioned_spec spec;
    spec.history_ms = d.value();
    if (h["max_future"]) {
      auto f = parse_duration_ms(get_string(h["max_future"], vw + ".max_future"));
      if (!f.ok()) fail(vw + ".max_future", f.error().message());
      if (f.value() < 0) fail(vw + ".max_future", "must not be negative (got '" + h["max_future"].Scalar() + "')");
      spec.max_future_ms = f.value();
    }
    v.versioned = spec;
  }
  return v;
}

app_config parse(const YAML::Node& root) {
  app_config c;
  if (!root || root.IsNull()) fail("", "the configuration is empty");
  check_keys(root, "",
             {"application_id", "bootstrap_servers", "state_dir", "advertised_endpoint", "http", "ingest", "rocksdb",
              "kafka", "views", "query", "standby_replicas", "auth", "processing_guarantee", "peer_secret_file",
              "max_json_depth", "peer_bootstrap"});
  if (root["peer_secret_file"]) c.peer_secret_file = get_string(root["peer_secret_file"], "peer_secret_file");
  if (root["max_json_depth"]) {
    // One bound for everything JSON: ingest validation and aggregates, and the API.
    const int depth = get_number<int>(root["max_json_depth"], "max_json_depth", min_max_json_depth, max_max_json_depth);
    c.ingest.max_json_depth = depth;
    c.query.max_json_depth = depth;
  }
  if (root["processing_guarantee"]) {
    auto g = get_string(root["processing_guarantee"], "processing_guarantee");
    if (g == "exactly_once") c.ingest.exactly_once = true;
    else if (g == "at_least_once") c.ingest.exactly_once = false;
    else fail("processing_guarantee", "must be one of: exactly_once, at_least_once (got '" + g + "')");
  }
  if (root["standby_replicas"])
    c.standby_replicas = get_number<int>(root["standby_replicas"], "standby_replicas", 0, 9);
  if (auto b = root["peer_bootstrap"]) {
    check_keys(b, "peer_bootstrap", {"enabled", "min_offsets", "timeout_ms", "page_timeout_ms"});
    if (b["enabled"]) {
      bool ok = b["enabled"].IsScalar();
      if (ok) {
        try {
          c.bootstrap.enabled = b["enabled"].as<bool>();
        } catch (const YAML::Exception&) {
          ok = false;
        }
      }
      if (!ok) fail("peer_bootstrap.enabled", "must be true or false");
    }
    if (b["min_offsets"])
      c.bootstrap.min_offsets = get_number<int64_t>(b["min_offsets"], "peer_bootstrap.min_offsets", 0, INT64_MAX);
    if (b["timeout_ms"])
      c.bootstrap.timeout =
          std::chrono::milliseconds(get_number<int64_t>(b["timeout_ms"], "peer_bootstrap.timeout_ms", 100, 3'600'000));
    if (b["page_timeout_ms"])
      c.bootstrap.page_timeout = std::chrono::milliseconds(
          get_number<int64_t>(b["page_timeout_ms"], "peer_bootstrap.page_timeout_ms", 100, 3'600'000));
  }
  if (!root["application_id"]) fail("application_id", "is required");
  c.application_id = get_string(root["application_id"], "application_id");
  if (!std::regex_match(c.application_id, name_pattern()))
    fail("application_id", "must match [A-Za-z0-9][A-Za-z0-9._-]* (got '" + c.application_id + "')");
  if (!root["bootstrap_servers"]) fail("bootstrap_servers", "is required");
  c.bootstrap_servers = get_string(root["bootstrap_servers"], "bootstrap_servers");
  if (root["state_dir"]) c.state_dir = get_string(root["state_dir"], "state_dir");
  if (root["advertised_endpoint"])
    c.advertised_endpoint = get_string(root["advertised_endpoint"], "advertised_endpoint");

  if (auto h = root["http"]) {
    check_keys(h, "http",
               {"listen", "threads", "max_connections", "max_header_bytes", "max_body_bytes", "max_target_bytes",
                "read_timeout_ms", "shutdown_grace_ms", "ui_dir", "drain_delay_ms", "peer_connections", "peer_batch",
                "tls", "cors"});
    if (auto t = h["tls"]) parse_tls(t, c);
    if (auto o = h["cors"]) parse_cors(o, c.cors);
    if (h["drain_delay_ms"])
      c.drain_delay =
          std::chrono::milliseconds(get_number<int64_t>(h["drain_delay_ms"], "http.drain_delay_ms", 0, 600'000));
    if (h["peer_connections"])
      c.peer_connections = get_number<std::size_t>(h["peer_connections"], "http.peer_connections", 1, 4096);
    if (auto b = h["peer_batch"]) {
      check_keys(b, "http.peer_batch", {"max_in_flight", "max_requests"});
      if (b["max_in_flight"])
        c.peer_batch.max_in_flight = get_number<uint32_t>(b["max_in_flight"], "http.peer_batch.max_in_flight", 0, 1024);
      if (b["max_requests"])
        c.peer_batch.max_requests = get_number<uint32_t>(b["max_requests"], "http.peer_batch.max_requests", 1, 1024);
    }
    if (h["ui_dir"]) c.ui_dir = get_string(h["ui_dir"], "http.ui_dir");
    if (h["listen"]) parse_listen(get_string(h["listen"], "http.listen"), c.http);
    if (h["threads"]) c.http.threads = get_number<int>(h["threads"], "http.threads", 1, 256);
    if (h["max_connections"])
      c.http.max_connections = get_number<std::size_t>(h["max_connections"], "http.max_connections", 1, 1'000'000);
    if (h["max_header_bytes"])
      c.http.max_header_bytes = get_number<uint32_t>(h["max_header_bytes"], "http.max_header_bytes", 1024, 1u << 24);
    if (h["max_body_bytes"])
      c.http.max_body_bytes = get_number<uint64_t>(h["max_body_bytes"], "http.max_body_bytes", 0, 1ull << 32);
    if (h["max_target_bytes"])
      c.http.max_target_bytes = get_number<uint32_t>(h["max_target_bytes"], "http.max_target_bytes", 256, 1u << 20);
    if (h["read_timeout_ms"])
      c.http.read_timeout =
          std::chrono::milliseconds(get_number<int64_t>(h["read_timeout_ms"], "http.read_timeout_ms", 10, 3'600'000));
    if (h["shutdown_grace_ms"])
      c.http.shutdown_grace =
          std::chrono::milliseconds(get_number<int64_t>(h["shutdown_grace_ms"], "http.shutdown_grace_ms", 0, 600'000));
  }
  if (auto a = root["auth"]) {
    check_keys(a, "auth", {"token_file", "metrics"});
    if (a["token_file"]) c.auth.token_file = get_string(a["token_file"], "auth.token_file");
    if (a["metrics"]) {
      auto m = get_string(a["metrics"], "auth.metrics");
      if (m != "open" && m != "token") fail("auth.metrics", "must be one of: open, token (got '" + m + "')");
      c.auth.open_metrics = m == "open";
    }
  }
  if (auto i = root["ingest"]) {
    check_keys(i, "ingest",
               {"max_batch_records", "max_batch_delay_ms", "max_queued_mb", "commit_interval_ms", "startup_timeout_ms",
                "client_id", "static_membership"});
    if (i["max_batch_records"])
      c.ingest.max_batch_records = get_number<int>(i["max_batch_records"], "ingest.max_batch_records", 1, 1'000'000);
    if (i["static_membership"]) {
      const auto& n = i["static_membership"];
      bool ok = n.IsScalar();
      if (ok) {
        try {
          c.ingest.static_membership = n.as<bool>();
        } catch (const YAML::Exception&) {
          ok = false;
        }
      }
      if (!ok) fail("ingest.static_membership", "must be true or false");
    }
    if (i["max_queued_mb"])
      c.ingest.max_queued_bytes = get_number<size_t>(i["max_queued_mb"], "ingest.max_queued_mb", 1, 65'536) << 20;
    if (i["max_batch_delay_ms"])
      c.ingest.max_batch_delay = std::chrono::milliseconds(
          get_number<int64_t>(i["max_batch_delay_ms"], "ingest.max_batch_delay_ms", 0, 60'000));
    if (i["commit_interval_ms"])
      c.ingest.commit_interval = std::chrono::milliseconds(
          get_number<int64_t>(i["commit_interval_ms"], "ingest.commit_interval_ms", 10, 3'600'000));
    if (i["startup_timeout_ms"])
      c.ingest.startup_timeout = std::chrono::milliseconds(
          get_number<int64_t>(i["startup_timeout_ms"], "ingest.startup_timeout_ms", 100, 3'600'000));
    if (i["client_id"]) c.ingest.client_id = get_string(i["client_id"], "ingest.client_id");
  }
  if (auto q = root["query"]) {
    check_keys(q, "query",
               {"default_limit", "max_limit", "max_batch_keys", "max_concurrent_scans", "max_subscriptions",
                "exact_count_limit", "default_wait_ms", "max_wait_ms", "max_response_bytes", "max_waiting_requests",
                "max_waiting_mb", "worker_threads", "max_queued_work"});
    if (q["max_response_bytes"])
      c.query.max_response_bytes =
          get_number<std::size_t>(q["max_response_bytes"], "query.max_response_bytes", 1024, std::size_t{1} << 32);
    if (q["max_waiting_requests"])
      c.waits.max_waiters =
          get_number<std::size_t>(q["max_waiting_requests"], "query.max_waiting_requests", 1, 1'000'000);
    if (q["max_waiting_mb"])
      c.waits.max_bytes = get_number<std::size_t>(q["max_waiting_mb"], "query.max_waiting_mb", 1, 1 << 20) << 20;
    if (q["worker_threads"])
      c.query.worker_threads = get_number<int>(q["worker_threads"], "query.worker_threads", 1, 256);
    if (q["max_queued_work"])
      c.query.max_queued_work = get_number<std::size_t>(q["max_queued_work"], "query.max_queued_work", 1, 1'000'000);
    if (q["max_limit"]) c.query.max_limit = get_number<uint32_t>(q["max_limit"], "query.max_limit", 1, 1'000'000);
    if (q["default_limit"])
      c.query.default_limit = get_number<uint32_t>(q["default_limit"], "query.default_limit", 1, c.query.max_limit);
    if (c.query.default_limit > c.query.max_limit)
      fail("query.default_limit", "must not exceed query.max_limit (" + std::to_string(c.query.max_limit) + ")");
    if (q["max_batch_keys"])
      c.query.max_batch_keys = get_number<uint32_t>(q["max_batch_keys"], "query.max_batch_keys", 1, 100'000);
    if (q["max_concurrent_scans"])
      c.query.max_concurrent_scans =
          get_number<uint32_t>(q["max_concurrent_scans"], "query.max_concurrent_scans", 1, 10'000);
    if (q["max_subscriptions"])
      c.query.max_subscriptions = get_number<uint32_t>(q["max_subscriptions"], "query.max_subscriptions", 1, 10'000);
    if (q["exact_count_limit"])
      c.query.exact_count_limit =
          get_number<uint64_t>(q["exact_count_limit"], "query.exact_count_limit", 0, 1ull << 40);
    if (q["max_wait_ms"])
      c.query.max_wait =
          std::chrono::milliseconds(get_number<int64_t>(q["max_wait_ms"], "query.max_wait_ms", 0, 3'600'000));
    if (q["default_wait_ms"])
      c.query.default_wait = std::chrono::milliseconds(
          get_number<int64_t>(q["default_wait_ms"], "query.default_wait_ms", 0, c.query.max_wait.count()));
    if (c.query.default_wait > c.query.max_wait)
      fail("query.default_wait_ms",
           "must not exceed query.max_wait_ms (" + std::to_string(c.query.max_wait.count()) + ")");
  }
  if (auto r = root["rocksdb"]) {
    check_keys(r, "rocksdb",
               {"block_cache_mb", "write_buffer_manager_mb", "max_background_jobs", "write_buffer_mb",
                "max_write_buffers", "bloom_bits_per_key", "compression", "compaction_style", "stores",
                "window_expiry_interval_ms", "verify_files_interval_ms"});
    if (r["block_cache_mb"])
      c.rocksdb.block_cache_bytes = get_number<uint64_t>(r["block_cache_mb"], "rocksdb.block_cache_mb", 1, 1 << 20)
                                    << 20;
    if (r["write_buffer_manager_mb"])
      c.rocksdb.write_buffer_manager_bytes =
          get_number<uint64_t>(r["write_buffer_manager_mb"], "rocksdb.write_buffer_manager_mb", 1, 1 << 20) << 20;
    if (c.rocksdb.write_buffer_manager_bytes > c.rocksdb.block_cache_bytes)
      fail("rocksdb.write_buffer_manager_mb",
           "must not exceed rocksdb.block_cache_mb (memtables are charged to the cache)");
    if (r["max_background_jobs"])
      c.rocksdb.max_background_jobs = get_number<int>(r["max_background_jobs"], "rocksdb.max_background_jobs", 1, 64);
    if (r["window_expiry_interval_ms"])
      c.rocksdb.window_expiry_interval_ms =
          get_number<int64_t>(r["window_expiry_interval_ms"], "rocksdb.window_expiry_interval_ms", 0, 7ll * 86'400'000);
    if (r["verify_files_interval_ms"])
      c.rocksdb.verify_files_interval_ms =
          get_number<int64_t>(r["verify_files_interval_ms"], "rocksdb.verify_files_interval_ms", 0, 86'400'000);
    parse_store_options(r, "rocksdb", c.rocksdb.defaults);
    if (auto stores = r["stores"]) {
      if (!stores.IsMap()) fail("rocksdb.stores", "must map store names to settings");
      for (const auto& kv : stores) {
        auto name = kv.first.as<std::string>();
        auto where = "rocksdb.stores." + name;
        check_keys(kv.second, where,
                   {"write_buffer_mb", "max_write_buffers", "bloom_bits_per_key", "compression", "compaction_style"});
        auto o = c.rocksdb.defaults;  // a store override starts from the defaults
        parse_store_options(kv.second, where, o);
        c.rocksdb.per_store[name] = o;
      }
    }
  }
  if (auto k = root["kafka"]) {
    if (!k.IsMap()) fail("kafka", "must be a mapping of librdkafka properties");
    for (const auto& kv : k) {
      auto key = kv.first.as<std::string>();
      // What kstate's correctness rests on (positions live in RocksDB, resume from the
      // beginning without state, EOF marks readiness) or what has its own setting.
      static const std::map<std::string, std::string> owned{
          {"group.id", "it is application_id"},
          {"bootstrap.servers", "use bootstrap_servers"},
          {"client.id", "use ingest.client_id"},
          {"enable.auto.commit", "positions are stored with the state"},
          {"enable.auto.offset.store", "positions are stored with the state"},
          {"auto.offset.reset", "partitions without stored state are read from the beginning"},
          {"enable.partition.eof", "readiness depends on it"},
          {"partition.assignment.strategy", "kstate uses cooperative-sticky"},
          {"enable.idempotence", "dead letters are produced idempotently"},
          {"transactional.id", "kstate derives it from application_id and the state directory"}};
      if (auto it = owned.find(key); it != owned.end())
        fail("kafka." + key, "is set by kstate and cannot be overridden (" + it->second + ")");
      c.ingest.kafka[key] = get_string(kv.second, "kafka." + key);
    }
  }
  if (!root["views"] || !root["views"].IsSequence() || root["views"].size() == 0)
    fail("views", "is required: a list of at least one view");
  std::set<std::string> names;
  for (size_t i = 0; i < root["views"].size(); ++i) {
    auto where = "views[" + std::to_string(i) + "]";
    auto v = parse_view(root["views"][i], where);
    if (!names.insert(v.name).second) fail(where + ".name", "duplicate view name '" + v.name + "'");
    if (v.is_aggregate()) {
      // Topics kstate creates for the view (docs/exactly-once.md).
      v.changelog_topic = c.application_id + "-" + v.name + "-changelog";
      if (v.rekeyed()) {
        v.repartition_topic = c.application_id + "-" + v.name + "-repartition";
        v.topic = v.repartition_topic;  // the store's partitions are the repartition topic's
        // A join's repartition topic keeps its inputs' partitions, so keys route by
        // their producers' partitioner; other re-keyed views are partitioned by kstate.
        if (!v.is_join()) v.partitioner = "murmur2";
      }
      if (v.is_fk_join()) {
        v.join->subscription_topic = c.application_id + "-" + v.name + "-subscription";
        v.join->subscription_changelog_topic = c.application_id + "-" + v.name + "-subscription-changelog";
      }
    }
    c.views.push_back(std::move(v));
  }

  config_detail::check_join_inputs(c.views);

  auto iso = c.ingest.kafka.find("isolation.level");
  bool any_aggregate = std::any_of(c.views.begin(), c.views.end(), [](const view_def& v) { return v.is_aggregate(); });
  if (any_aggregate && c.ingest.exactly_once && iso != c.ingest.kafka.end() && iso->second != "read_committed")
    fail("kafka.isolation.level", "must be read_committed with processing_guarantee exactly_once");

  for (const auto& [name, o] : c.rocksdb.per_store)
    if (!names.count(name)) fail("rocksdb.stores." + name, "names no configured view");

  // A port is plain or TLS, never both: the endpoint other instances and clients use
  // must say which.
  if (!c.advertised_endpoint.empty()) {
    const bool https = c.advertised_endpoint.rfind("https://", 0) == 0;
    if (c.http.tls.enabled() && !https)
      fail("advertised_endpoint",
           "must start with https:// when http.tls is set (got '" + c.advertised_endpoint + "')");
    if (!c.http.tls.enabled() && https)
      fail("advertised_endpoint",
           "https:// needs http.tls.cert_file and key_file (got '" + c.advertised_endpoint + "')");
  }
  c.ingest.bootstrap_servers = c.bootstrap_servers;
  c.ingest.application_id = c.application_id;
  c.rocksdb.path = c.state_dir;
  return c;
}

const std::set<std::string>& top_level_keys() {
  static const std::set<std::string> keys{"application_id",
                                          "bootstrap_servers",
                                          "state_dir",
                                          "advertised_endpoint",
                                          "http",
                                          "ingest",
                                          "rocksdb",
                                          "kafka",
                                          "views",
                                          "query",
                                          "standby_replicas",
                                          "auth",
                                          "processing_guarantee",
                                          "peer_secret_file",
                                          "max_json_depth",
                                          "peer_bootstrap"};
  return keys;
}

// Sets `path` in the YAML tree, creating maps on the way; "views.N" indexes the list.
void apply_override(YAML::Node root, const config_override& o) {
  std::vector<std::string> segs;
  size_t start = 0;
  for (;;) {
    auto dot = o.path.find('.', start);
    segs.push_back(o.path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (segs.empty() || segs[0].empty() || !top_level_keys().count(segs[0]))
    fail(o.path, "unknown key (from " + o.origin + ")");
  if (segs[0] == "kafka") {
    if (segs.size() < 2) fail(o.path, "needs a property name, e.g. kafka.sasl.password (from " + o.origin + ")");
    auto prop = o.path.substr(6);
    root["kafka"][prop] = o.value;
    return;
  }
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    if (segs[i] == "views" && i == 0) {
      size_t idx = 0;
      try {
        idx = std::stoul(segs[i + 1]);
      } catch (...) {
        fail(o.path, "views.<index>.<key> expected (from " + o.origin + ")");
      }
      YAML::Node views = node["views"];
      if (!views.IsSequence() || idx >= views.size())
        fail(o.path, "there is no view " + segs[i + 1] + " in the file (from " + o.origin + ")");
      node.reset(views[idx]);  // rebind; operator= would overwrite the tree
      ++i;
      if (i + 1 == segs.size()) fail(o.path, "views.<index>.<key> expected (from " + o.origin + ")");
      continue;
    }
    YAML::Node child = node[segs[i]];
    if (!child || child.IsNull()) {
      node[segs[i]] = YAML::Node(YAML::NodeType::Map);
      child = node[segs[i]];
    }
    node.reset(child);
  }
  node[segs.back()] = o.value;
}

}  // namespace

std::vector<config_override> overrides_from_env(char** envp) {
  std::vector<config_override> out;
  for (char** e = envp; e && *e; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("KSTATE_", 0) != 0) continue;
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(kv.substr(0, eq)), value(kv.substr(eq + 1));
    std::string rest = name.substr(7);
    std::vector<std::string> segs;
    size_t start = 0;
    for (;;) {
      auto sep = rest.find("__", start);
      segs.push_back(rest.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
      if (sep == std::string::npos) break;
      start = sep + 2;
    }
    auto lower = [](std::string s) {
      for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return s;
    };
    std::string path;
    for (size_t i = 0; i < segs.size(); ++i) {
      std::string seg = (i > 0 && lower(segs[i - 1]) == "stores") ? segs[i] : lower(segs[i]);
      if (i == 1 && lower(segs[0]) == "kafka")
        for (auto& ch : seg)
          if (ch == '_') ch = '.';
      path += (i ? "." : "") + seg;
    }
    if (!top_level_keys().count(lower(segs[0]))) continue;  // not configuration (e.g. KSTATE_KAFKA_RUN)
    out.push_back({path, value, name});
  }
  return out;
}

namespace {

// A key given twice in one mapping: YAML leaves its meaning open and yaml-cpp reads the
// first, so the second would be ignored without a word. Refused instead, at any depth.
void check_unique_keys(const YAML::Node& n, const std::string& where, int depth) {
  if (depth > 64) fail(where, "nested deeper than 64 levels");
  if (n.IsMap()) {
    std::set<std::string> seen;
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) continue;  // not a configuration key; parse() refuses it
      const std::string& k = kv.first.Scalar();
      const std::string path = where.empty() ? k : where + "." + k;
      if (!seen.insert(k).second)
        fail(path, "given twice in one mapping (again on line " + std::to_string(kv.first.Mark().line + 1) +
                       "); give each key once");
      check_unique_keys(kv.second, path, depth + 1);
    }
  } else if (n.IsSequence()) {
    std::size_t i = 0;
    for (const auto& e : n) check_unique_keys(e, where + "[" + std::to_string(i++) + "]", depth + 1);
  }
}

}  // namespace

result<app_config> parse_config(const std::string& yaml_text, const std::string& source,
                                const std::vector<config_override>& overrides) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    check_unique_keys(root, "", 0);
    if (!overrides.empty() && (!root || root.IsNull())) root = YAML::Node(YAML::NodeType::Map);
    for (const auto& o : overrides) apply_override(root, o);
    auto cfg = parse(root);
    if (auto s = ingest::check_kafka_properties(cfg.ingest.kafka); !s.ok()) fail("kafka", s.message());
    return cfg;
  } catch (const config_error& e) {
    return status::invalid_argument(source + ": " + (e.key.empty() ? "" : e.key + ": ") + e.message);
  } catch (const YAML::Exception& e) {
    return status::invalid_argument(source + ": invalid YAML: " + e.what());
  }
}

result<app_config> load_config(const std::string& path, const std::vector<config_override>& overrides) {
  std::ifstream in(path);
  if (!in) return status::invalid_argument("cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

}  // namespace kstate::server
