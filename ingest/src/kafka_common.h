#pragma once
// What the ingest module's librdkafka clients share (internal to ingest): the module's
// logger, owning handles for librdkafka objects, and checked property setting.

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "core/status.h"

namespace kstate::ingest {

// The "ingest" logger, created on first use; safe from any thread.
std::shared_ptr<spdlog::logger> log();
// The spdlog level of a librdkafka (syslog-style) log level.
spdlog::level::level_enum rdkafka_level(int level) noexcept;
// Sets a librdkafka property; the error names the property and librdkafka's reason.
status set_prop(rd_kafka_conf_t* conf, const std::string& k, const std::string& v);

struct conf_deleter { void operator()(rd_kafka_conf_t* c) const { rd_kafka_conf_destroy(c); } };
using conf_ptr = std::unique_ptr<rd_kafka_conf_t, conf_deleter>;
struct tpl_deleter { void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); } };
using tpl_ptr = std::unique_ptr<rd_kafka_topic_partition_list_t, tpl_deleter>;
struct error_deleter { void operator()(rd_kafka_error_t* e) const { rd_kafka_error_destroy(e); } };
using error_ptr = std::unique_ptr<rd_kafka_error_t, error_deleter>;
struct event_deleter { void operator()(rd_kafka_event_t* e) const { rd_kafka_event_destroy(e); } };
using event_ptr = std::unique_ptr<rd_kafka_event_t, event_deleter>;
struct options_deleter { void operator()(rd_kafka_AdminOptions_t* o) const { rd_kafka_AdminOptions_destroy(o); } };
using options_ptr = std::unique_ptr<rd_kafka_AdminOptions_t, options_deleter>;

}  // namespace kstate::ingest
