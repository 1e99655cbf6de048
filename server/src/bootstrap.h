#pragma once
// Bootstrapping partitions this instance takes over without their state (a new instance
// joining the group, a replaced host, an empty state directory) from a copy held by
// another instance of the group: the previous owner, or any instance that kept it (a
// standby, a former owner). The copy is installed with the positions it reflects
// (storage::partition_loader), and ingest goes on from there; what happened since is read
// from Kafka as usual. On any failure nothing is installed and the partition is rebuilt
// from Kafka, as without this.
//
// Runs on the ingest thread, in the rebalance callback (ingest_config::before_assign),
// before the stored positions of the new partitions are read: nothing writes them yet.
//
// Thread safety: run() is called by one thread at a time.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/membership.h"
#include "core/view.h"
#include "server/api.h"
#include "server/config.h"
#include "storage/db.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
}  // namespace prometheus

namespace kstate::http {
class client;
}

namespace kstate::server {

class bootstrapper {
 public:
  bootstrapper(bootstrap_config cfg, std::vector<view_def> views, storage::db& db,
               const membership_registry& membership, http::client& peers, std::shared_ptr<const peer_secret> secret,
               std::string self, const std::atomic<bool>& stopping, prometheus::Registry* metrics);

  // Copies what is worth copying of the newly assigned (topic, partition)s.
  void run(const std::vector<std::pair<std::string, int32_t>>& parts);

  // Partitions installed from a copy so far, and copies that failed (then rebuilt from Kafka).
  uint64_t installed() const { return installed_; }
  uint64_t failed() const { return failed_; }

 private:
  struct source;
  enum class outcome { installed, skipped, failed };
  outcome copy(const view_def& v, int32_t partition, std::chrono::steady_clock::time_point deadline);

  bootstrap_config cfg_;
  std::vector<view_def> views_;
  storage::db& db_;
  const membership_registry& membership_;
  http::client& peers_;
  std::shared_ptr<const peer_secret> secret_;
  std::string self_;
  const std::atomic<bool>& stopping_;
  prometheus::Family<prometheus::Counter>* m_copies_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_entries_ = nullptr;
  std::atomic<uint64_t> installed_{0}, failed_{0};
};

}  // namespace kstate::server
