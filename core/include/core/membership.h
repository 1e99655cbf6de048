#pragma once
// membership_registry: who is in the consumer group, at which HTTP endpoint, owning
// which partitions, as Kafka's group coordinator describes it. Published by ingest
// (membership_watcher), read by query/server to route requests to owners.
//
// Thread safety: publish() and current() may be called from any thread; a snapshot is
// immutable once published.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kstate {

struct member_info {
  std::string member_id;  // the coordinator's member id
  std::string client_id;  // as the member reported it
  std::string endpoint;   // advertised HTTP endpoint, e.g. "http://10.0.0.5:8080"; empty if unknown
  std::string host;       // client host as the coordinator saw it
  std::vector<std::pair<std::string, int32_t>> partitions;  // assigned (topic, partition)
};

struct cluster_snapshot {
  // Increments every time the published membership changes.
  uint64_t version = 0;
  // When the coordinator was asked.
  std::chrono::system_clock::time_point read_at{};
  // The group's state as the coordinator reported it (Stable, PreparingRebalance, ...).
  std::string group_state;
  std::vector<member_info> members;

  // The endpoint of the member that owns (topic, partition), if exactly one does.
  std::optional<std::string> owner(const std::string& topic, int32_t partition) const;
};

class membership_registry {
 public:
  void publish(cluster_snapshot s);
  std::shared_ptr<const cluster_snapshot> current() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const cluster_snapshot> current_ = std::make_shared<cluster_snapshot>();
};

}  // namespace kstate
