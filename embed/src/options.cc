// node_options -> server::app_config: the typed options written out as the YAML
// document they stand for, then read by the server's own parser, so that a view
// defined in code is checked by exactly the rules (and with exactly the messages) of a
// view defined in a file.

#include "options.h"

#include <yaml-cpp/yaml.h>

namespace kstate::embed::detail {
namespace {

const char* name_of(view_kind k) {
  switch (k) {
    case view_kind::table: return "table";
    case view_kind::count: return "count";
    case view_kind::sum: return "sum";
    case view_kind::reduce: return "reduce";
    case view_kind::aggregate: return "aggregate";
    case view_kind::join: return "join";
  }
  return "?";
}

const char* name_of(data_format f) {
  switch (f) {
    case data_format::string: return "string";
    case data_format::json: return "json";
    case data_format::bytes: return "bytes";
  }
  return "?";
}

// Writes `key: value` when the value was given.
void optional_string(YAML::Emitter& out, const char* key, const std::string& value) {
  if (!value.empty()) out << YAML::Key << key << YAML::Value << value;
}

void emit_view(YAML::Emitter& out, const view_options& v) {
  out << YAML::BeginMap;
  optional_string(out, "name", v.name);
  out << YAML::Key << "kind" << YAML::Value << name_of(v.kind);
  optional_string(out, "topic", v.topic);
  if (v.key_format) out << YAML::Key << "key_format" << YAML::Value << name_of(*v.key_format);
  if (v.value_format) out << YAML::Key << "value_format" << YAML::Value << name_of(*v.value_format);
  optional_string(out, "partitioner", v.partitioner);
  optional_string(out, "dead_letter_topic", v.dead_letter_topic);
  if (!v.group_by.empty()) {
    out << YAML::Key << "group_by" << YAML::Value;
    if (v.group_by.rfind("json:", 0) == 0)
      out << YAML::BeginMap << YAML::Key << "json" << YAML::Value << v.group_by.substr(5) << YAML::EndMap;
    else out << v.group_by;
  }
  optional_string(out, "value", v.value);
  optional_string(out, "reduce", v.reduce);
  if (!v.fields.empty()) {
    out << YAML::Key << "fields" << YAML::Value << YAML::BeginSeq;
    for (const auto& f : v.fields) out << f;
    out << YAML::EndSeq;
  }
  if (v.repartition_partitions != 0)
    out << YAML::Key << "repartition_partitions" << YAML::Value << v.repartition_partitions;
  if (v.replication_factor) out << YAML::Key << "replication_factor" << YAML::Value << *v.replication_factor;
  if (!v.changelog_configs.empty()) {
    out << YAML::Key << "changelog_configs" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, val] : v.changelog_configs) out << YAML::Key << k << YAML::Value << val;
    out << YAML::EndMap;
  }
  if (v.cache) out << YAML::Key << "cache" << YAML::Value << *v.cache;
  if (v.window) {
    const auto& w = *v.window;
    out << YAML::Key << "window" << YAML::Value << YAML::BeginMap;
    optional_string(out, "type", w.type);
    optional_string(out, "size", w.size);
    optional_string(out, "advance", w.advance);
    optional_string(out, "inactivity_gap", w.inactivity_gap);
    optional_string(out, "grace", w.grace);
    optional_string(out, "retention", w.retention);
    optional_string(out, "time_field", w.time_field);
    optional_string(out, "max_future", w.max_future);
    out << YAML::EndMap;
  }
  if (v.join) {
    const auto& j = *v.join;
    out << YAML::Key << "join" << YAML::Value << YAML::BeginMap;
    optional_string(out, "type", j.type);
    optional_string(out, "right", j.right);
    optional_string(out, "right_partitioner", j.right_partitioner);
    optional_string(out, "foreign_key", j.foreign_key);
    optional_string(out, "left_name", j.left_name);
    optional_string(out, "right_name", j.right_name);
    if (!j.select.empty()) {
      out << YAML::Key << "select" << YAML::Value << YAML::BeginSeq;
      for (const auto& f : j.select) {
        out << YAML::BeginMap;
        optional_string(out, "side", f.side);
        optional_string(out, "field", f.field);
        optional_string(out, "as", f.as);
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const node_options& o) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  optional_string(out, "application_id", o.application_id);
  optional_string(out, "bootstrap_servers", o.bootstrap_servers);
  optional_string(out, "state_dir", o.state_dir);
  optional_string(out, "advertised_endpoint", o.advertised_endpoint);
  if (o.standby_replicas != 0) out << YAML::Key << "standby_replicas" << YAML::Value << o.standby_replicas;
  if (!o.listen.empty())
    out << YAML::Key << "http" << YAML::Value << YAML::BeginMap << YAML::Key << "listen" << YAML::Value << o.listen
        << YAML::EndMap;
  if (!o.kafka.empty()) {
    out << YAML::Key << "kafka" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, v] : o.kafka) out << YAML::Key << k << YAML::Value << v;
    out << YAML::EndMap;
  }
  if (!o.views.empty()) {
    out << YAML::Key << "views" << YAML::Value << YAML::BeginSeq;
    for (const auto& v : o.views) emit_view(out, v);
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
  return out.c_str();
}

kstate::result<server::app_config> to_config(const node_options& o) {
  std::vector<server::config_override> overrides;
  overrides.reserve(o.settings.size());
  for (const auto& [path, value] : o.settings) overrides.push_back({path, value, "node_options.settings"});
  auto cfg = server::parse_config(to_yaml(o), "node_options", overrides);
  if (!cfg.ok()) return cfg.error();
  cfg->serve_http = o.serve_http;
  return cfg;
}

}  // namespace kstate::embed::detail
