#pragma once
// What the ingest module's librdkafka clients share (internal to ingest): the module's
// logger, owning handles for librdkafka objects, checked property setting, and the one
// builder every client is created with (create_client), with the property set of each
// client kstate creates (the *_spec functions) listed in one place.

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ingest/engine.h"

namespace kstate::ingest {

// The "ingest" logger, created on first use; safe from any thread.
std::shared_ptr<spdlog::logger> log();
// The spdlog level of a librdkafka (syslog-style) log level.
spdlog::level::level_enum rdkafka_level(int level) noexcept;
// Sets a librdkafka property; the error names the property and librdkafka's reason.
status set_prop(rd_kafka_conf_t* conf, const std::string& k, const std::string& v);

struct conf_deleter {
  void operator()(rd_kafka_conf_t* c) const { rd_kafka_conf_destroy(c); }
};
using conf_ptr = std::unique_ptr<rd_kafka_conf_t, conf_deleter>;
struct client_deleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using client_ptr = std::unique_ptr<rd_kafka_t, client_deleter>;
struct tpl_deleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); }
};
using tpl_ptr = std::unique_ptr<rd_kafka_topic_partition_list_t, tpl_deleter>;
struct error_deleter {
  void operator()(rd_kafka_error_t* e) const { rd_kafka_error_destroy(e); }
};
using error_ptr = std::unique_ptr<rd_kafka_error_t, error_deleter>;
struct event_deleter {
  void operator()(rd_kafka_event_t* e) const { rd_kafka_event_destroy(e); }
};
using event_ptr = std::unique_ptr<rd_kafka_event_t, event_deleter>;
struct options_deleter {
  void operator()(rd_kafka_AdminOptions_t* o) const { rd_kafka_AdminOptions_destroy(o); }
};
using options_ptr = std::unique_ptr<rd_kafka_AdminOptions_t, options_deleter>;

using kafka_props = std::vector<std::pair<std::string, std::string>>;

// One librdkafka client kstate creates. Its properties are set in this order, so a
// later one wins: `defaults`, the user's `kafka:` properties (which may change them),
// `bootstrap.servers` and `client.id` (ingest_config::client_id + client_id_suffix),
// then `fixed`, the properties kstate's guarantees rest on.
struct client_spec {
  rd_kafka_type_t kind = RD_KAFKA_CONSUMER;
  std::string name;  // names the client in errors and logs ("standby consumer")
  std::string client_id_suffix;
  kafka_props defaults;
  kafka_props fixed;
};

// The property sets of kstate's clients.
client_spec engine_consumer_spec(const ingest_config& cfg);   // the group member (engine)
client_spec standby_consumer_spec(const ingest_config& cfg);  // standby copies, assign only
client_spec dead_letter_producer_spec();
client_spec aggregate_producer_spec(const ingest_config& cfg);  // transactional with exactly_once
client_spec restore_consumer_spec(const ingest_config& cfg);    // changelog restores, assign only
client_spec membership_client_spec();                           // admin requests only
client_spec group_secret_spec(const ingest_config& cfg, rd_kafka_type_t kind);

// The configuration of `spec`'s client: its properties, in the order above, and the log
// callback that routes librdkafka's log lines into the "ingest" logger. The error names
// the client and the first property librdkafka refused.
result<conf_ptr> make_conf(const ingest_config& cfg, const client_spec& spec);

// Creates `spec`'s client from make_conf(); `set_callbacks` (may be empty) adds the
// client's own callbacks and opaque to the configuration first. A consumer's main
// queue is redirected to its consumer queue (rd_kafka_poll_set_consumer). When
// rd_kafka_new fails the configuration is freed and the error names the client.
result<client_ptr> create_client(const ingest_config& cfg, const client_spec& spec,
                                 const std::function<void(rd_kafka_conf_t*)>& set_callbacks = {});

}  // namespace kstate::ingest
