#include "server/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <regex>
#include <map>
#include <set>
#include <sstream>

namespace kstate::server {
namespace {

// Thrown inside the parser, turned into a status at the edge.
struct config_error {
  std::string key;
  std::string message;
};

[[noreturn]] void fail(const std::string& key, const std::string& message) { throw config_error{key, message}; }

void check_keys(const YAML::Node& node, const std::string& where, const std::set<std::string>& allowed) {
  if (!node.IsMap()) fail(where, "must be a mapping");
  for (const auto& kv : node) {
    auto k = kv.first.as<std::string>();
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(where.empty() ? k : where + "." + k, "unknown key (allowed: " + list + ")");
    }
  }
}

std::string get_string(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(key, "must be a string");
  return n.as<std::string>();
}

template <typename T>
T get_number(const YAML::Node& n, const std::string& key, T min, T max) {
  if (!n.IsScalar()) fail(key, "must be a number");
  T v{};
  try {
    v = n.as<T>();
  } catch (const YAML::Exception&) {
    fail(key, "must be a number (got '" + n.Scalar() + "')");
  }
  if (v < min || v > max)
    fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + " (got " + n.Scalar() + ")");
  return v;
}

void parse_listen(const std::string& s, http_config& http) {
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

view_def parse_view(const YAML::Node& n, const std::string& where) {
  check_keys(n, where, {"name", "kind", "topic", "key_format", "value_format", "partitioner", "dead_letter_topic"});
  view_def v;
  if (!n["name"]) fail(where + ".name", "is required");
  v.name = get_string(n["name"], where + ".name");
  if (!std::regex_match(v.name, name_pattern()))
    fail(where + ".name", "must match [A-Za-z0-9][A-Za-z0-9._-]* (got '" + v.name + "')");
  std::string kind = n["kind"] ? get_string(n["kind"], where + ".kind") : "table";
  if (kind != "table") fail(where + ".kind", "must be one of: table (got '" + kind + "')");
  if (!n["topic"]) fail(where + ".topic", "is required");
  v.topic = get_string(n["topic"], where + ".topic");
  if (v.topic.empty()) fail(where + ".topic", "must not be empty");
  auto format = [&](const char* key, data_format& out) {
    if (!n[key]) return;
    auto s = get_string(n[key], where + "." + key);
    if (!parse_data_format(s, out)) fail(where + "." + key, "must be one of: string, json, bytes (got '" + s + "')");
  };
  format("key_format", v.key_format);
  format("value_format", v.value_format);
  if (n["partitioner"]) {
    v.partitioner = get_string(n["partitioner"], where + ".partitioner");
    if (v.partitioner != "murmur2" && v.partitioner != "consistent" && v.partitioner != "fnv1a")
      fail(where + ".partitioner", "must be one of: murmur2, consistent, fnv1a (got '" + v.partitioner + "')");
  }
  if (n["dead_letter_topic"]) v.dead_letter_topic = get_string(n["dead_letter_topic"], where + ".dead_letter_topic");
  return v;
}

app_config parse(const YAML::Node& root) {
  app_config c;
  if (!root || root.IsNull()) fail("", "the configuration is empty");
  check_keys(root, "", {"application_id", "bootstrap_servers", "state_dir", "advertised_endpoint", "http", "ingest",
                        "rocksdb", "kafka", "views", "query"});
  if (!root["application_id"]) fail("application_id", "is required");
  c.application_id = get_string(root["application_id"], "application_id");
  if (!std::regex_match(c.application_id, name_pattern()))
    fail("application_id", "must match [A-Za-z0-9][A-Za-z0-9._-]* (got '" + c.application_id + "')");
  if (!root["bootstrap_servers"]) fail("bootstrap_servers", "is required");
  c.bootstrap_servers = get_string(root["bootstrap_servers"], "bootstrap_servers");
  if (root["state_dir"]) c.state_dir = get_string(root["state_dir"], "state_dir");
  if (root["advertised_endpoint"]) c.advertised_endpoint = get_string(root["advertised_endpoint"], "advertised_endpoint");

  if (auto h = root["http"]) {
    check_keys(h, "http", {"listen", "threads", "max_header_bytes", "max_body_bytes", "max_target_bytes",
                           "read_timeout_ms", "shutdown_grace_ms"});
    if (h["listen"]) parse_listen(get_string(h["listen"], "http.listen"), c.http);
    if (h["threads"]) c.http.threads = get_number<int>(h["threads"], "http.threads", 1, 256);
    if (h["max_header_bytes"])
      c.http.max_header_bytes = get_number<uint32_t>(h["max_header_bytes"], "http.max_header_bytes", 1024, 1u << 24);
    if (h["max_body_bytes"])
      c.http.max_body_bytes = get_number<uint64_t>(h["max_body_bytes"], "http.max_body_bytes", 0, 1ull << 32);
    if (h["max_target_bytes"])
      c.http.max_target_bytes = get_number<uint32_t>(h["max_target_bytes"], "http.max_target_bytes", 256, 1u << 20);
    if (h["read_timeout_ms"])
      c.http.read_timeout = std::chrono::milliseconds(get_number<int64_t>(h["read_timeout_ms"], "http.read_timeout_ms", 10, 3'600'000));
    if (h["shutdown_grace_ms"])
      c.http.shutdown_grace = std::chrono::milliseconds(get_number<int64_t>(h["shutdown_grace_ms"], "http.shutdown_grace_ms", 0, 600'000));
  }
  if (auto i = root["ingest"]) {
    check_keys(i, "ingest", {"max_batch_records", "max_batch_delay_ms", "commit_interval_ms", "startup_timeout_ms", "client_id"});
    if (i["max_batch_records"])
      c.ingest.max_batch_records = get_number<int>(i["max_batch_records"], "ingest.max_batch_records", 1, 1'000'000);
    if (i["max_batch_delay_ms"])
      c.ingest.max_batch_delay = std::chrono::milliseconds(get_number<int64_t>(i["max_batch_delay_ms"], "ingest.max_batch_delay_ms", 0, 60'000));
    if (i["commit_interval_ms"])
      c.ingest.commit_interval = std::chrono::milliseconds(get_number<int64_t>(i["commit_interval_ms"], "ingest.commit_interval_ms", 10, 3'600'000));
    if (i["startup_timeout_ms"])
      c.ingest.startup_timeout = std::chrono::milliseconds(get_number<int64_t>(i["startup_timeout_ms"], "ingest.startup_timeout_ms", 100, 3'600'000));
    if (i["client_id"]) c.ingest.client_id = get_string(i["client_id"], "ingest.client_id");
  }
  if (auto q = root["query"]) {
    check_keys(q, "query", {"default_limit", "max_limit", "max_batch_keys", "max_concurrent_scans",
                            "exact_count_limit", "default_wait_ms", "max_wait_ms"});
    if (q["max_limit"]) c.query.max_limit = get_number<uint32_t>(q["max_limit"], "query.max_limit", 1, 1'000'000);
    if (q["default_limit"])
      c.query.default_limit = get_number<uint32_t>(q["default_limit"], "query.default_limit", 1, c.query.max_limit);
    if (c.query.default_limit > c.query.max_limit)
      fail("query.default_limit", "must not exceed query.max_limit (" + std::to_string(c.query.max_limit) + ")");
    if (q["max_batch_keys"])
      c.query.max_batch_keys = get_number<uint32_t>(q["max_batch_keys"], "query.max_batch_keys", 1, 100'000);
    if (q["max_concurrent_scans"])
      c.query.max_concurrent_scans = get_number<uint32_t>(q["max_concurrent_scans"], "query.max_concurrent_scans", 1, 10'000);
    if (q["exact_count_limit"])
      c.query.exact_count_limit = get_number<uint64_t>(q["exact_count_limit"], "query.exact_count_limit", 0, 1ull << 40);
    if (q["max_wait_ms"])
      c.query.max_wait = std::chrono::milliseconds(get_number<int64_t>(q["max_wait_ms"], "query.max_wait_ms", 0, 3'600'000));
    if (q["default_wait_ms"])
      c.query.default_wait = std::chrono::milliseconds(
          get_number<int64_t>(q["default_wait_ms"], "query.default_wait_ms", 0, c.query.max_wait.count()));
    if (c.query.default_wait > c.query.max_wait)
      fail("query.default_wait_ms", "must not exceed query.max_wait_ms (" + std::to_string(c.query.max_wait.count()) + ")");
  }
  if (auto r = root["rocksdb"]) {
    check_keys(r, "rocksdb", {"block_cache_mb", "write_buffer_mb", "max_write_buffers", "bloom_bits_per_key",
                              "max_background_jobs", "compression"});
    if (r["block_cache_mb"]) c.rocksdb.block_cache_bytes = get_number<uint64_t>(r["block_cache_mb"], "rocksdb.block_cache_mb", 1, 1 << 20) << 20;
    if (r["write_buffer_mb"]) c.rocksdb.write_buffer_bytes = get_number<uint64_t>(r["write_buffer_mb"], "rocksdb.write_buffer_mb", 1, 1 << 16) << 20;
    if (r["max_write_buffers"]) c.rocksdb.max_write_buffers = get_number<int>(r["max_write_buffers"], "rocksdb.max_write_buffers", 2, 64);
    if (r["bloom_bits_per_key"]) c.rocksdb.bloom_bits_per_key = get_number<int>(r["bloom_bits_per_key"], "rocksdb.bloom_bits_per_key", 0, 64);
    if (r["max_background_jobs"]) c.rocksdb.max_background_jobs = get_number<int>(r["max_background_jobs"], "rocksdb.max_background_jobs", 1, 64);
    if (r["compression"]) {
      c.rocksdb.compression = get_string(r["compression"], "rocksdb.compression");
      static const std::set<std::string> ok{"none", "snappy", "lz4", "zstd"};
      if (!ok.count(c.rocksdb.compression))
        fail("rocksdb.compression", "must be one of: none, snappy, lz4, zstd (got '" + c.rocksdb.compression + "')");
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
          {"enable.idempotence", "dead letters are produced idempotently"}};
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
    c.views.push_back(std::move(v));
  }

  c.ingest.bootstrap_servers = c.bootstrap_servers;
  c.ingest.application_id = c.application_id;
  c.rocksdb.path = c.state_dir;
  return c;
}

bool is_secret(const std::string& key) {
  return key.find("password") != std::string::npos || key.find("secret") != std::string::npos ||
         key == "ssl.key.pem" || key == "sasl.oauthbearer.config";
}

}  // namespace

result<app_config> parse_config(const std::string& yaml_text, const std::string& source) {
  try {
    return parse(YAML::Load(yaml_text));
  } catch (const config_error& e) {
    return invalid_argument(source + ": " + (e.key.empty() ? "" : e.key + ": ") + e.message);
  } catch (const YAML::Exception& e) {
    return invalid_argument(source + ": invalid YAML: " + e.what());
  }
}

result<app_config> load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path);
}

std::string render_config(const app_config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "application_id" << YAML::Value << c.application_id;
  e << YAML::Key << "bootstrap_servers" << YAML::Value << c.bootstrap_servers;
  e << YAML::Key << "state_dir" << YAML::Value << c.state_dir;
  e << YAML::Key << "advertised_endpoint" << YAML::Value << c.advertised_endpoint;
  e << YAML::Key << "http" << YAML::Value << YAML::BeginMap
    << YAML::Key << "listen" << YAML::Value << (c.http.listen_address + ":" + std::to_string(c.http.port))
    << YAML::Key << "threads" << YAML::Value << c.http.threads
    << YAML::Key << "max_header_bytes" << YAML::Value << c.http.max_header_bytes
    << YAML::Key << "max_body_bytes" << YAML::Value << c.http.max_body_bytes
    << YAML::Key << "max_target_bytes" << YAML::Value << c.http.max_target_bytes
    << YAML::Key << "read_timeout_ms" << YAML::Value << c.http.read_timeout.count()
    << YAML::Key << "shutdown_grace_ms" << YAML::Value << c.http.shutdown_grace.count() << YAML::EndMap;
  e << YAML::Key << "query" << YAML::Value << YAML::BeginMap
    << YAML::Key << "default_limit" << YAML::Value << c.query.default_limit
    << YAML::Key << "max_limit" << YAML::Value << c.query.max_limit
    << YAML::Key << "max_batch_keys" << YAML::Value << c.query.max_batch_keys
    << YAML::Key << "max_concurrent_scans" << YAML::Value << c.query.max_concurrent_scans
    << YAML::Key << "exact_count_limit" << YAML::Value << c.query.exact_count_limit
    << YAML::Key << "default_wait_ms" << YAML::Value << c.query.default_wait.count()
    << YAML::Key << "max_wait_ms" << YAML::Value << c.query.max_wait.count() << YAML::EndMap;
  e << YAML::Key << "ingest" << YAML::Value << YAML::BeginMap
    << YAML::Key << "max_batch_records" << YAML::Value << c.ingest.max_batch_records
    << YAML::Key << "max_batch_delay_ms" << YAML::Value << c.ingest.max_batch_delay.count()
    << YAML::Key << "commit_interval_ms" << YAML::Value << c.ingest.commit_interval.count()
    << YAML::Key << "startup_timeout_ms" << YAML::Value << c.ingest.startup_timeout.count()
    << YAML::Key << "client_id" << YAML::Value << c.ingest.client_id << YAML::EndMap;
  e << YAML::Key << "rocksdb" << YAML::Value << YAML::BeginMap
    << YAML::Key << "block_cache_mb" << YAML::Value << (c.rocksdb.block_cache_bytes >> 20)
    << YAML::Key << "write_buffer_mb" << YAML::Value << (c.rocksdb.write_buffer_bytes >> 20)
    << YAML::Key << "max_write_buffers" << YAML::Value << c.rocksdb.max_write_buffers
    << YAML::Key << "bloom_bits_per_key" << YAML::Value << c.rocksdb.bloom_bits_per_key
    << YAML::Key << "max_background_jobs" << YAML::Value << c.rocksdb.max_background_jobs
    << YAML::Key << "compression" << YAML::Value << c.rocksdb.compression << YAML::EndMap;
  e << YAML::Key << "kafka" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : c.ingest.kafka) e << YAML::Key << k << YAML::Value << (is_secret(k) ? "[redacted]" : v);
  e << YAML::EndMap;
  e << YAML::Key << "views" << YAML::Value << YAML::BeginSeq;
  for (const auto& v : c.views) {
    e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << v.name
      << YAML::Key << "kind" << YAML::Value << to_string(v.kind)
      << YAML::Key << "topic" << YAML::Value << v.topic
      << YAML::Key << "key_format" << YAML::Value << to_string(v.key_format)
      << YAML::Key << "value_format" << YAML::Value << to_string(v.value_format)
      << YAML::Key << "partitioner" << YAML::Value << v.partitioner;
    if (!v.dead_letter_topic.empty()) e << YAML::Key << "dead_letter_topic" << YAML::Value << v.dead_letter_topic;
    e << YAML::EndMap;
  }
  e << YAML::EndSeq << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace kstate::server
