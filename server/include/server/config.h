#pragma once
// app_config: the whole configuration of one kstate process, parsed and validated once
// at start from YAML. Every error names the offending key and, where the value is one
// of a set, the allowed values.

#include <string>
#include <vector>

#include "core/status.h"
#include "core/view.h"
#include "ingest/engine.h"
#include "server/api.h"
#include "server/cors.h"
#include "http/server.h"
#include "storage/db.h"

namespace kstate::server {

// Who may read what over HTTP (docs/security.md).
struct auth_config {
  // Token file (hashes and scopes, see server/auth.h). Empty: no authentication, every
  // route is open. Re-read when it changes.
  std::string token_file;
  // /metrics open to anyone (true) or only to tokens with the metrics scope (false).
  // Default false. Without a token file /metrics is always open.
  bool open_metrics = false;
};

// Partitions taken over without their state are copied from another instance of the
// group that holds them (the `peer_bootstrap:` section, docs/cluster.md#bootstrap-from-peers).
struct bootstrap_config {
  // Copy partitions from other instances at all.
  bool enabled = true;
  // A partition is copied when this instance holds none of its state, or when another
  // instance's copy is at least this many offsets ahead of it; closer than that, Kafka
  // is read instead.
  int64_t min_offsets = 10'000;
  // Longest time all the copies of one assignment may take together; partitions not
  // copied by then are rebuilt from Kafka. Keep it well below max.poll.interval.ms.
  std::chrono::milliseconds timeout{120'000};
  // Longest wait for one page of a copy.
  std::chrono::milliseconds page_timeout{30'000};
};

struct app_config {
  // Consumer group id, and prefix of the topics kstate creates. Required.
  std::string application_id;
  // Kafka bootstrap servers. Required.
  std::string bootstrap_servers;
  // Directory of the RocksDB state. Default "./kstate-state".
  std::string state_dir = "./kstate-state";
  // The HTTP endpoint other instances and clients use to reach this one. Default:
  // derived from http.listen ("http://<listen address>:<port>").
  std::string advertised_endpoint;

  // Standby copies kept of each partition by the instances after its owner (0-9).
  // Default 0.
  int standby_replicas = 0;

  // After SIGTERM, how long /readyz answers 503 while requests are still served, so load
  // balancers stop sending traffic before connections close. Milliseconds. Default 0.
  std::chrono::milliseconds drain_delay{0};
  // Idle keep-alive connections kept open to each other instance for forwarded requests
  // and parts (http.peer_connections). Below the number of requests forwarded at once,
  // connections would be opened and closed at the rate of requests.
  std::size_t peer_connections = 64;
  // How forwarded requests to one owner ride together (http.peer_batch).
  peer_batch_config peer_batch;
  bootstrap_config bootstrap;

  // Directory of the built dashboard (web/dist), served at /ui/. Empty: no dashboard.
  std::string ui_dir;

  kstate::http::server_config http;
  // Whether the instance answers HTTP at all (the REST API, probes, metrics, the
  // dashboard, other instances' forwarded requests). Not a YAML key: the server always
  // does; an application embedding kstate may not (docs/embedding.md), and is then
  // reachable by no other instance. Default true.
  bool serve_http = true;
  // CA bundle (PEM) that other instances' certificates are checked against when
  // forwarding over TLS (http.tls.peer_ca_file). Empty: http.tls.client_ca_file if set,
  // else the system's trusted CAs.
  std::string peer_ca_file;
  auth_config auth;
  // File holding the secret the instances of the group sign their requests to each
  // other with (first line, at least 16 bytes; the same on every instance). Empty: the
  // group's secret kept in Kafka (ingest/group_secret.h).
  std::string peer_secret_file;
  // How many min_position waits may be pending, and their bytes (query.max_waiting_*).
  query::freshness_config waits;
  // Browsers' cross-origin requests (http.cors); off by default.
  cors_config cors;
  api_config query;
  ingest::ingest_config ingest;
  storage::db_options rocksdb;
  std::vector<view_def> views;
};

// One override of a configuration key, by dotted path: "http.listen", "views.0.topic",
// "rocksdb.stores.users.compression", "kafka.sasl.password" (everything after "kafka."
// is the librdkafka property name).
struct config_override {
  std::string path;
  std::string value;
  std::string origin;  // where it came from, for error messages ("KSTATE_HTTP__LISTEN", "--set")
};

// The overrides the environment holds: KSTATE_<PATH>, with "__" between path segments,
// segments lower-cased (a store name after STORES is kept as written), and in a kafka
// property name "_" standing for "." — e.g. KSTATE_HTTP__LISTEN=0.0.0.0:8080,
// KSTATE_KAFKA__SASL_PASSWORD=..., KSTATE_VIEWS__0__TOPIC=orders. Variables whose first
// segment is not a top-level key (such as the scripts' KSTATE_KAFKA_RUN) are ignored.
std::vector<config_override> overrides_from_env(char** envp);

// Parses YAML text, then applies `overrides` in order (later ones win), then validates.
// Precedence is the caller's order: file < environment < flags.
result<app_config> parse_config(const std::string& yaml_text, const std::string& source = "config",
                                const std::vector<config_override>& overrides = {});
result<app_config> load_config(const std::string& path, const std::vector<config_override>& overrides = {});

// The effective configuration as YAML, with secrets (sasl.password, ssl.*password,
// ssl.key.pem, anything containing "secret") redacted.
std::string render_config(const app_config& cfg);

}  // namespace kstate::server
