// render_config(): the effective configuration as YAML, secrets redacted
// (`kstate --check-config`). Kept apart from the parser: it reads every key of
// app_config and nothing of the parser's helpers.
#include "server/config.h"

#include <yaml-cpp/yaml.h>

#include <string>

namespace kstate::server {
namespace {

bool is_secret(const std::string& key) {
  return key.find("password") != std::string::npos || key.find("secret") != std::string::npos || key == "ssl.key.pem" ||
         key == "sasl.oauthbearer.config";
}

}  // namespace

std::string render_config(const app_config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "application_id" << YAML::Value << c.application_id;
  e << YAML::Key << "bootstrap_servers" << YAML::Value << c.bootstrap_servers;
  e << YAML::Key << "state_dir" << YAML::Value << c.state_dir;
  e << YAML::Key << "advertised_endpoint" << YAML::Value << c.advertised_endpoint;
  e << YAML::Key << "standby_replicas" << YAML::Value << c.standby_replicas;
  if (!c.peer_secret_file.empty()) e << YAML::Key << "peer_secret_file" << YAML::Value << c.peer_secret_file;
  e << YAML::Key << "max_json_depth" << YAML::Value << c.ingest.max_json_depth;
  e << YAML::Key << "peer_bootstrap" << YAML::Value << YAML::BeginMap << YAML::Key << "enabled" << YAML::Value
    << c.bootstrap.enabled << YAML::Key << "min_offsets" << YAML::Value << c.bootstrap.min_offsets << YAML::Key
    << "timeout_ms" << YAML::Value << c.bootstrap.timeout.count() << YAML::Key << "page_timeout_ms" << YAML::Value
    << c.bootstrap.page_timeout.count() << YAML::EndMap;
  e << YAML::Key << "processing_guarantee" << YAML::Value << (c.ingest.exactly_once ? "exactly_once" : "at_least_once");
  e << YAML::Key << "http" << YAML::Value << YAML::BeginMap << YAML::Key << "listen" << YAML::Value
    << (c.http.listen_address + ":" + std::to_string(c.http.port)) << YAML::Key << "threads" << YAML::Value
    << c.http.threads << YAML::Key << "max_connections" << YAML::Value << c.http.max_connections << YAML::Key
    << "max_header_bytes" << YAML::Value << c.http.max_header_bytes << YAML::Key << "max_body_bytes" << YAML::Value
    << c.http.max_body_bytes << YAML::Key << "max_target_bytes" << YAML::Value << c.http.max_target_bytes << YAML::Key
    << "read_timeout_ms" << YAML::Value << c.http.read_timeout.count() << YAML::Key << "shutdown_grace_ms"
    << YAML::Value << c.http.shutdown_grace.count() << YAML::Key << "ui_dir" << YAML::Value << c.ui_dir << YAML::Key
    << "drain_delay_ms" << YAML::Value << c.drain_delay.count() << YAML::Key << "peer_connections" << YAML::Value
    << c.peer_connections << YAML::Key << "peer_batch" << YAML::Value << YAML::BeginMap << YAML::Key << "max_in_flight"
    << YAML::Value << c.peer_batch.max_in_flight << YAML::Key << "max_requests" << YAML::Value
    << c.peer_batch.max_requests << YAML::EndMap;
  if (c.http.tls.enabled()) {
    e << YAML::Key << "tls" << YAML::Value << YAML::BeginMap << YAML::Key << "cert_file" << YAML::Value
      << c.http.tls.cert_file << YAML::Key << "key_file" << YAML::Value << c.http.tls.key_file;
    if (!c.http.tls.client_ca_file.empty())
      e << YAML::Key << "client_ca_file" << YAML::Value << c.http.tls.client_ca_file;
    if (!c.peer_ca_file.empty()) e << YAML::Key << "peer_ca_file" << YAML::Value << c.peer_ca_file;
    e << YAML::EndMap;
  }
  if (!c.cors.allowed_origins.empty()) {
    e << YAML::Key << "cors" << YAML::Value << YAML::BeginMap << YAML::Key << "allowed_origins" << YAML::Value
      << YAML::BeginSeq;
    for (const auto& o : c.cors.allowed_origins) e << o;
    e << YAML::EndSeq << YAML::Key << "max_age_s" << YAML::Value << c.cors.max_age_s << YAML::EndMap;
  }
  e << YAML::EndMap;
  if (!c.auth.token_file.empty()) {
    e << YAML::Key << "auth" << YAML::Value << YAML::BeginMap << YAML::Key << "token_file" << YAML::Value
      << c.auth.token_file << YAML::Key << "metrics" << YAML::Value << (c.auth.open_metrics ? "open" : "token")
      << YAML::EndMap;
  }
  e << YAML::Key << "query" << YAML::Value << YAML::BeginMap << YAML::Key << "default_limit" << YAML::Value
    << c.query.default_limit << YAML::Key << "max_limit" << YAML::Value << c.query.max_limit << YAML::Key
    << "max_batch_keys" << YAML::Value << c.query.max_batch_keys << YAML::Key << "max_concurrent_scans" << YAML::Value
    << c.query.max_concurrent_scans << YAML::Key << "max_subscriptions" << YAML::Value << c.query.max_subscriptions
    << YAML::Key << "exact_count_limit" << YAML::Value << c.query.exact_count_limit << YAML::Key << "default_wait_ms"
    << YAML::Value << c.query.default_wait.count() << YAML::Key << "max_wait_ms" << YAML::Value
    << c.query.max_wait.count() << YAML::Key << "max_response_bytes" << YAML::Value << c.query.max_response_bytes
    << YAML::Key << "max_waiting_requests" << YAML::Value << c.waits.max_waiters << YAML::Key << "max_waiting_mb"
    << YAML::Value << (c.waits.max_bytes >> 20) << YAML::Key << "worker_threads" << YAML::Value
    << c.query.worker_threads << YAML::Key << "max_queued_work" << YAML::Value << c.query.max_queued_work
    << YAML::EndMap;
  e << YAML::Key << "ingest" << YAML::Value << YAML::BeginMap << YAML::Key << "max_batch_records" << YAML::Value
    << c.ingest.max_batch_records << YAML::Key << "max_batch_delay_ms" << YAML::Value
    << c.ingest.max_batch_delay.count() << YAML::Key << "static_membership" << YAML::Value << c.ingest.static_membership
    << YAML::Key << "max_queued_mb" << YAML::Value << (c.ingest.max_queued_bytes >> 20) << YAML::Key
    << "commit_interval_ms" << YAML::Value << c.ingest.commit_interval.count() << YAML::Key << "startup_timeout_ms"
    << YAML::Value << c.ingest.startup_timeout.count() << YAML::Key << "client_id" << YAML::Value << c.ingest.client_id
    << YAML::EndMap;
  auto store_opts = [&](const storage::store_options& o) {
    e << YAML::Key << "write_buffer_mb" << YAML::Value << (o.write_buffer_bytes >> 20) << YAML::Key
      << "max_write_buffers" << YAML::Value << o.max_write_buffers << YAML::Key << "bloom_bits_per_key" << YAML::Value
      << o.bloom_bits_per_key << YAML::Key << "compression" << YAML::Value << o.compression << YAML::Key
      << "compaction_style" << YAML::Value << o.compaction_style;
  };
  e << YAML::Key << "rocksdb" << YAML::Value << YAML::BeginMap << YAML::Key << "block_cache_mb" << YAML::Value
    << (c.rocksdb.block_cache_bytes >> 20) << YAML::Key << "write_buffer_manager_mb" << YAML::Value
    << ((c.rocksdb.write_buffer_manager_bytes ? c.rocksdb.write_buffer_manager_bytes
                                              : c.rocksdb.block_cache_bytes / 4) >>
        20)
    << YAML::Key << "max_background_jobs" << YAML::Value << c.rocksdb.max_background_jobs << YAML::Key
    << "window_expiry_interval_ms" << YAML::Value << c.rocksdb.window_expiry_interval_ms << YAML::Key
    << "verify_files_interval_ms" << YAML::Value << c.rocksdb.verify_files_interval_ms;
  store_opts(c.rocksdb.defaults);
  if (!c.rocksdb.per_store.empty()) {
    e << YAML::Key << "stores" << YAML::Value << YAML::BeginMap;
    for (const auto& [name, o] : c.rocksdb.per_store) {
      e << YAML::Key << name << YAML::Value << YAML::BeginMap;
      store_opts(o);
      e << YAML::EndMap;
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  e << YAML::Key << "kafka" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : c.ingest.kafka) e << YAML::Key << k << YAML::Value << (is_secret(k) ? "[redacted]" : v);
  e << YAML::EndMap;
  e << YAML::Key << "views" << YAML::Value << YAML::BeginSeq;
  for (const auto& v : c.views) {
    e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << v.name << YAML::Key << "kind" << YAML::Value
      << to_string(v.kind) << YAML::Key << "topic" << YAML::Value << v.input_topic() << YAML::Key << "key_format"
      << YAML::Value << to_string(v.key_format) << YAML::Key << "value_format" << YAML::Value
      << to_string(v.value_format);
    if (!v.rekeyed() || v.is_join()) e << YAML::Key << "partitioner" << YAML::Value << v.partitioner;
    if (!v.dead_letter_topic.empty()) e << YAML::Key << "dead_letter_topic" << YAML::Value << v.dead_letter_topic;
    if (v.ttl)
      e << YAML::Key << "ttl" << YAML::Value << YAML::BeginMap << YAML::Key << "after" << YAML::Value
        << std::to_string(v.ttl->after_ms) + "ms" << YAML::Key << "clock" << YAML::Value << to_string(v.ttl->clock)
        << YAML::EndMap;
    if (v.versioned)
      e << YAML::Key << "versioned" << YAML::Value << YAML::BeginMap << YAML::Key << "history" << YAML::Value
        << std::to_string(v.versioned->history_ms) + "ms" << YAML::Key << "max_future" << YAML::Value
        << std::to_string(v.versioned->max_future_ms) + "ms" << YAML::EndMap;
    if (v.is_join()) {
      const auto& j = *v.join;
      e << YAML::Key << "join" << YAML::Value << YAML::BeginMap << YAML::Key << "type" << YAML::Value
        << to_string(j.type) << YAML::Key << "right" << YAML::Value << j.right_topic << YAML::Key << "right_partitioner"
        << YAML::Value << j.right_partitioner;
      if (j.by_foreign_key()) e << YAML::Key << "foreign_key" << YAML::Value << j.foreign_key;
      if (j.select.empty()) {
        e << YAML::Key << "left_name" << YAML::Value << j.left_name << YAML::Key << "right_name" << YAML::Value
          << j.right_name;
      } else {
        e << YAML::Key << "select" << YAML::Value << YAML::BeginSeq;
        for (const auto& f : j.select)
          e << YAML::Flow << YAML::BeginMap << YAML::Key << "side" << YAML::Value << (f.right ? "right" : "left")
            << YAML::Key << "field" << YAML::Value << f.path << YAML::Key << "as" << YAML::Value << f.as
            << YAML::EndMap;
        e << YAML::EndSeq;
      }
      e << YAML::EndMap << YAML::Key << "replication_factor" << YAML::Value << v.replication_factor;
      if (!v.changelog_configs.empty()) {
        e << YAML::Key << "changelog_configs" << YAML::Value << YAML::BeginMap;
        for (const auto& [k, val] : v.changelog_configs) e << YAML::Key << k << YAML::Value << val;
        e << YAML::EndMap;
      }
      e << YAML::Key << "cache" << YAML::Value << v.cache;
    } else if (v.is_aggregate()) {
      e << YAML::Key << "group_by" << YAML::Value;
      if (v.group_by == group_by_kind::json)
        e << YAML::BeginMap << YAML::Key << "json" << YAML::Value << v.group_path << YAML::EndMap;
      else e << to_string(v.group_by);
      if (!v.value_path.empty()) e << YAML::Key << "value" << YAML::Value << v.value_path;
      if (v.kind == view_kind::reduce) e << YAML::Key << "reduce" << YAML::Value << to_string(v.reduce);
      if (v.kind == view_kind::aggregate) {
        e << YAML::Key << "fields" << YAML::Value << YAML::Flow << YAML::BeginSeq;
        for (auto f : v.fields) e << to_string(f);
        e << YAML::EndSeq;
      }
      if (v.repartition_partitions > 0)
        e << YAML::Key << "repartition_partitions" << YAML::Value << v.repartition_partitions;
      e << YAML::Key << "replication_factor" << YAML::Value << v.replication_factor;
      if (!v.changelog_configs.empty()) {
        e << YAML::Key << "changelog_configs" << YAML::Value << YAML::BeginMap;
        for (const auto& [k, val] : v.changelog_configs) e << YAML::Key << k << YAML::Value << val;
        e << YAML::EndMap;
      }
      e << YAML::Key << "cache" << YAML::Value << v.cache;
      if (v.window) {
        e << YAML::Key << "window" << YAML::Value << YAML::BeginMap << YAML::Key << "type" << YAML::Value
          << to_string(v.window->type);
        if (is_session(*v.window))
          e << YAML::Key << "inactivity_gap" << YAML::Value << std::to_string(v.window->gap_ms) + "ms";
        else
          e << YAML::Key << "size" << YAML::Value << std::to_string(v.window->size_ms) + "ms" << YAML::Key << "advance"
            << YAML::Value << std::to_string(v.window->advance_ms) + "ms";
        e << YAML::Key << "grace" << YAML::Value << std::to_string(v.window->grace_ms) + "ms" << YAML::Key
          << "retention" << YAML::Value << std::to_string(v.window->retention_ms) + "ms" << YAML::Key << "max_future"
          << YAML::Value << std::to_string(v.window->max_future_ms) + "ms";
        if (!v.window->time_field.empty()) e << YAML::Key << "time_field" << YAML::Value << v.window->time_field;
        e << YAML::EndMap;
      }
    }
    e << YAML::EndMap;
  }
  e << YAML::EndSeq << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace kstate::server
