#include "core/ownership.h"

#include <algorithm>

namespace kstate {

void ownership_registry::set_partition_count(const std::string& topic, int32_t count) {
  std::lock_guard lock(mu_);
  topics_[topic].partition_count = count;
}

void ownership_registry::assign(const std::vector<assignment>& added) {
  std::lock_guard lock(mu_);
  for (const auto& a : added) {
    auto& p = topics_[a.topic].partitions[a.partition];
    p.assigned = true;
    p.catch_up_target = a.catch_up_target;
    p.ready = a.ready;
    p.high_watermark = a.catch_up_target;
    p.applied = a.applied;
    p.restored = 0;
    p.restore_total = -1;
    p.assigned_from = a.applied;
    p.assigned_at = std::chrono::steady_clock::now();
  }
  joined_ = true;
  ++generation_;
}

void ownership_registry::revoke(const std::string& topic, int32_t partition) {
  std::lock_guard lock(mu_);
  auto& p = topics_[topic].partitions[partition];
  p.assigned = false;
  p.ready = false;
  ++generation_;
}

void ownership_registry::mark_ready(const std::string& topic, int32_t partition) {
  std::lock_guard lock(mu_);
  auto& p = topics_[topic].partitions[partition];
  if (p.assigned) p.ready = true;
}

void ownership_registry::update_progress(const std::string& topic, int32_t partition, int64_t applied,
                                         int64_t high_watermark) {
  std::lock_guard lock(mu_);
  auto& p = topics_[topic].partitions[partition];
  if (!p.assigned) return;
  p.applied = applied;
  if (high_watermark >= 0) p.high_watermark = high_watermark;
}

void ownership_registry::update_restore(const std::string& topic, int32_t partition, int64_t restored, int64_t total) {
  std::lock_guard lock(mu_);
  auto& p = topics_[topic].partitions[partition];
  if (!p.assigned) return;
  p.restored = restored;
  p.restore_total = total;
}

void ownership_registry::mark_joined() {
  std::lock_guard lock(mu_);
  joined_ = true;
}

void ownership_registry::revoke_all() {
  std::lock_guard lock(mu_);
  for (auto& [name, t] : topics_)
    for (auto& [id, p] : t.partitions) p = partition_state{};
  joined_ = false;
  ++generation_;
}

std::optional<topic_state> ownership_registry::topic(const std::string& topic) const {
  std::lock_guard lock(mu_);
  auto it = topics_.find(topic);
  if (it == topics_.end()) return std::nullopt;
  return it->second;
}

std::optional<partition_state> ownership_registry::partition(const std::string& topic, int32_t partition) const {
  std::lock_guard lock(mu_);
  auto it = topics_.find(topic);
  if (it == topics_.end()) return std::nullopt;
  auto p = it->second.partitions.find(partition);
  if (p == it->second.partitions.end()) return std::nullopt;
  return p->second;
}

int32_t ownership_registry::partition_count(const std::string& topic) const {
  std::lock_guard lock(mu_);
  auto it = topics_.find(topic);
  return it == topics_.end() ? 0 : it->second.partition_count;
}

bool ownership_registry::serves(const std::string& topic, int32_t partition) const {
  std::lock_guard lock(mu_);
  auto it = topics_.find(topic);
  if (it == topics_.end()) return false;
  auto p = it->second.partitions.find(partition);
  return p != it->second.partitions.end() && p->second.assigned && p->second.ready;
}

void ownership_registry::set_write_failure(std::string why) {
  std::lock_guard lock(mu_);
  write_failure_ = std::move(why);
}

std::string ownership_registry::write_failure() const {
  std::lock_guard lock(mu_);
  return write_failure_;
}

bool ownership_registry::all_ready() const {
  std::lock_guard lock(mu_);
  if (!joined_ || !write_failure_.empty()) return false;
  for (const auto& [name, t] : topics_)
    for (const auto& [id, p] : t.partitions)
      if (p.assigned && !p.ready) return false;
  return true;
}

uint64_t ownership_registry::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

std::optional<catch_up_progress> catch_up(const partition_state& p, std::chrono::steady_clock::time_point now) {
  if (!p.assigned || p.ready || p.catch_up_target < 0 || p.applied < 0) return std::nullopt;
  catch_up_progress c;
  c.position = p.applied;
  c.target = p.catch_up_target;
  c.left = std::max<int64_t>(0, p.catch_up_target - p.applied);
  const double seconds = std::chrono::duration<double>(now - p.assigned_at).count();
  const int64_t done = p.assigned_from >= 0 ? p.applied - p.assigned_from : 0;
  if (seconds > 0 && done > 0) {
    c.records_per_second = static_cast<double>(done) / seconds;
    c.eta_seconds = static_cast<double>(c.left) / c.records_per_second;
  }
  return c;
}

}  // namespace kstate
