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
#include "server/http_server.h"
#include "storage/db.h"

namespace kstate::server {

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

  http_config http;
  api_config query;
  ingest::ingest_config ingest;
  storage::db_options rocksdb;
  std::vector<view_def> views;
};

// Parses YAML text. `source` names the file in error messages.
result<app_config> parse_config(const std::string& yaml_text, const std::string& source = "config");
result<app_config> load_config(const std::string& path);

// The effective configuration as YAML, with secrets (sasl.password, ssl.*password,
// ssl.key.pem, anything containing "secret") redacted.
std::string render_config(const app_config& cfg);

}  // namespace kstate::server
