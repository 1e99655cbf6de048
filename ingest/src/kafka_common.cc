#include "kafka_common.h"

#include <string>
#include <string_view>

#include "core/log.h"
#include "ingest/membership.h"

namespace kstate::ingest {
namespace {

// librdkafka's log lines, routed into the ingest logger with matching levels and the
// handle's name (client.id#kind-n), so the line says which client it is from. Called on
// librdkafka's threads: it only logs.
void rdkafka_log(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  const std::string_view facility(fac), text(buf);
  const char* name = rk ? rd_kafka_name(rk) : "";
  // Group commits are informational (positions live in RocksDB): a commit refused
  // during a rebalance is expected. Every client gets the one `kafka:` map, so a
  // producer ignoring a consumer property (or the reverse) is expected too.
  if (facility == "COMMITFAIL" ||
      (facility == "CONFWARN" && (text.find("is a consumer property") != std::string_view::npos ||
                                  text.find("is a producer property") != std::string_view::npos))) {
    log()->debug("librdkafka {} {}: {}", name, fac, buf);
    return;
  }
  log()->log(rdkafka_level(level), "librdkafka {} {}: {}", name, fac, buf);
}

status set_props(rd_kafka_conf_t* conf, const kafka_props& props) {
  for (const auto& [k, v] : props)
    if (auto s = set_prop(conf, k, v); !s.ok()) return s;
  return status::ok_status();
}

// Consumers of source topics: the prefetch queue and the fetch buffers are part of
// kstate's fixed memory overhead (docs/operations.md). librdkafka's defaults (64 MiB
// queue, 50 MiB fetches) would dwarf a small RocksDB budget. The queue must hold more
// than one fetch response: librdkafka stops fetching once a response takes it past
// the threshold (and the engine then wakes the fetcher when it drained the queue,
// engine.cc: wake_fetcher_if_behind), so 16 MiB for fetches of 8 MiB. A queued message
// costs librdkafka a few hundred bytes besides its payload, so the record count stays
// at librdkafka's 100,000.
kafka_props source_consumer_defaults() {
  return {{"isolation.level", "read_committed"},
          {"queued.max.messages.kbytes", "16384"},
          {"fetch.max.bytes", "8388608"},
          {"receive.message.max.bytes", "9437184"}};
}

// Consumers that never join their group (assign() only) and read a topic to its end.
kafka_props reader_fixed(std::string group) {
  return {{"group.id", std::move(group)},
          {"isolation.level", "read_committed"},
          {"enable.auto.commit", "false"},
          {"enable.partition.eof", "true"},
          {"auto.offset.reset", "earliest"}};
}

}  // namespace

std::shared_ptr<spdlog::logger> log() {
  static const auto l = module_logger("ingest");
  return l;
}

spdlog::level::level_enum rdkafka_level(int level) noexcept {
  return level <= 3   ? spdlog::level::err
         : level == 4 ? spdlog::level::warn
         : level <= 6 ? spdlog::level::info
                      : spdlog::level::debug;
}

status set_prop(rd_kafka_conf_t* conf, const std::string& k, const std::string& v) {
  char err[512];
  if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
    return status::invalid_argument("kafka property '" + k + "': " + err);
  return status::ok_status();
}

client_spec engine_consumer_spec(const ingest_config& cfg) {
  client_spec s{RD_KAFKA_CONSUMER, "consumer", "", source_consumer_defaults(), {}};
  // How long the group waits for a member that stopped heartbeating (a dead process, or
  // a static member that is restarting) before its partitions move: librdkafka's 45 s
  // left them unserved that long after a crash.
  s.defaults.emplace_back("session.timeout.ms", "10000");
  // How soon a member hears that the group rebalances (an instance joined or left): each
  // round of a cooperative rebalance waits for it, so librdkafka's 3 s made a scale-out
  // hand partitions over after about 4 s; at 0.5 s it takes about 1 s. Two heartbeats a
  // second per instance are nothing to the coordinator.
  s.defaults.emplace_back("heartbeat.interval.ms", "500");
  const auto& member = cfg.member_name.empty() ? cfg.instance_id : cfg.member_name;
  if (cfg.static_membership && !member.empty())
    s.defaults.emplace_back("group.instance.id", cfg.application_id + "-" + member);
  s.fixed = {{"group.id", cfg.application_id},
             {"partition.assignment.strategy", "cooperative-sticky"},
             // Positions live in RocksDB with the state; group commits are informational.
             // The engine stores its applied positions and librdkafka's timer commits
             // them, which it does only while the group is steady. librdkafka 2.0.2 takes
             // a commit refused with ILLEGAL_GENERATION (one in flight while another
             // member's join bumps the generation) as a lost assignment: it revokes every
             // partition and rejoins, and with commits made during each round, members
             // kept taking partitions from one another without end.
             {"enable.auto.commit", "true"},
             {"auto.commit.interval.ms", std::to_string(cfg.commit_interval.count())},
             {"enable.auto.offset.store", "false"},
             {"auto.offset.reset", "earliest"},
             {"enable.partition.eof", "true"}};
  // The group description then names this member's endpoint (membership_watcher).
  if (!cfg.advertised_endpoint.empty())
    s.fixed.emplace_back("client.id", encode_member_client_id(cfg.client_id, cfg.advertised_endpoint));
  return s;
}

client_spec standby_consumer_spec(const ingest_config& cfg) {
  return {RD_KAFKA_CONSUMER,
          "standby consumer",
          "-standby",
          source_consumer_defaults(),
          {{"enable.auto.commit", "false"},
           {"enable.auto.offset.store", "false"},
           // librdkafka wants a group id even for a consumer that only assigns; this one
           // never joins it (no subscribe) and commits nothing to it.
           {"group.id", cfg.application_id + ".standby"},
           // Aggregate copies follow changelogs as a restore does: only committed
           // transactions, and the end of a changelog (its last stable offset) is where
           // every transaction before it is applied whole.
           {"isolation.level", "read_committed"},
           {"enable.partition.eof", "true"}}};
}

client_spec dead_letter_producer_spec() {
  // Idempotent: retries inside librdkafka never duplicate a dead letter.
  return {RD_KAFKA_PRODUCER, "dead-letter producer", "", {{"linger.ms", "5"}}, {{"enable.idempotence", "true"}}};
}

client_spec aggregate_producer_spec(const ingest_config& cfg) {
  client_spec s{RD_KAFKA_PRODUCER, "aggregate producer", "", {{"linger.ms", "5"}}, {{"enable.idempotence", "true"}}};
  if (cfg.exactly_once) {
    s.fixed.emplace_back("transactional.id", cfg.application_id + "-" + cfg.instance_id);
    s.fixed.emplace_back("transaction.timeout.ms", std::to_string(cfg.transaction_timeout.count()));
  }
  return s;
}

client_spec restore_consumer_spec(const ingest_config& cfg) {
  // A restore reads one changelog partition after another. A fetch of the previous one
  // waiting at its end (fetch.wait.max.ms, 500 ms) would hold up the next one's first
  // fetch that long; restores are short-lived, so the broker answers at once instead.
  return {RD_KAFKA_CONSUMER,
          "restore consumer",
          "-restore",
          {{"fetch.wait.max.ms", "10"}},
          reader_fixed(cfg.application_id + "-restore")};
}

client_spec membership_client_spec() {
  // A producer-type handle never joins a group and sends nothing unless asked. Not a
  // group member: a plain client id, without the endpoint.
  return {RD_KAFKA_PRODUCER, "membership admin client", "", {}, {}};
}

client_spec group_secret_spec(const ingest_config& cfg, rd_kafka_type_t kind) {
  if (kind == RD_KAFKA_PRODUCER)
    return {kind, "group secret producer", "-secret", {}, {{"enable.idempotence", "true"}}};
  return {kind, "group secret consumer", "-secret", {}, reader_fixed(cfg.application_id + ".secret")};
}

result<conf_ptr> make_conf(const ingest_config& cfg, const client_spec& spec) {
  conf_ptr conf(rd_kafka_conf_new());
  auto s = set_props(conf.get(), spec.defaults);
  if (s.ok()) {
    for (const auto& [k, v] : cfg.kafka)
      if (s = set_prop(conf.get(), k, v); !s.ok()) break;
  }
  if (s.ok())
    s = set_props(conf.get(),
                  {{"bootstrap.servers", cfg.bootstrap_servers}, {"client.id", cfg.client_id + spec.client_id_suffix}});
  if (s.ok()) s = set_props(conf.get(), spec.fixed);
  if (!s.ok()) return s.prefixed(spec.name);
  rd_kafka_conf_set_log_cb(conf.get(), rdkafka_log);
  return conf;
}

result<client_ptr> create_client(const ingest_config& cfg, const client_spec& spec,
                                 const std::function<void(rd_kafka_conf_t*)>& set_callbacks) {
  auto conf = make_conf(cfg, spec);
  if (!conf.ok()) return conf.error();
  if (set_callbacks) set_callbacks(conf.value().get());
  char err[512];
  // rd_kafka_new owns the configuration only when it succeeds.
  client_ptr rk(rd_kafka_new(spec.kind, conf.value().get(), err, sizeof err));
  if (!rk) return status::invalid_argument("creating " + spec.name + ": " + err);
  (void)conf.value().release();
  if (spec.kind == RD_KAFKA_CONSUMER)
    if (auto e = rd_kafka_poll_set_consumer(rk.get()))
      return status::invalid_argument("creating " + spec.name + ": " + rd_kafka_err2str(e));
  return rk;
}

}  // namespace kstate::ingest
