// check_kafka_properties() and librdkafka_version(): what the configuration loader
// asks of librdkafka. Apart from the engine so that the loader (and its fuzz target)
// links librdkafka alone, not the whole ingest module.
#include <librdkafka/rdkafka.h>

#include <map>
#include <memory>
#include <string>

#include "ingest/engine.h"

namespace kstate::ingest {

status check_kafka_properties(const std::map<std::string, std::string>& props) {
  std::unique_ptr<rd_kafka_conf_t, decltype(&rd_kafka_conf_destroy)> conf(rd_kafka_conf_new(), &rd_kafka_conf_destroy);
  for (const auto& [k, v] : props) {
    char err[512];
    if (rd_kafka_conf_set(conf.get(), k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
      return status::invalid_argument("kafka." + k + ": " + err);
  }
  return status::ok_status();
}

std::string librdkafka_version() { return rd_kafka_version_str(); }

}  // namespace kstate::ingest
