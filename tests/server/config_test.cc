#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "server/config.h"

using namespace kstate;
using namespace kstate::server;

namespace {
const char* minimal = R"(
application_id: app
bootstrap_servers: 127.0.0.1:9092
views:
  - name: users
    topic: users
)";
}

TEST_CASE("a minimal config gets the documented defaults") {
  auto c = parse_config(minimal);
  REQUIRE(c.ok());
  CHECK(c->application_id == "app");
  CHECK(c->ingest.application_id == "app");
  CHECK(c->ingest.bootstrap_servers == "127.0.0.1:9092");
  CHECK(c->rocksdb.path == "./kstate-state");
  CHECK(c->http.port == 8080);
  REQUIRE(c->views.size() == 1);
  CHECK(c->views[0].kind == view_kind::table);
  CHECK(c->views[0].key_format == data_format::string);
  CHECK(c->views[0].value_format == data_format::json);
  CHECK(c->views[0].partitioner == "murmur2");
}

TEST_CASE("every field is read") {
  auto c = parse_config(R"(
application_id: app-1
bootstrap_servers: a:1,b:2
state_dir: /tmp/x
http: {listen: "0.0.0.0:9000", threads: 4, max_header_bytes: 4096, max_body_bytes: 10, read_timeout_ms: 500}
ingest: {max_batch_records: 7, max_batch_delay_ms: 3, commit_interval_ms: 20}
rocksdb: {block_cache_mb: 32, compression: zstd}
kafka: {security.protocol: SASL_SSL, sasl.password: hunter2}
views:
  - {name: a, topic: ta, key_format: bytes, value_format: string, partitioner: fnv1a, dead_letter_topic: dlq}
)");
  REQUIRE(c.ok());
  CHECK(c->http.listen_address == "0.0.0.0");
  CHECK(c->http.port == 9000);
  CHECK(c->http.threads == 4);
  CHECK(c->http.read_timeout.count() == 500);
  CHECK(c->ingest.max_batch_records == 7);
  CHECK(c->rocksdb.block_cache_bytes == 32ull << 20);
  CHECK(c->rocksdb.path == "/tmp/x");
  CHECK(c->ingest.kafka.at("security.protocol") == "SASL_SSL");
  CHECK(c->views[0].key_format == data_format::bytes);
  CHECK(c->views[0].dead_letter_topic == "dlq");
  auto rendered = render_config(*c);
  CHECK(rendered.find("hunter2") == std::string::npos);
  CHECK(rendered.find("[redacted]") != std::string::npos);
  // The rendering is itself a valid config describing the same thing.
  auto again = parse_config(rendered);
  REQUIRE(again.ok());
  CHECK(again->views[0].partitioner == "fnv1a");
}

TEST_CASE("invalid configs: one clear error naming the key") {
  struct row { const char* yaml; const char* expected; };
  const row rows[] = {
      {"", "empty"},
      {"application_id: a\nviews: [{name: v, topic: t}]", "bootstrap_servers: is required"},
      {"bootstrap_servers: b\nviews: [{name: v, topic: t}]", "application_id: is required"},
      {"application_id: a\nbootstrap_servers: b", "views: is required"},
      {"application_id: a\nbootstrap_servers: b\nviews: []", "views: is required"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v}]", "views[0].topic: is required"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{topic: t}]", "views[0].name: is required"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, value_format: xml}]",
       "views[0].value_format: must be one of: string, json, bytes (got 'xml')"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, kind: count}]", "views[0].kind: must be one of: table"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, partitioner: random}]",
       "views[0].partitioner: must be one of: murmur2, consistent, fnv1a"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t}, {name: v, topic: u}]",
       "views[1].name: duplicate view name 'v'"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: 'a/b', topic: t}]", "views[0].name: must match"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, colour: red}]", "views[0].colour: unknown key"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {listen: nowhere}\nviews: [{name: v, topic: t}]", "http.listen: must be host:port"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {listen: 'h:99999'}\nviews: [{name: v, topic: t}]", "http.listen: must be between 0 and 65535"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {threads: 0}\nviews: [{name: v, topic: t}]", "http.threads: must be between 1 and 256"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {threads: many}\nviews: [{name: v, topic: t}]", "http.threads: must be a number"},
      {"application_id: a\nbootstrap_servers: b\nrocksdb: {compression: gzip}\nviews: [{name: v, topic: t}]",
       "rocksdb.compression: must be one of: none, snappy, lz4, zstd (got 'gzip')"},
      {"application_id: a\nbootstrap_servers: b\nkafka: {group.id: x}\nviews: [{name: v, topic: t}]", "kafka.group.id: is set by kstate"},
      {"application_id: a\nbootstrap_servers: b\nkafka: {auto.offset.reset: latest}\nviews: [{name: v, topic: t}]", "kafka.auto.offset.reset: is set by kstate"},
      {"application_id: a\nbootstrap_servers: b\nunknown: 1\nviews: [{name: v, topic: t}]", "unknown: unknown key"},
      {"application_id: [a\n", "invalid YAML"},
  };
  for (const auto& r : rows) {
    INFO(std::string(r.yaml));
    auto c = parse_config(r.yaml, "test.yaml");
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == status_code::invalid_argument);
    INFO(c.error().message());
    CHECK(c.error().message().find(r.expected) != std::string::npos);
    CHECK(c.error().message().rfind("test.yaml: ", 0) == 0);
  }
}
