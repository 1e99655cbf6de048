#include "core/membership.h"

namespace kstate {

std::optional<std::string> cluster_snapshot::owner(const std::string& topic, int32_t partition) const {
  std::optional<std::string> found;
  for (const auto& m : members) {
    for (const auto& [t, p] : m.partitions) {
      if (t != topic || p != partition) continue;
      if (found) return std::nullopt;  // two claimants: mid-rebalance, trust neither
      found = m.endpoint;
    }
  }
  if (found && found->empty()) return std::nullopt;
  return found;
}

void membership_registry::publish(cluster_snapshot s) {
  auto next = std::make_shared<const cluster_snapshot>(std::move(s));
  std::lock_guard lock(mu_);
  current_ = std::move(next);
}

std::shared_ptr<const cluster_snapshot> membership_registry::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

}  // namespace kstate
