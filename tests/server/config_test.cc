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
  CHECK(c->peer_connections == 64);
  CHECK(c->peer_batch.max_in_flight == 2);
  CHECK(c->peer_batch.max_requests == 64);
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
http: {listen: "0.0.0.0:9000", threads: 4, max_header_bytes: 4096, max_body_bytes: 10, read_timeout_ms: 500,
       peer_connections: 200, peer_batch: {max_in_flight: 0, max_requests: 300}}
ingest: {max_batch_records: 7, max_batch_delay_ms: 3, commit_interval_ms: 20}
rocksdb: {block_cache_mb: 32, compression: zstd, window_expiry_interval_ms: 60000, verify_files_interval_ms: 5000}
kafka: {security.protocol: SASL_SSL, sasl.password: hunter2}
views:
  - {name: a, topic: ta, key_format: bytes, value_format: string, partitioner: fnv1a, dead_letter_topic: dlq}
)");
  REQUIRE(c.ok());
  CHECK(c->http.listen_address == "0.0.0.0");
  CHECK(c->http.port == 9000);
  CHECK(c->http.threads == 4);
  CHECK(c->http.read_timeout.count() == 500);
  CHECK(c->peer_connections == 200);
  CHECK(c->peer_batch.max_in_flight == 0);
  CHECK(c->peer_batch.max_requests == 300);
  CHECK(c->ingest.max_batch_records == 7);
  CHECK(c->rocksdb.block_cache_bytes == 32ull << 20);
  CHECK(c->rocksdb.path == "/tmp/x");
  CHECK(c->rocksdb.window_expiry_interval_ms == 60000);
  CHECK(c->rocksdb.verify_files_interval_ms == 5000);
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
  CHECK(again->peer_connections == 200);
  CHECK(again->peer_batch.max_in_flight == 0);
  CHECK(again->peer_batch.max_requests == 300);
}

TEST_CASE("invalid configs: one clear error naming the key") {
  struct row {
    const char* yaml;
    const char* expected;
  };
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
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, kind: median}]",
       "views[0].kind: must be one of: table, count, sum, reduce, aggregate, join (got 'median')"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, partitioner: random}]",
       "views[0].partitioner: must be one of: murmur2, consistent, fnv1a"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t}, {name: v, topic: u}]",
       "views[1].name: duplicate view name 'v'"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: 'a/b', topic: t}]", "views[0].name: must match"},
      {"application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t, colour: red}]",
       "views[0].colour: unknown key"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {listen: nowhere}\nviews: [{name: v, topic: t}]",
       "http.listen: must be host:port"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {listen: 'h:99999'}\nviews: [{name: v, topic: t}]",
       "http.listen: must be between 0 and 65535"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {threads: 0}\nviews: [{name: v, topic: t}]",
       "http.threads: must be between 1 and 256"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {peer_connections: 0}\nviews: [{name: v, topic: t}]",
       "http.peer_connections: must be between 1 and 4096"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {peer_batch: {max_requests: 0}}\nviews: [{name: v, topic: t}]",
       "http.peer_batch.max_requests: must be between 1 and 1024"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {peer_batch: {max_in_flight: 1025}}\nviews: [{name: v, topic: "
       "t}]",
       "http.peer_batch.max_in_flight: must be between 0 and 1024"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {peer_batch: {size: 3}}\nviews: [{name: v, topic: t}]",
       "http.peer_batch.size: unknown key"},
      {"application_id: a\nbootstrap_servers: b\nhttp: {threads: many}\nviews: [{name: v, topic: t}]",
       "http.threads: must be a number"},
      {"application_id: a\nbootstrap_servers: b\nrocksdb: {compression: gzip}\nviews: [{name: v, topic: t}]",
       "rocksdb.compression: must be one of: none, snappy, lz4, zstd (got 'gzip')"},
      {"application_id: a\nbootstrap_servers: b\nkafka: {group.id: x}\nviews: [{name: v, topic: t}]",
       "kafka.group.id: is set by kstate"},
      {"application_id: a\nbootstrap_servers: b\nkafka: {auto.offset.reset: latest}\nviews: [{name: v, topic: t}]",
       "kafka.auto.offset.reset: is set by kstate"},
      {"application_id: a\nbootstrap_servers: b\nunknown: 1\nviews: [{name: v, topic: t}]", "unknown: unknown key"},
      {"application_id: [a\n", "invalid YAML"},
      {"application_id: a\nbootstrap_servers: b\ningest: {commit_interval_ms: 200}\ningest: {max_batch_records: "
       "5}\nviews: [{name: v, topic: t}]",
       "ingest: given twice in one mapping (again on line 4)"},
      {"application_id: a\nbootstrap_servers: b\nviews:\n  - {name: v, topic: t, name: w}",
       "views[0].name: given twice"},
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

TEST_CASE("environment mapping: KSTATE_<PATH> with __ between segments; unrelated KSTATE_ variables ignored") {
  std::vector<std::string> env_strings{"KSTATE_HTTP__LISTEN=0.0.0.0:9999",
                                       "KSTATE_APPLICATION_ID=from-env",
                                       "KSTATE_KAFKA__SASL_PASSWORD=s3cret",
                                       "KSTATE_VIEWS__0__TOPIC=orders",
                                       "KSTATE_ROCKSDB__STORES__Users__COMPRESSION=zstd",
                                       "KSTATE_KAFKA_RUN=/tmp/run",  // a script's variable, not configuration
                                       "KSTATE_BOOTSTRAP=127.0.0.1:1",
                                       "PATH=/usr/bin"};
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  auto o = overrides_from_env(envp.data());
  std::map<std::string, std::string> got;
  for (const auto& x : o) got[x.path] = x.value;
  std::map<std::string, std::string> want{{"http.listen", "0.0.0.0:9999"},
                                          {"application_id", "from-env"},
                                          {"kafka.sasl.password", "s3cret"},
                                          {"views.0.topic", "orders"},
                                          {"rocksdb.stores.Users.compression", "zstd"}};
  CHECK(got == want);
}

TEST_CASE("precedence: flag > environment > file > default, one row per layer") {
  const char* file = R"(
application_id: from-file
bootstrap_servers: b
http: {threads: 3}
views: [{name: v, topic: t}]
)";
  struct row {
    std::vector<config_override> overrides;  // environment first, then flags, as main() orders them
    std::string application_id;
    int threads;
    std::string listen_address;
  };
  const row rows[] = {
      {{}, "from-file", 3, "127.0.0.1"},                                                        // file, defaults
      {{{"application_id", "from-env", "KSTATE_APPLICATION_ID"}}, "from-env", 3, "127.0.0.1"},  // env over file
      {{{"application_id", "from-env", "KSTATE_APPLICATION_ID"}, {"application_id", "from-flag", "--set"}},
       "from-flag",
       3,
       "127.0.0.1"},  // flag over env
      {{{"http.threads", "7", "KSTATE_HTTP__THREADS"}}, "from-file", 7, "127.0.0.1"},
      {{{"http.listen", "0.0.0.0:1", "--listen"}}, "from-file", 3, "0.0.0.0"},  // over a default
  };
  for (const auto& r : rows) {
    auto c = parse_config(file, "f.yaml", r.overrides);
    REQUIRE(c.ok());
    CHECK(c->application_id == r.application_id);
    CHECK(c->http.threads == r.threads);
    CHECK(c->http.listen_address == r.listen_address);
  }
  auto k = parse_config(file, "f.yaml", {{"kafka.fetch.wait.max.ms", "50", "-X"}});
  REQUIRE(k.ok());
  CHECK(k->ingest.kafka.at("fetch.wait.max.ms") == "50");
}

TEST_CASE("override and kafka property errors name the key") {
  const char* file = "application_id: a\nbootstrap_servers: b\nviews: [{name: v, topic: t}]\n";
  struct row {
    config_override o;
    const char* expected;
  };
  const row rows[] = {
      {{"http.threads", "zero", "KSTATE_HTTP__THREADS"}, "http.threads: must be a number"},
      {{"http.colour", "red", "--set"}, "http.colour: unknown key"},
      {{"nonsense", "1", "--set"}, "nonsense: unknown key (from --set)"},
      {{"views.3.topic", "x", "KSTATE_VIEWS__3__TOPIC"}, "there is no view 3"},
      {{"kafka.no.such.property", "1", "-X"}, "kafka.no.such.property"},
      {{"kafka.session.timeout.ms", "soon", "-X"}, "kafka.session.timeout.ms"},
      {{"rocksdb.stores.v.compression", "gzip", "--set"}, "rocksdb.stores.v.compression: must be one of"},
      {{"rocksdb.stores.w.compression", "lz4", "--set"}, "rocksdb.stores.w: names no configured view"},
  };
  for (const auto& r : rows) {
    auto c = parse_config(file, "f.yaml", {r.o});
    INFO(r.o.path);
    REQUIRE_FALSE(c.ok());
    INFO(c.error().message());
    CHECK(c.error().message().find(r.expected) != std::string::npos);
  }
}

TEST_CASE("auth: token file and metrics access are read; a bad metrics value names the key") {
  auto c = parse_config(std::string(minimal) + "auth: {token_file: /etc/kstate/tokens.yaml, metrics: open}\n");
  REQUIRE(c.ok());
  CHECK(c->auth.token_file == "/etc/kstate/tokens.yaml");
  CHECK(c->auth.open_metrics);
  auto d = parse_config(minimal);
  REQUIRE(d.ok());
  CHECK(d->auth.token_file.empty());
  CHECK_FALSE(d->auth.open_metrics);
  auto bad = parse_config(std::string(minimal) + "auth: {metrics: public}\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("auth.metrics: must be one of: open, token") != std::string::npos);
  auto unknown = parse_config(std::string(minimal) + "auth: {tokens: x}\n");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message().find("auth.tokens: unknown key") != std::string::npos);
  // The rendering keeps the auth section.
  auto again = parse_config(render_config(*c));
  REQUIRE(again.ok());
  CHECK(again->auth.token_file == "/etc/kstate/tokens.yaml");
  CHECK(again->auth.open_metrics);
}

TEST_CASE("http.tls and http.cors are read and checked") {
  auto c =
      parse_config(std::string(minimal) +
                   "http: {tls: {cert_file: s.crt, key_file: s.key, client_ca_file: ca.crt}, "
                   "cors: {allowed_origins: ['https://dash.example.com', 'http://localhost:5173'], max_age_s: 60}}\n");
  REQUIRE(c.ok());
  CHECK(c->http.tls.enabled());
  CHECK(c->http.tls.cert_file == "s.crt");
  CHECK(c->http.tls.client_ca_file == "ca.crt");
  CHECK(c->cors.allowed_origins.size() == 2);
  CHECK(c->cors.max_age_s == 60);
  auto again = parse_config(render_config(*c));
  REQUIRE(again.ok());
  CHECK(again->http.tls.key_file == "s.key");
  CHECK(again->cors.allowed_origins == c->cors.allowed_origins);

  struct row {
    std::string yaml, error;
  };
  const row rows[] = {
      {"http: {tls: {cert_file: s.crt}}", "http.tls.key_file: is required"},
      {"http: {tls: {key_file: s.key}}", "http.tls.cert_file: is required"},
      {"http: {tls: {client_ca_file: ca.crt}}", "need cert_file and key_file"},
      {"http: {tls: {cert_file: a, key_file: b, ciphers: x}}", "http.tls.ciphers: unknown key"},
      {"http: {cors: {allowed_origins: ['*']}}", "'*' is not allowed"},
      {"http: {cors: {allowed_origins: ['https://a.example/path']}}", "must be an origin"},
      // Long enough to overflow the stack in std::regex before the length was checked.
      {"http: {cors: {allowed_origins: ['http://" + std::string(1'000'000, 'a') + "']}}", "at most 267 characters"},
      {"http: {tls: {cert_file: a, key_file: b}}\nadvertised_endpoint: http://h:1", "must start with https://"},
      {"advertised_endpoint: https://h:1", "https:// needs http.tls"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.yaml);
    auto bad = parse_config(std::string(minimal) + r.yaml + "\n");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message().find(r.error) != std::string::npos);
  }
}

TEST_CASE("aggregate views: kinds, group_by, derived topic names") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b
views:
  - {name: wc, kind: count, topic: lines, group_by: words}
  - {name: spend, kind: sum, topic: orders, group_by: {json: user.id}, value: amount, repartition_partitions: 3,
     replication_factor: 1, changelog_configs: {segment.ms: "60000"}, cache: true}
  - {name: hi, kind: reduce, reduce: max, topic: orders}
  - {name: stats, kind: aggregate, topic: orders, fields: [count, sum, mean]}
  - {name: users, topic: users}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  CHECK(c->ingest.exactly_once);
  const auto& wc = c->views[0];
  CHECK(wc.kind == view_kind::count);
  CHECK(wc.group_by == group_by_kind::words);
  CHECK(wc.input_topic() == "lines");
  CHECK(wc.topic == "app-wc-repartition");
  CHECK(wc.repartition_topic == "app-wc-repartition");
  CHECK(wc.changelog_topic == "app-wc-changelog");
  const auto& spend = c->views[1];
  CHECK(spend.group_by == group_by_kind::json);
  CHECK(spend.group_path == "user.id");
  CHECK(spend.value_path == "amount");
  CHECK(spend.repartition_partitions == 3);
  CHECK(spend.cache);
  CHECK(spend.changelog_configs.at("segment.ms") == "60000");
  const auto& hi = c->views[2];
  CHECK(hi.reduce == reduce_op::max);
  CHECK(hi.topic == "orders");  // group_by key: no repartition, the store follows the source
  CHECK(hi.repartition_topic.empty());
  CHECK(hi.changelog_topic == "app-hi-changelog");
  CHECK(c->views[3].fields == std::vector<agg_field>{agg_field::count, agg_field::sum, agg_field::mean});
  CHECK(!c->views[4].is_aggregate());
  CHECK(c->views[4].input_topic() == "users");

  // The rendered config reads back to the same views.
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[1].topic == "app-spend-repartition");
  CHECK(again->views[1].input_topic() == "orders");
  CHECK(again->views[3].fields == c->views[3].fields);

  auto alo = parse_config(
      "application_id: a\nbootstrap_servers: b\nprocessing_guarantee: at_least_once\n"
      "views: [{name: v, kind: count, topic: t}]");
  REQUIRE(alo.ok());
  CHECK_FALSE(alo->ingest.exactly_once);
}

TEST_CASE("invalid aggregate configs: one clear error naming the key") {
  struct row {
    const char* view;
    const char* expected;
  };
  const row rows[] = {
      {"{name: v, topic: t, kind: count, group_by: letters}",
       "views[0].group_by: must be key, words or {json: <path>}"},
      {"{name: v, topic: t, kind: count, group_by: {json: ''}}", "views[0].group_by.json: must be a dotted path"},
      {"{name: v, topic: t, kind: count, group_by: {path: a}}", "views[0].group_by.path: unknown key"},
      {"{name: v, topic: t, kind: sum, group_by: words}", "views[0].group_by: words can only be counted"},
      {"{name: v, topic: t, kind: reduce}", "views[0].reduce: is required for kind reduce"},
      {"{name: v, topic: t, kind: reduce, reduce: median}", "views[0].reduce: must be one of: latest, min, max"},
      {"{name: v, topic: t, kind: sum, reduce: min}", "views[0].reduce: applies to kind reduce only"},
      {"{name: v, topic: t, kind: aggregate, fields: [count, p99]}", "views[0].fields[1]: must be one of"},
      {"{name: v, topic: t, kind: aggregate, fields: [mean]}", "views[0].fields: mean needs count and sum"},
      {"{name: v, topic: t, kind: aggregate, fields: [sum, sum]}", "views[0].fields[1]: duplicate field"},
      {"{name: v, topic: t, kind: count, fields: [sum]}", "views[0].fields: applies to kind aggregate only"},
      {"{name: v, topic: t, group_by: words}", "views[0].group_by: applies to aggregate views only"},
      {"{name: v, topic: t, kind: sum, value: 'a..b'}", "views[0].value: must be a dotted path"},
      {"{name: v, topic: t, kind: count, repartition_partitions: 3}",
       "views[0].repartition_partitions: applies to re-keyed views"},
      {"{name: v, topic: t, kind: count, group_by: words, repartition_partitions: 0}",
       "views[0].repartition_partitions: must be between 1"},
      {"{name: v, topic: t, kind: count, cache: sometimes}", "views[0].cache: must be true or false"},
      {"{name: v, topic: t, kind: count, value_format: string}",
       "views[0].value_format: an aggregate's values are JSON"},
      {"{name: v, topic: t, kind: count, group_by: words, partitioner: fnv1a}", "views[0].partitioner: re-keyed views"},
      {"{name: v, topic: t, kind: count, changelog_configs: {cleanup.policy: delete}}",
       "views[0].changelog_configs.cleanup.policy: must be compact, or compact,delete for a windowed view"},
      {"{name: v, topic: t, kind: count, changelog_configs: {cleanup.policy: 'compact,delete'}}",
       "views[0].changelog_configs.cleanup.policy: may be compact,delete only for a windowed view"},
  };
  for (const auto& r : rows) {
    std::string yaml = std::string("application_id: a\nbootstrap_servers: b\nviews: [") + r.view + "]";
    INFO(yaml);
    auto c = parse_config(yaml, "test.yaml");
    REQUIRE_FALSE(c.ok());
    INFO(c.error().message());
    CHECK(c.error().message().find(r.expected) != std::string::npos);
  }
  auto g = parse_config(
      "application_id: a\nbootstrap_servers: b\nprocessing_guarantee: twice\n"
      "views: [{name: v, topic: t}]",
      "test.yaml");
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().message().find("processing_guarantee: must be one of: exactly_once, at_least_once") !=
        std::string::npos);
  auto iso = parse_config(
      "application_id: a\nbootstrap_servers: b\nkafka: {isolation.level: read_uncommitted}\n"
      "views: [{name: v, kind: count, topic: t}]",
      "test.yaml");
  REQUIRE_FALSE(iso.ok());
  CHECK(iso.error().message().find("kafka.isolation.level: must be read_committed") != std::string::npos);
}

TEST_CASE("max_json_depth: one limit for ingest and the API, 128 by default, 1 to 10000") {
  auto d = parse_config(minimal);
  REQUIRE(d.ok());
  CHECK(d->ingest.max_json_depth == 128);
  CHECK(d->query.max_json_depth == 128);
  for (int depth : {1, 64, 10'000}) {
    auto c = parse_config(std::string(minimal) + "max_json_depth: " + std::to_string(depth) + "\n");
    REQUIRE(c.ok());
    CHECK(c->ingest.max_json_depth == depth);
    CHECK(c->query.max_json_depth == depth);
    auto again = parse_config(render_config(*c));
    REQUIRE(again.ok());
    CHECK(again->ingest.max_json_depth == depth);
  }
  auto env = parse_config(minimal, "config", {{"max_json_depth", "32", "KSTATE_MAX_JSON_DEPTH"}});
  REQUIRE(env.ok());
  CHECK(env->query.max_json_depth == 32);
  for (const char* bad : {"0", "10001", "-1", "deep"}) {
    CAPTURE(bad);
    auto c = parse_config(std::string(minimal) + "max_json_depth: " + bad + "\n", "test.yaml");
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().message().rfind("test.yaml: max_json_depth: must be", 0) == 0);
  }
}

TEST_CASE("window.max_future: a duration, 1d by default, rendered and read back") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b
views:
  - {name: a, kind: count, topic: t, window: {size: 1m}}
  - {name: b, kind: count, topic: t, window: {size: 1m, max_future: 10m}}
  - {name: c, kind: count, topic: t, window: {size: 1m, max_future: 0ms}}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  CHECK(c->views[0].window->max_future_ms == 86'400'000);
  CHECK(c->views[1].window->max_future_ms == 600'000);
  CHECK(c->views[2].window->max_future_ms == 0);
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[1].window->max_future_ms == 600'000);
  CHECK(again->views[2].window->max_future_ms == 0);
  auto bad = parse_config(
      "application_id: a\nbootstrap_servers: b\nviews: [{name: v, kind: count, topic: t, "
      "window: {size: 1m, max_future: soon}}]",
      "test.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("views[0].window.max_future: 'soon' is not a duration") != std::string::npos);
}

TEST_CASE("session windows: inactivity_gap required, size refused, rendered and read back") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b
views:
  - {name: a, kind: count, topic: t, window: {type: session, inactivity_gap: 5m, grace: 30s}}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  const auto& w = *c->views[0].window;
  CHECK(w.type == kstate::window_type::session);
  CHECK(w.gap_ms == 300'000);
  CHECK(w.grace_ms == 30'000);
  CHECK(w.retention_ms == 86'400'000);
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[0].window->type == kstate::window_type::session);
  CHECK(again->views[0].window->gap_ms == 300'000);
  struct row {
    const char* window;
    const char* expected;
  };
  const row rows[] = {
      {"{type: session}", "views[0].window.inactivity_gap: is required for session windows"},
      {"{type: session, inactivity_gap: 0ms}", "views[0].window.inactivity_gap: must be a positive duration"},
      {"{type: session, inactivity_gap: 5m, size: 1m}", "views[0].window.size: sessions have no size"},
      {"{type: session, inactivity_gap: 5m, grace: 1m, retention: 5m}",
       "views[0].window.retention: must be at least inactivity_gap + grace"},
      {"{size: 1m, inactivity_gap: 5m}", "views[0].window.inactivity_gap: only session windows"},
      {"{type: sliding, size: 1m}", "views[0].window.type: must be tumbling, hopping or session"},
  };
  for (const auto& r : rows) {
    auto bad = parse_config(std::string("application_id: a\nbootstrap_servers: b\nviews: [{name: v, kind: count, "
                                        "topic: t, window: ") +
                                r.window + "}]",
                            "test.yaml");
    INFO(r.window);
    REQUIRE_FALSE(bad.ok());
    INFO(bad.error().message());
    CHECK(bad.error().message().find(r.expected) != std::string::npos);
  }
}

TEST_CASE("ttl: a duration and a clock per table view, record_time by default, rendered and read back") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b
views:
  - {name: a, topic: t, ttl: {after: 24h}}
  - {name: b, topic: t, ttl: {after: 1500, clock: ingest_time}}
  - {name: c, topic: t}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  REQUIRE(c->views[0].ttl);
  CHECK(c->views[0].ttl->after_ms == 86'400'000);
  CHECK(c->views[0].ttl->clock == ttl_clock::record_time);
  CHECK(c->views[1].ttl->after_ms == 1500);
  CHECK(c->views[1].ttl->clock == ttl_clock::ingest_time);
  CHECK(!c->views[2].ttl);
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[0].ttl->after_ms == 86'400'000);
  CHECK(again->views[1].ttl->clock == ttl_clock::ingest_time);
  CHECK(!again->views[2].ttl);

  struct row {
    const char* view;
    const char* expected;
  };
  const row rows[] = {
      {"{name: v, topic: t, ttl: 24h}", "views[0].ttl: must be a map: {after: 24h, clock: record_time|ingest_time}"},
      {"{name: v, topic: t, ttl: {clock: ingest_time}}", "views[0].ttl.after: is required"},
      {"{name: v, topic: t, ttl: {after: soon}}", "views[0].ttl.after: 'soon' is not a duration"},
      {"{name: v, topic: t, ttl: {after: 0ms}}", "views[0].ttl.after: must be positive"},
      {"{name: v, topic: t, ttl: {after: 1h, clock: wall}}",
       "views[0].ttl.clock: must be record_time or ingest_time (got 'wall')"},
      {"{name: v, topic: t, ttl: {after: 1h, every: 1m}}", "views[0].ttl.every: unknown key"},
      {"{name: v, topic: t, kind: count, ttl: {after: 1h}}", "views[0].ttl: applies to table views only"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.view);
    auto bad = parse_config(std::string("application_id: a\nbootstrap_servers: b\nviews: [") + r.view + "]", "t.yaml");
    REQUIRE_FALSE(bad.ok());
    CHECK_MESSAGE(bad.error().message().find(r.expected) != std::string::npos, bad.error().message());
  }
}

TEST_CASE("join views: type, inputs, names or select, derived topics; rendered and read back") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b:1
views:
  - {name: orders, topic: orders, partitioner: consistent}
  - {name: oc, kind: join, topic: orders, partitioner: consistent,
     join: {type: left, right: customers, left_name: order, right_name: customer}}
  - name: cities
    kind: join
    topic: orders
    partitioner: consistent
    join:
      right: customers
      select: [{side: left, field: amount}, {side: right, field: address.city, as: city}]
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  const auto& oc = c->views[1];
  CHECK(oc.kind == view_kind::join);
  REQUIRE(oc.join);
  CHECK(oc.join->type == join_type::left);
  CHECK(oc.join->right_topic == "customers");
  CHECK(oc.join->right_partitioner == "consistent");
  CHECK(oc.join->left_name == "order");
  CHECK(oc.join->right_name == "customer");
  CHECK(oc.input_topic() == "orders");
  CHECK(oc.topic == "app-oc-repartition");
  CHECK(oc.repartition_topic == "app-oc-repartition");
  CHECK(oc.changelog_topic == "app-oc-changelog");
  CHECK(oc.partitioner == "consistent");  // routed like its inputs
  const auto& cities = c->views[2];
  CHECK(cities.join->type == join_type::inner);
  REQUIRE(cities.join->select.size() == 2);
  CHECK(!cities.join->select[0].right);
  CHECK(cities.join->select[0].as == "amount");
  CHECK(cities.join->select[1].right);
  CHECK(cities.join->select[1].path == "address.city");
  CHECK(cities.join->select[1].as == "city");
  CHECK(column_family_names(c->views) ==
        std::vector<std::string>{"orders", "oc", "oc#sides", "cities", "cities#sides"});

  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  REQUIRE(again->views.size() == 3);
  CHECK(again->views[1].join->type == join_type::left);
  CHECK(again->views[1].join->left_name == "order");
  CHECK(again->views[1].partitioner == "consistent");
  CHECK(again->views[2].join->select.size() == 2);
  CHECK(again->views[2].join->select[1].as == "city");
}

TEST_CASE("foreign-key joins: path, internal topics, own partitioners; rendered and read back") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b:1
views:
  - {name: customers, topic: customers, partitioner: consistent}
  - {name: oc, kind: join, topic: orders,
     join: {type: left, right: customers, right_partitioner: consistent, foreign_key: customer.id}}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  const auto& oc = c->views[1];
  REQUIRE(oc.join);
  CHECK(oc.is_fk_join());
  CHECK(oc.join->foreign_key == "customer.id");
  CHECK(oc.partitioner == "murmur2");  // the left topic's, not the right one's
  CHECK(oc.join->right_partitioner == "consistent");
  CHECK(oc.topic == "app-oc-repartition");
  CHECK(oc.join->subscription_topic == "app-oc-subscription");
  CHECK(oc.join->subscription_changelog_topic == "app-oc-subscription-changelog");
  CHECK(!c->views[0].is_fk_join());
  CHECK(column_family_names(c->views) == std::vector<std::string>{"customers", "oc", "oc#sides", "oc#fk"});
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[1].join->foreign_key == "customer.id");
  CHECK(again->views[1].join->right_partitioner == "consistent");
  CHECK(again->views[1].join->subscription_topic == "app-oc-subscription");

  for (const auto& [view, expected] : std::vector<std::pair<std::string, std::string>>{
           {"{name: j, kind: join, topic: a, join: {right: b, type: outer, foreign_key: x}}",
            "views[0].join.type: a foreign-key join is inner or left"},
           {"{name: j, kind: join, topic: a, join: {right: b, foreign_key: x..y}}",
            "views[0].join.foreign_key: must be a dotted path"},
           {"{name: j, kind: join, topic: a, join: {right: b, foreign_key: ''}}",
            "views[0].join.foreign_key: must be a dotted path"},
       }) {
    CAPTURE(view);
    auto bad = parse_config("application_id: a\nbootstrap_servers: b\nviews: [" + view + "]");
    REQUIRE(!bad.ok());
    CHECK_MESSAGE(bad.error().message().find(expected) != std::string::npos, bad.error().message());
  }
}

TEST_CASE("invalid join configs: one clear error naming the key") {
  struct row {
    const char* view;
    const char* expected;
  };
  const row rows[] = {
      {"{name: j, kind: join, topic: a}", "views[0].join: is required"},
      {"{name: j, kind: join, topic: a, join: {type: inner}}", "views[0].join.right: is required"},
      {"{name: j, kind: join, topic: a, join: {right: b, type: cross}}", "views[0].join.type: must be one of"},
      {"{name: j, kind: join, topic: a, join: {right: b, left_name: x, right_name: x}}",
       "views[0].join.right_name: must differ"},
      {"{name: j, kind: join, topic: a, join: {right: b, select: [{side: middle, field: x}]}}",
       "views[0].join.select[0].side: must be left or right"},
      {"{name: j, kind: join, topic: a, join: {right: b, select: [{side: left, field: a..b}]}}",
       "views[0].join.select[0].field: must be a dotted path"},
      {"{name: j, kind: join, topic: a, join: {right: b, select: [{side: left, field: x}, {side: right, field: y.x}]}}",
       "views[0].join.select[1].as: duplicate name 'x'"},
      {"{name: j, kind: join, topic: a, join: {right: b, left_name: l, select: [{side: left, field: x}]}}",
       "views[0].join.select: replaces left_name"},
      {"{name: j, kind: join, topic: a, group_by: words, join: {right: b}}", "views[0].group_by: does not apply"},
      {"{name: j, kind: join, topic: a, value_format: string, join: {right: b}}",
       "views[0].value_format: a join's inputs"},
      {"{name: j, topic: a, join: {right: b}}", "views[0].join: applies to join views only"},
      {"{name: j, kind: join, topic: a, join: {right: b, right_partitioner: fnv1a}}",
       "views[0].join.right_partitioner: the inputs are not co-partitioned: topic 'a' is partitioned by murmur2, "
       "topic 'b' by fnv1a"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.view);
    auto c = parse_config(std::string("application_id: a\nbootstrap_servers: b\nviews: [") + r.view + "]");
    REQUIRE(!c.ok());
    CHECK_MESSAGE(c.error().message().find(r.expected) != std::string::npos, c.error().message());
  }
  // A table reading an input with another partitioner than the join says.
  auto c = parse_config(
      "application_id: a\nbootstrap_servers: b\nviews:\n  - {name: t, topic: b, partitioner: fnv1a}\n"
      "  - {name: j, kind: join, topic: a, join: {right: b}}\n");
  REQUIRE(!c.ok());
  CHECK_MESSAGE(c.error().message().find("views[1].partitioner: view 't' reads topic 'b' as partitioned by fnv1a") !=
                    std::string::npos,
                c.error().message());
}

TEST_CASE("versioned: a history per table view, max_future 24h by default, rendered and read back, never with a ttl") {
  auto c = parse_config(R"(
application_id: app
bootstrap_servers: b
views:
  - {name: a, topic: t, versioned: {history: 7d}}
  - {name: b, topic: t, versioned: {history: 1500, max_future: 1m}}
  - {name: c, topic: t}
)");
  REQUIRE_MESSAGE(c.ok(), c.error().message());
  REQUIRE(c->views[0].versioned);
  CHECK(c->views[0].versioned->history_ms == 7 * 86'400'000LL);
  CHECK(c->views[0].versioned->max_future_ms == 86'400'000);
  CHECK(c->views[1].versioned->history_ms == 1500);
  CHECK(c->views[1].versioned->max_future_ms == 60'000);
  CHECK(!c->views[2].versioned);
  auto again = parse_config(render_config(*c));
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->views[0].versioned->history_ms == 7 * 86'400'000LL);
  CHECK(again->views[1].versioned->max_future_ms == 60'000);
  CHECK(!again->views[2].versioned);

  struct row {
    const char* view;
    const char* expected;
  };
  const row rows[] = {
      {"{name: v, topic: t, versioned: 7d}", "views[0].versioned: must be a map: {history: 7d, max_future: 24h}"},
      {"{name: v, topic: t, versioned: {}}", "views[0].versioned.history: is required"},
      {"{name: v, topic: t, versioned: {history: later}}", "views[0].versioned.history: 'later' is not a duration"},
      {"{name: v, topic: t, versioned: {history: 0ms}}", "views[0].versioned.history: must be positive"},
      {"{name: v, topic: t, versioned: {history: 1h, keep: 3}}", "views[0].versioned.keep: unknown key"},
      {"{name: v, topic: t, kind: count, versioned: {history: 1h}}", "views[0].versioned: applies to table views only"},
      {"{name: v, topic: t, ttl: {after: 1h}, versioned: {history: 1h}}",
       "views[0].versioned: cannot be combined with ttl"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.view);
    auto bad = parse_config(std::string("application_id: a\nbootstrap_servers: b\nviews: [") + r.view + "]", "t.yaml");
    REQUIRE_FALSE(bad.ok());
    CHECK_MESSAGE(bad.error().message().find(r.expected) != std::string::npos, bad.error().message());
  }
}
