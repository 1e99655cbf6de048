#include "kafka_common.h"

#include "core/log.h"

namespace kstate::ingest {

std::shared_ptr<spdlog::logger> log() {
  static const auto l = module_logger("ingest");
  return l;
}

spdlog::level::level_enum rdkafka_level(int level) noexcept {
  return level <= 3 ? spdlog::level::err : level == 4 ? spdlog::level::warn
       : level <= 6 ? spdlog::level::info : spdlog::level::debug;
}

status set_prop(rd_kafka_conf_t* conf, const std::string& k, const std::string& v) {
  char err[512];
  if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
    return invalid_argument("kafka property '" + k + "': " + err);
  return status::ok_status();
}

}  // namespace kstate::ingest
