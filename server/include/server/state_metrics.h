#pragma once
// Metrics read at scrape time: RocksDB properties per store (the names Kafka Streams
// reports, KIP-471, as Prometheus names), lag per partition with kafka_exporter's labels
// (consumergroup, topic, partition), restore progress, and build information.

#include <memory>
#include <string>
#include <vector>

#include "core/ownership.h"
#include "core/view.h"
#include "storage/db.h"

namespace prometheus {
class Collectable;
}

namespace kstate::server {

// All references must outlive the collectable.
std::shared_ptr<prometheus::Collectable> make_state_metrics(const storage::db& db, const std::vector<view_def>& views,
                                                            const ownership_registry& ownership,
                                                            std::string consumer_group);

}  // namespace kstate::server
