// The property sets of ingest's librdkafka clients, read back from the configuration
// the builder makes: kstate's defaults give way to the user's `kafka:` properties, and
// the fixed properties (what kstate's guarantees rest on) do not.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "ingest/membership.h"
#include "kafka_common.h"

namespace ki = kstate::ingest;

namespace {

ki::ingest_config base_config() {
  ki::ingest_config cfg;
  cfg.bootstrap_servers = "127.0.0.1:1";
  cfg.application_id = "app";
  cfg.client_id = "kst";
  cfg.instance_id = "i7";
  cfg.transaction_timeout = std::chrono::milliseconds(30000);
  // One default and one fixed property of some client each, and one nobody sets.
  cfg.kafka = {{"fetch.max.bytes", "1000000"}, {"linger.ms", "7"},
               {"group.id", "user-group"},     {"client.id", "user-client"},
               {"enable.auto.commit", "true"}, {"enable.idempotence", "false"},
               {"socket.timeout.ms", "12345"}};
  return cfg;
}

// librdkafka reads auto.offset.reset=earliest back under its older name.
constexpr const char* earliest = "smallest";

std::string get(rd_kafka_conf_t* conf, const char* name) {
  char buf[512];
  size_t size = sizeof buf;
  REQUIRE(rd_kafka_conf_get(conf, name, buf, &size) == RD_KAFKA_CONF_OK);
  return buf;
}

// Reads `expected`'s properties back from the configuration of `spec`.
void check_props(const ki::ingest_config& cfg, const ki::client_spec& spec,
                 const std::map<std::string, std::string>& expected) {
  auto conf = ki::make_conf(cfg, spec);
  REQUIRE(conf.ok());
  for (const auto& [k, v] : expected) {
    INFO(spec.name << ": " << k);
    CHECK(get(conf.value().get(), k.c_str()) == v);
  }
}

}  // namespace

TEST_CASE("the engine's consumer: memory defaults the user may change, group properties fixed") {
  auto cfg = base_config();
  cfg.commit_interval = std::chrono::milliseconds(250);
  check_props(cfg, ki::engine_consumer_spec(cfg),
              {{"isolation.level", "read_committed"},
               {"queued.max.messages.kbytes", "16384"},
               {"fetch.max.bytes", "1000000"},
               {"receive.message.max.bytes", "9437184"},
               {"session.timeout.ms", "10000"},
               {"heartbeat.interval.ms", "500"},
               {"socket.timeout.ms", "12345"},
               {"bootstrap.servers", "127.0.0.1:1"},
               {"client.id", "kst"},
               {"group.id", "app"},
               {"partition.assignment.strategy", "cooperative-sticky"},
               // Stored positions, committed by librdkafka's timer: only while the group
               // is steady (kafka_common.cc).
               {"enable.auto.commit", "true"},
               {"auto.commit.interval.ms", "250"},
               {"enable.auto.offset.store", "false"},
               {"auto.offset.reset", earliest},
               {"enable.partition.eof", "true"}});
  cfg.advertised_endpoint = "10.0.0.1:8080";
  auto spec = ki::engine_consumer_spec(cfg);
  auto conf = ki::make_conf(cfg, spec);
  REQUIRE(conf.ok());
  // The endpoint travels in the member's client.id, as the watcher reads it back.
  CHECK(ki::endpoint_from_client_id(get(conf.value().get(), "client.id")) == "10.0.0.1:8080");
}

TEST_CASE("the standby consumer: the engine's memory defaults, a group it never joins, committed records only") {
  auto cfg = base_config();
  // Changelog copies need committed transactions whatever the source consumer reads.
  cfg.kafka["isolation.level"] = "read_uncommitted";
  check_props(cfg, ki::standby_consumer_spec(cfg),
              {{"isolation.level", "read_committed"},
               {"enable.partition.eof", "true"},
               {"queued.max.messages.kbytes", "16384"},
               {"fetch.max.bytes", "1000000"},
               {"receive.message.max.bytes", "9437184"},
               {"socket.timeout.ms", "12345"},
               {"client.id", "kst-standby"},
               {"group.id", "app.standby"},
               {"enable.auto.commit", "false"},
               {"enable.auto.offset.store", "false"}});
}

TEST_CASE("the producers: linger the user may change, idempotence fixed") {
  auto cfg = base_config();
  for (const auto& spec : {ki::dead_letter_producer_spec(), ki::aggregate_producer_spec(cfg)})
    check_props(
        cfg, spec,
        {{"linger.ms", "7"}, {"enable.idempotence", "true"}, {"client.id", "kst"}, {"socket.timeout.ms", "12345"}});
  cfg.kafka.erase("linger.ms");
  check_props(cfg, ki::dead_letter_producer_spec(), {{"linger.ms", "5"}});
  cfg.exactly_once = true;
  check_props(cfg, ki::aggregate_producer_spec(cfg),
              {{"linger.ms", "5"}, {"transactional.id", "app-i7"}, {"transaction.timeout.ms", "30000"}});
}

TEST_CASE("the readers that only assign: restore and group secret consumers") {
  auto cfg = base_config();
  const std::map<std::string, std::string> reader = {
      {"isolation.level", "read_committed"}, {"enable.auto.commit", "false"}, {"enable.partition.eof", "true"},
      {"auto.offset.reset", earliest},       {"fetch.max.bytes", "1000000"},  {"socket.timeout.ms", "12345"}};
  auto restore = reader;
  restore.insert({{"client.id", "kst-restore"}, {"group.id", "app-restore"}, {"fetch.wait.max.ms", "10"}});
  check_props(cfg, ki::restore_consumer_spec(cfg), restore);
  auto secret = reader;
  secret.insert({{"client.id", "kst-secret"}, {"group.id", "app.secret"}});
  check_props(cfg, ki::group_secret_spec(cfg, RD_KAFKA_CONSUMER), secret);
  check_props(cfg, ki::group_secret_spec(cfg, RD_KAFKA_PRODUCER),
              {{"client.id", "kst-secret"}, {"enable.idempotence", "true"}, {"linger.ms", "7"}});
}

TEST_CASE("the membership client: the user's properties, a plain client id") {
  auto cfg = base_config();
  cfg.advertised_endpoint = "10.0.0.1:8080";
  check_props(cfg, ki::membership_client_spec(),
              {{"client.id", "kst"}, {"group.id", "user-group"}, {"socket.timeout.ms", "12345"}});
}

TEST_CASE("a client that cannot be configured or created is named in the error") {
  auto cfg = base_config();
  cfg.kafka = {{"no.such.property", "1"}};
  auto conf = ki::make_conf(cfg, ki::standby_consumer_spec(cfg));
  REQUIRE_FALSE(conf.ok());
  CHECK(conf.error().message().find("standby consumer") != std::string::npos);
  CHECK(conf.error().message().find("no.such.property") != std::string::npos);
  // Accepted property by property, refused together by rd_kafka_new: an idempotent
  // producer needs acks=all.
  cfg.kafka = {{"acks", "1"}};
  auto rk = ki::create_client(cfg, ki::dead_letter_producer_spec());
  REQUIRE_FALSE(rk.ok());
  CHECK(rk.error().message().find("creating dead-letter producer") != std::string::npos);
}
